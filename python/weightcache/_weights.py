"""acquire() and Weights: a read-only mapping of zero-copy torch tensors over a lease."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, TypeVar, Union

from . import _lib, _torch
from ._errors import (
    CacheMiss,
    CorruptWeights,
    DaemonUnavailable,
    FingerprintMismatch,
    StaleWeights,
    UnsupportedQuantization,
    WeightcacheError,
)

log = logging.getLogger("weightcache")

_STATES = ("clean", "corrupt", "unknown")  # wc_lease_state's values, in order

MODE_ENV = "WEIGHTCACHE_MODE"
MODEL_ENV = "WEIGHTCACHE_MODEL"
FINGERPRINT_ENV = "WEIGHTCACHE_FINGERPRINT"
SOCKET_ENV = "WEIGHTCACHE_SOCKET"
MODES = ("off", "client", "spawn")

# Errors after which a caller's own disk load is the right answer.
FALLBACK_ERRORS = (CacheMiss, FingerprintMismatch, StaleWeights, UnsupportedQuantization,
                   DaemonUnavailable)

T = TypeVar("T")


def resolve_mode(mode: Optional[str]) -> str:
    """``mode``, else ``$WEIGHTCACHE_MODE``, else "client"; an unknown value is an error."""
    m = mode if mode is not None else os.environ.get(MODE_ENV, "") or "client"
    if m not in MODES:
        src = "mode" if mode is not None else MODE_ENV
        raise WeightcacheError(f"{src}={m!r}: use one of {', '.join(MODES)}")
    return m


def spec_name(model_dir: Union[str, Path]) -> str:
    """A valid spec name ([a-z0-9][a-z0-9._-]{0,62}) derived from a directory's name."""
    base = Path(model_dir).resolve().name.lower()
    name = re.sub(r"[^a-z0-9._-]+", "-", base).lstrip("._-")[:63]
    if not name:
        raise WeightcacheError(f"cannot derive a model name from directory {model_dir}")
    return name


def resolve_model(model: Optional[str], model_dir: Optional[str]) -> tuple:
    """(spec name, model directory or None). ``model`` may be a spec name or a directory."""
    if model is None:
        model = os.environ.get(MODEL_ENV, "")
        if not model:
            if model_dir:
                return spec_name(model_dir), str(model_dir)
            raise WeightcacheError(
                f"no model: pass model= or set {MODEL_ENV} (in Kubernetes, from the pod "
                "annotation weightcache.io/model through the Downward API)"
            )
    if model_dir is None and os.sep in model and Path(model).is_dir():
        return spec_name(model), str(Path(model).resolve())
    return model, (str(model_dir) if model_dir else None)


