"""weightcache: map LLM weights that a node daemon keeps resident, as zero-copy torch tensors.

    import weightcache

    w = weightcache.acquire("llama-8b", device="cuda:0")  # Mapping[str, torch.Tensor]
    weightcache.bind(model, w)                             # model built on the meta device

Modes (``mode=`` or ``$WEIGHTCACHE_MODE``): ``client`` (default: use the running daemon at
``$WEIGHTCACHE_SOCKET``), ``spawn`` (start a per-user daemon when none answers), ``off``
(never touch the daemon; call ``fallback``). Errors are :class:`WeightcacheError` subclasses:
:class:`CacheMiss`, :class:`FingerprintMismatch` (``.diff``), :class:`UnsupportedQuantization`,
:class:`StaleWeights`, :class:`CorruptWeights`, :class:`DaemonUnavailable` (and its
:class:`DaemonGone`, which ``Weights.check`` no longer raises: see ``Weights.state``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Optional

from ._artifacts import (
    CompileCacheResult,
    artifact_key,
    compile_cache,
    get_artifact,
    put_artifact,
    restore_dir,
    save_dir,
)
from ._bind import BindResult, bind
from ._errors import (
    BindError,
    CacheMiss,
    CorruptWeights,
    DaemonGone,
    DaemonUnavailable,
    FieldDiff,
    FingerprintMismatch,
    StaleWeights,
    UnsupportedQuantization,
    WeightcacheError,
)
from ._publish import acquire_or_publish, publish
from ._verify import VerifyReport, verify
from ._weights import Weights, acquire

__version__ = "0.1.0"

__all__ = [
    "BindError",
    "BindResult",
    "CacheMiss",
    "CompileCacheResult",
    "CorruptWeights",
    "DaemonGone",
    "DaemonUnavailable",
    "FieldDiff",
    "FingerprintMismatch",
    "StaleWeights",
    "UnsupportedQuantization",
    "VerifyReport",
    "Weights",
    "WeightcacheError",
    "acquire",
    "acquire_or_publish",
    "artifact_key",
    "bind",
    "compile_cache",
    "evict",
    "get_artifact",
    "library_version",
    "load",
    "publish",
    "put_artifact",
    "restore_dir",
    "save_dir",
    "status",
    "verify",
]


def library_version() -> str:
    """The version of the loaded libweightcache.so."""
    from . import _lib

    return _lib.lib().wc_version().decode()


def status(*, socket: Optional[str] = None) -> Dict[str, Any]:
    """The daemon's status (the StatusResponse of the control API as a dict: ``entries`` with
    their ``state``, ``bytes`` and ``leases``, ``known_models``, hit/miss counters...)."""
    from . import _lib

    with _lib.Client(socket) as c:
        return _ints(json.loads(c.status_json()))


# The StatusResponse's 64-bit counters and sizes, which the proto3 JSON mapping writes as
# strings: "bytes", "*_bytes", "bytes_done", "bytes_total", "acquire_*".
def _is_uint64(key: str) -> bool:
    return (key in ("bytes", "bytes_done", "bytes_total") or key.endswith("_bytes")
            or key.startswith("acquire_"))


def _ints(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: int(v) if isinstance(v, str) and _is_uint64(k) and v.isdigit() else _ints(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def load(model: str = "", *, spec_yaml: str = "", socket: Optional[str] = None,
         on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> None:
    """Asks the daemon to load a model it knows (``model``) or an inline spec (``spec_yaml``,
    YAML or JSON) and blocks until it is ready; ``on_progress`` receives dicts with
    ``state``, ``bytes_done``, ``bytes_total``, ``current_file``, ``elapsed_seconds``."""
    from . import _lib

    if not model and not spec_yaml:
        raise WeightcacheError("load: give a model name or spec_yaml")

    def cb(p: Any) -> None:
        if on_progress is not None:
            on_progress({
                "fingerprint": (p.fingerprint or b"").decode(),
                "state": (p.state or b"").decode(),
                "bytes_done": int(p.bytes_done),
                "bytes_total": int(p.bytes_total),
                "current_file": (p.current_file or b"").decode(),
                "error": (p.error or b"").decode(),
                "elapsed_seconds": float(p.elapsed_seconds),
            })

    with _lib.Client(socket) as c:
        c.load(model, spec_yaml, cb)


def evict(model: str = "", *, fingerprint: str = "", socket: Optional[str] = None) -> int:
    """Drops the daemon's reference to a model's entries (or one fingerprint's); returns how
    many. Memory that engines map stays valid."""
    from . import _lib

    if not model and not fingerprint:
        raise WeightcacheError("evict: give a model name or fingerprint")
    with _lib.Client(socket) as c:
        return c.evict(model, fingerprint)