class Weights(Mapping[str, Any]):
    """The tensors of one acquired model-rank: ``name -> torch.Tensor``, read-only.

    Every tensor is a zero-copy view of the daemon's memory (CPU tensors for the host backend,
    ``cuda:N`` tensors for cuda-vmm), imported through DLPack, made a
    ``torch.nn.Parameter`` with ``requires_grad=False`` (so :func:`bind` puts these very
    objects into a module: no second tensor per weight). The lease lives as long as this
    object or any tensor taken from it: ``close()`` (or leaving a ``with`` block) drops this
    object's hold, and the lease ends when the last tensor is freed too.

    The memory is READ-ONLY: writing through a tensor (``t.add_(1)``, ``t[0] = 0``) faults
    (SIGSEGV on the CPU, an illegal-address CUDA error on the GPU). Use them as weights.

    Example::

        with weightcache.acquire("llama-8b", device="cuda:0") as w:
            print(w.fingerprint, len(w), w["model.embed_tokens.weight"].shape)
    """

    def __init__(self, lease: "_lib.Lease", info: "_lib.LeaseInfo", tensors: Dict[str, Any],
                 device: Any, seconds: float, segments: Any = ()) -> None:
        self._lease: Optional[_lib.Lease] = lease
        self._tensors: Optional[Dict[str, Any]] = tensors
        self.lease_id: str = info.id.decode()
        self.model: str = info.model.decode()
        self.fingerprint: str = info.fingerprint.decode()
        self.backend: str = info.backend.decode()
        self.device_uuid: str = info.device_uuid.decode()
        self.model_dir: str = info.model_dir.decode()
        self.spec_yaml: str = info.spec_yaml.decode()
        self.tp_rank: int = info.tp_rank
        self.tp_size: int = info.tp_size
        self.pp_rank: int = info.pp_rank
        self.pp_size: int = info.pp_size
        self.total_bytes: int = int(info.total_bytes)
        self.device = device
        self.map_seconds: float = seconds
        # (address, bytes) of each mapped segment: every tensor lies inside one of them.
        self.segments: list = list(segments)

    @property
    def spec(self) -> Dict[str, Any]:
        """The model spec the daemon loaded these weights from (spec_yaml, parsed)."""
        return parse_spec_yaml(self.spec_yaml)

    def _table(self) -> Dict[str, Any]:
        if self._tensors is None:
            raise WeightcacheError(f"Weights of '{self.model}' are closed")
        return self._tensors

    def __getitem__(self, name: str) -> Any:
        try:
            return self._table()[name]
        except KeyError:
            raise KeyError(f"model '{self.model}' has no tensor '{name}'") from None

    def __contains__(self, name: object) -> bool:
        return name in self._table()

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    @property
    def closed(self) -> bool:
        return self._tensors is None

    def check(self, timeout: float = 0.0) -> None:
        """Raises :class:`CorruptWeights` once the daemon has reported that this lease's
        memory changed after it was sealed (integrity scrubbing; the message names the segment
        and bytes); returns None otherwise. Waits up to ``timeout`` seconds for news (0: only
        looks, one system call: cheap enough to call every step). On the exception, stop using
        these weights: acquire again (the daemon loads a clean copy) or restart.

        A daemon restart (a rollout) raises nothing: the weights stay mapped, the keeper keeps
        the memory, and once the daemon is back the lease re-attaches to it (``state()``
        says ``"unknown"`` meanwhile). Example::

            try:
                w.check()
            except weightcache.CorruptWeights:
                w = weightcache.acquire(w.model)   # the clean copy
        """
        state, message = self._watch(timeout, "check")
        if state == "corrupt":
            raise CorruptWeights(f"lease of model '{self.model}': the daemon found its memory "
                                 f"corrupt: {message}", "DATA_LOSS")

    def state(self, timeout: float = 0.0) -> str:
        """What is known of this lease's memory, never raising for it: ``"clean"`` (a daemon
        watches it and reported nothing), ``"corrupt"`` (the daemon reported it changed: stop
        using it) or ``"unknown"`` (no daemon watches it for this process: the daemon is gone
        and not back yet, or the one back serves another copy of these weights -- no keeper
        kept this one; acquire again to be watched). When the lease's daemon connection closes
        (the daemon ended or restarted), the lease re-attaches to the same memory once a daemon
        serving it is back (tried at most once a second, by the call that finds it due, within
        about 2 s): that daemon lists the lease in its status, keeps the memory from eviction
        and reports corruption again. Waits up to ``timeout`` seconds for news."""
        return self._watch(timeout, "state")[0]

    def _watch(self, timeout: float, what: str):
        if self._lease is None:
            raise WeightcacheError(f"Weights of '{self.model}' are closed")
        if timeout < 0:
            raise ValueError(f"{what}: timeout must be >= 0 seconds, not {timeout}")
        state, message = ctypes.c_int(), ctypes.c_void_p()
        _lib.check(_lib.lib().wc_lease_watch(self._lease.handle, int(timeout * 1000),
                                             ctypes.byref(state), ctypes.byref(message)),
                   message, "lease watch")
        return _STATES[state.value], _lib.take_string(message)

    @property
    def detached(self) -> bool:
        """True between :meth:`detach` and a successful :meth:`reattach`."""
        return bool(_lib.lib().wc_lease_detached(self._owned("detached").handle))

    def detach(self) -> None:
        """Sleeps: unmaps every tensor's memory and ends the lease in the daemon (which may then
        evict the entry and fill its memory with another model), keeping every tensor's
        address reserved (host: ``PROT_NONE``; cuda-vmm: the VA reservation), so nothing else
        can ever appear there. The tensors keep their ``data_ptr()``, but reading one while
        detached faults (SIGSEGV on the CPU, an illegal address on the GPU): synchronise and
        run nothing that reads them until :meth:`reattach`. No-op when detached. Example::

            w.detach()                 # sleep: the daemon may evict the weights
            ...
            w.reattach()               # wake: same fingerprint, same addresses
        """
        lease = self._owned("detach")
        err = ctypes.c_void_p()
        _lib.check(_lib.lib().wc_lease_detach(lease.handle, ctypes.byref(err)), err, "detach")

    def reattach(self, *, load_on_miss: bool = True, timeout: float = 600) -> None:
        """Wakes: maps the same fingerprint at the same addresses again, so every tensor (and
        every module :func:`bind` filled with them) is valid as before. The daemon takes it
        from its cache, or, when it was evicted, acquires it by model name as an acquire
        would (the keeper, a peer, or the disk when ``load_on_miss``). Raises
        :class:`FingerprintMismatch` naming both fingerprints when the daemon now serves
        another fingerprint for the model (the weights stay detached: acquire the new ones),
        :class:`CacheMiss` when it is gone and no load is allowed; after any error the weights
        stay detached and ``reattach`` may be called again. ``lease_id`` is the new lease's."""
        lease = self._owned("reattach")
        if timeout <= 0:
            raise WeightcacheError(f"reattach: timeout={timeout} must be positive (seconds)")
        err = ctypes.c_void_p()
        _lib.check(_lib.lib().wc_lease_reattach(lease.handle, 1 if load_on_miss else 0,
                                                int(timeout * 1000), ctypes.byref(err)),
                   err, "reattach")
        info = _lib.LeaseInfo()
        _lib.lib().wc_lease_info_get(lease.handle, ctypes.byref(info))
        self.lease_id = info.id.decode()

    def _owned(self, what: str) -> "_lib.Lease":
        lease = self._lease
        if lease is None:
            raise WeightcacheError(f"{what}: Weights of '{self.model}' are closed")
        if lease._pid != os.getpid():
            # A forked child maps the parent's memory but holds no lease of its own: detaching
            # here would end the parent's lease.
            raise WeightcacheError(f"{what}: these Weights belong to process {lease._pid}, not "
                                   f"this forked child ({os.getpid()}); acquire in the child")
        return lease

    def close(self) -> None:
        """Drops this object's hold on the lease. Tensors taken from it stay valid (they hold
        the lease themselves); the lease ends when the last of them is freed."""
        self._tensors = None
        self._lease = None

    def __enter__(self) -> "Weights":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} tensors"
        return (f"Weights(model={self.model!r}, tp={self.tp_rank}/{self.tp_size}, "
                f"backend={self.backend!r}, device={self.device}, {state}, "
                f"fingerprint={self.fingerprint[:12]!r})")


def parse_spec_yaml(text: str) -> Dict[str, Any]:
    """Parses the daemon's canonical spec YAML (flat ``key: value`` lines, double-quoted
    strings, integers, ``[a, b]`` or ``- a`` lists): no YAML library needed."""
    import json

    out: Dict[str, Any] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("- ") and key is not None:
            out.setdefault(key, [])
            out[key].append(_scalar(line.lstrip()[2:].strip(), json))
            continue
        k, _, v = line.partition(":")
        key, v = k.strip(), v.strip()
        if v == "":
            out[key] = []
        elif v.startswith("["):
            out[key] = [_scalar(x.strip(), json) for x in v.strip("[]").split(",") if x.strip()]
        else:
            out[key] = _scalar(v, json)
    return out


def _scalar(v: str, json: Any) -> Any:
    if v.startswith('"'):
        return json.loads(v)
    try:
        return int(v)
    except ValueError:
        return v


def _build(lease: "_lib.Lease", t0: float) -> Weights:
    """Reads the lease's table and makes the tensors: one DLPack import per segment, then one
    as_strided view per tensor."""
    import torch

    L = _lib.lib()
    h = lease.handle
    info = _lib.LeaseInfo()
    L.wc_lease_info_get(h, ctypes.byref(info))
    backend = info.backend.decode()
    if backend == "cuda-vmm":
        ordinal = _torch.cuda_ordinal(info.device_uuid.decode())
        device = torch.device("cuda", ordinal)
    else:
        ordinal = -1
        device = torch.device("cpu")
    segments = []
    for i in range(info.segment_count):
        base = ctypes.c_void_p()
        size = ctypes.c_uint64()
        err = ctypes.c_void_p()
        _lib.check(L.wc_lease_segment(h, i, ctypes.byref(base), ctypes.byref(size),
                                      ctypes.byref(err)), err, "segment")
        segments.append((base.value or 0, size.value))
    # The table as columns: a few C-speed list conversions instead of a struct per tensor.
    cols = _lib.Columns()
    L.wc_lease_columns(h, ctypes.byref(cols))
    n = int(cols.count)
    names = cols.names[:n]
    dtypes = cols.dtypes[:n]
    ndims = cols.ndim[:n]
    dims = cols.dims[:sum(ndims)]
    strides = cols.strides[:sum(ndims)]
    seg_of = cols.segment[:n]
    offsets = cols.offset[:n]
    seg_bytes = [_dlpack_segment(base, size, ordinal, lease) for base, size in segments]
    views: Dict[tuple, Any] = {}
    esizes: Dict[bytes, int] = {}
    tensors: Dict[str, Any] = {}
    as_strided = torch.as_strided
    param_cls = _param_class(torch)
    pos = 0
    for name, dt_name, nd, seg, off in zip(names, dtypes, ndims, seg_of, offsets):
        view = views.get((seg, dt_name))
        if view is None:
            view = _typed_view(seg_bytes[seg], dt_name.decode(), name.decode())
            views[(seg, dt_name)] = view
            esizes[dt_name] = _torch.element_size(dt_name.decode())
        esize = esizes[dt_name]
        if off % esize:
            raise WeightcacheError(f"tensor '{name.decode()}': offset {off} is not a multiple "
                                   "of its element size")
        end = pos + nd
        t = as_strided(view, dims[pos:end], strides[pos:end], off // esize)
        if param_cls is not None:
            # What nn.Parameter(t, requires_grad=False) gives, without its second tensor
            # (_make_subclass detaches into a new one): the view itself becomes the Parameter.
            t.__class__ = param_cls
        tensors[name.decode()] = t
        pos = end
    return Weights(lease, info, tensors, device, time.perf_counter() - t0, segments)


_PARAM_CLASS: Any = False  # not probed yet


def _param_class(torch: Any) -> Any:
    """torch.nn.Parameter when this torch lets a plain tensor view become one in place (checked
    once per process), else None (bind() then makes each Parameter the usual way)."""
    global _PARAM_CLASS
    if _PARAM_CLASS is False:
        try:
            probe = torch.zeros(2)[:1]
            probe.__class__ = torch.nn.Parameter
            ok = isinstance(probe, torch.nn.Parameter) and not probe.requires_grad
        except TypeError:
            ok = False
        _PARAM_CLASS = torch.nn.Parameter if ok else None
    return _PARAM_CLASS


def _dlpack_segment(base: int, size: int, ordinal: int, lease: "_lib.Lease") -> Any:
    from ._dlpack import byte_tensor

    return byte_tensor(base, size, ordinal, lease)


def _typed_view(seg: Any, dt_name: str, tensor: str) -> Any:
    dt = _torch.torch_dtype(dt_name, tensor)
    esize = _torch.element_size(dt_name)
    n = seg.numel() - seg.numel() % esize
    return seg[:n].view(dt)


def engine_identity(engine: Optional[str], engine_version: str,
                    framework_version: Optional[str], recipe: Optional[str]) -> Dict[str, str]:
    """The published-weights fields of an Acquire or a publish ({} for loaded weights)."""
    if not recipe and not engine:
        return {}
    if framework_version is None:
        import torch

        framework_version = f"torch {torch.__version__}"
    return {"engine": engine or "", "engine_version": engine_version,
            "framework_version": framework_version, "recipe": recipe or ""}


def _options(name: Optional[str], fingerprint: Optional[str], tp_rank: int, tp_size: int,
             pp_rank: int, pp_size: int, device: Any, dtype: Any,
             quantization: Optional[str], wait: bool, load_on_miss: bool,
             timeout: float, identity: Optional[Dict[str, str]] = None) -> "_lib.AcquireOptions":
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise WeightcacheError(f"tp_rank={tp_rank}, tp_size={tp_size}: need 0 <= tp_rank < tp_size")
    if pp_size < 1 or not 0 <= pp_rank < pp_size:
        raise WeightcacheError(f"pp_rank={pp_rank}, pp_size={pp_size}: need 0 <= pp_rank < pp_size")
    if timeout <= 0:
        raise WeightcacheError(f"timeout={timeout}: must be positive (seconds)")
    o = _lib.AcquireOptions()
    _lib.lib().wc_acquire_options_init(ctypes.byref(o))
    o.model = _lib.enc(name if not fingerprint else None)
    o.fingerprint = _lib.enc(fingerprint)
    o.tp_size, o.tp_rank, o.pp_size, o.pp_rank = tp_size, tp_rank, pp_size, pp_rank
    o.device_uuid = _torch.device_uuid(device).encode()
    o.dtype = _torch.spec_dtype(dtype).encode()
    o.quantization = (quantization or "").encode()
    o.wait_ready = 1 if wait else 0
    o.load_on_miss = 1 if load_on_miss else 0
    o.timeout_ms = int(timeout * 1000)
    for key, value in (identity or {}).items():  # published weights: engine, recipe, ...
        setattr(o, key, _lib.enc(value))
    return o


def acquire(
    model: Optional[str] = None,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    device: Any = None,
    dtype: Any = None,
    quantization: Optional[str] = None,
    wait: bool = True,
    load_on_miss: bool = False,
    timeout: float = 600,
    socket: Optional[str] = None,
    mode: Optional[str] = None,
    fallback: Optional[Callable[[], T]] = None,
    model_dir: Optional[str] = None,
    fingerprint: Optional[str] = None,
    engine: Optional[str] = None,
    engine_version: str = "",
    framework_version: Optional[str] = None,
    recipe: Optional[str] = None,
) -> Union[Weights, T]:
    """Maps a cached model-rank and returns its tensors (see :class:`Weights`).

    Args:
        model: the daemon's spec name, or a model directory (spawn mode, fallbacks); None
            (and no ``fingerprint``) reads ``$WEIGHTCACHE_FINGERPRINT`` when it is set (an
            exact fingerprint: a miss rather than other weights), else ``$WEIGHTCACHE_MODEL``.
        tp_rank, tp_size, pp_rank, pp_size: the rank to map.
        device: where the engine computes: a torch device, "cuda:N", an int or a GPU UUID;
            None takes the cached entry wherever it is.
        dtype, quantization: expectations (``torch.bfloat16``/"bf16", "none"/"fp8_block");
            a cached entry in another form is a :class:`FingerprintMismatch`.
        wait: wait for a load in progress. load_on_miss: ask the daemon to load on a miss.
        timeout: seconds for the whole call.
        socket: control.sock or its directory; None reads ``$WEIGHTCACHE_SOCKET``.
        mode: "off" (never touch the daemon), "client" (use a running daemon) or "spawn"
            (start a per-user daemon when none answers); None reads ``$WEIGHTCACHE_MODE``,
            default "client".
        fallback: called (no arguments) and its result returned instead of raising when the
            cache cannot serve: mode "off", a miss, a mismatch, stale weights, a refused
            quantization or no daemon.
        model_dir: the checkpoint directory (spawn mode loads it; default: ``model`` when it
            is a directory).
        fingerprint: acquire this exact fingerprint instead of a model name.
        engine, engine_version, framework_version, recipe: weights an engine published
            (:func:`weightcache.publish`) under this identity; framework_version defaults to
            ``"torch <version>"`` when a recipe is given.

    Raises:
        CacheMiss, FingerprintMismatch, StaleWeights, UnsupportedQuantization,
        DaemonUnavailable (all WeightcacheError), unless ``fallback`` is given.

    Example::

        w = weightcache.acquire("llama-8b", tp_rank=rank, tp_size=world, device=f"cuda:{rank}")
        bind(model, w)
    """
    m = resolve_mode(mode)
    if m == "off":
        if fallback is not None:
            return fallback()
        raise WeightcacheError(f"weightcache is off ({MODE_ENV}=off or mode='off') and no "
                               "fallback= was given", "DISABLED")
    t0 = time.perf_counter()
    try:
        if not fingerprint and model is None:
            fingerprint = os.environ.get(FINGERPRINT_ENV) or None
        if fingerprint:
            name, mdir = "", model_dir
        else:
            name, mdir = resolve_model(model, model_dir)
        o = _options(name, fingerprint, tp_rank, tp_size, pp_rank, pp_size, device, dtype,
                     quantization, wait, load_on_miss or m == "spawn", timeout,
                     engine_identity(engine, engine_version, framework_version, recipe))
        if m == "spawn":
            from . import _spawn

            lease = _spawn.acquire_spawned(socket, o, name, mdir, timeout)
        else:
            c = _lib.shared_client(socket)
            try:
                lease = _lib.acquire_lease(c, o)
            except DaemonUnavailable:
                # The kept connection may predate a daemon restart: once more on a new one.
                _lib.drop_shared_client(c)
                with _lib.Client(socket) as fresh:
                    lease = _lib.acquire_lease(fresh, o)
        return _build(lease, t0)
    except FALLBACK_ERRORS as e:
        if fallback is None:
            raise
        log.warning("weightcache: %s: %s; loading through the fallback", type(e).__name__,
                    e.message)
        return fallback()
