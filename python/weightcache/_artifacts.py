"""Compile artifacts: the start-up work after the weights (``torch.compile``'s caches, Triton
and JIT cache directories) kept by the node daemon, so the next engine of the same model,
versions and settings skips it (docs/engines.md, "Compile artifacts").

An artifact is code the engines that load it will run: putting one needs the publish role
(the daemon's ``--publish_uids`` or ``--publish_namespaces``); getting one needs only what
mapping the model needs. The key names everything that makes it valid; a different torch,
Triton, CUDA, GPU or setting is a different artifact, never a wrong one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Union

from . import _lib
from ._errors import CacheMiss, WeightcacheError

# Fields of a key, in the C struct's order.
_FIELDS = ("kind", "model", "fingerprint", "engine", "engine_version", "torch_version",
           "triton_version", "cuda_version", "compute_capability", "settings_hash")


def settings_hash(settings: Any) -> str:
    """A stable hash of an engine's compile settings (any JSON-able value; other objects by
    ``repr``): 32 hex digits."""
    if isinstance(settings, str):
        text = settings
    else:
        text = json.dumps(settings, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def triton_version_installed() -> str:
    """The version of the Triton this process would import, read without importing it: an
    AOTInductor hit never runs Triton's Python, and importing it only for its version cost
    0.14 s of a 3.3 s engine start (H100 host, Triton 3.6, -X importtime). The version is
    the installed distribution's (its metadata) when that distribution provides the very
    package importlib finds; otherwise (a source tree on the path) the package is imported
    and its __version__ read. Every process takes the same branch for the same installation,
    so keys agree. "" when there is no Triton."""
    import importlib.metadata  # here: only a key needs them, not `import weightcache`
    import importlib.util

    try:
        spec = importlib.util.find_spec("triton")  # finds; runs nothing of the package
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return ""
    origin = os.path.realpath(spec.origin)
    for name in ("triton", "pytorch-triton", "pytorch-triton-rocm"):  # wheels' names
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if os.path.realpath(str(dist.locate_file("triton/__init__.py"))) == origin:
            return dist.version or ""
    try:
        import triton  # type: ignore

        return str(getattr(triton, "__version__", ""))
    except ImportError:
        return ""


def artifact_key(kind: str, model: str, fingerprint: str, *, settings: Any = None,
                 engine: str = "", engine_version: str = "",
                 torch_version: Optional[str] = None, triton_version: Optional[str] = None,
                 cuda_version: Optional[str] = None,
                 compute_capability: Optional[str] = None) -> Dict[str, str]:
    """The key of an artifact for this process: versions default to the imported torch and
    Triton, the CUDA torch was built with and the current GPU's compute capability."""
    if torch_version is None or cuda_version is None or compute_capability is None:
        import torch

        if torch_version is None:
            torch_version = torch.__version__
        if cuda_version is None:
            cuda_version = torch.version.cuda or ""
        if compute_capability is None:
            compute_capability = ""
            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability()
                compute_capability = f"{major}.{minor}"
    if triton_version is None:
        triton_version = triton_version_installed()
    return {"kind": kind, "model": model, "fingerprint": fingerprint, "engine": engine,
            "engine_version": engine_version, "torch_version": torch_version,
            "triton_version": triton_version, "cuda_version": cuda_version,
            "compute_capability": compute_capability,
            "settings_hash": settings_hash(settings) if settings is not None else ""}


def _c_key(key: Dict[str, str]) -> "_lib.ArtifactKey":
    unknown = set(key) - set(_FIELDS)
    if unknown:
        raise WeightcacheError(f"artifact key: unknown field(s) {sorted(unknown)}; "
                               f"fields are {', '.join(_FIELDS)}")
    k = _lib.ArtifactKey()
    _lib.lib().wc_artifact_key_init(k)
    for f in _FIELDS:
        setattr(k, f, _lib.enc(key.get(f, "")))
    return k


def get_artifact(key: Dict[str, str], *, wait: float = 0.0,
                 socket: Optional[str] = None) -> Optional[bytes]:
    """The artifact's bytes, or None when the daemon has none under ``key`` (a model it does
    not know raises :class:`CacheMiss` naming it). ``wait`` (seconds): while another engine is
    putting it, wait that long for it."""
    client = _lib.shared_client(socket)
    try:
        a = _lib.get_artifact(client, _c_key(key), int(wait * 1000))
    except CacheMiss as e:
        if e.message.startswith("no artifact"):
            return None
        raise  # e.g. a model the daemon does not know: a mistake, not a miss
    try:
        return a.bytes()
    finally:
        a.close()


def put_artifact(key: Dict[str, str], data: bytes, *, socket: Optional[str] = None) -> bool:
    """Stores ``data`` under ``key``. True when stored; False when the daemon has it already
    or another engine is putting it right now (theirs is served: same key, same meaning)."""
    client = _lib.shared_client(socket)
    try:
        _lib.put_artifact(client, _c_key(key), data)
    except WeightcacheError as e:
        if e.code in ("ALREADY_EXISTS", "ABORTED"):
            return False
        raise
    return True


def _pack_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(path.rglob("*")):
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                continue  # only what a cache directory holds: files and directories
            tar.add(p, arcname=str(p.relative_to(path)), recursive=False)
    return buf.getvalue()


def _unpack_dir(data: bytes, path: Path) -> int:
    """Extracts files and directories only, each inside ``path`` (an artifact is input from
    another process: no links, devices, absolute paths or ``..``)."""
    path.mkdir(parents=True, exist_ok=True)
    root = path.resolve()
    n = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for m in tar.getmembers():
            target = (root / m.name).resolve()
            if os.path.isabs(m.name) or root not in (target, *target.parents):
                raise WeightcacheError(f"restore_dir: member '{m.name}' lies outside {path}")
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif m.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None
                tmp = target.with_name(target.name + f".wc-tmp-{os.getpid()}")
                with open(tmp, "wb") as out:
                    out.write(src.read())
                os.replace(tmp, target)  # a reader of the cache never sees half a file
                n += 1
            else:
                raise WeightcacheError(f"restore_dir: member '{m.name}' is not a file or "
                                       f"directory")
    return n


def save_dir(key: Dict[str, str], path: Union[str, Path], *,
             socket: Optional[str] = None) -> bool:
    """Packs a JIT cache directory (Triton's, DeepGEMM's, FlashInfer's, vLLM's compile cache)
    and puts it under ``key`` (kind e.g. ``"dir:triton"``). False when the daemon had it."""
    path = Path(path)
    if not path.is_dir():
        raise WeightcacheError(f"save_dir: {path} is not a directory")
    return put_artifact(key, _pack_dir(path), socket=socket)


def restore_dir(key: Dict[str, str], path: Union[str, Path], *, wait: float = 0.0,
                socket: Optional[str] = None) -> bool:
    """Restores the directory saved under ``key`` into ``path`` (made if missing; files it
    holds already are replaced). False when the daemon has none."""
    data = get_artifact(key, wait=wait, socket=socket)
    if data is None:
        return False
    _unpack_dir(data, Path(path))
    return True


@dataclass
class CompileCacheResult:
    """What :func:`compile_cache` did: ``hit`` (torch's caches were loaded from the daemon),
    ``put`` (this process's caches were saved to it), and the seconds each took."""

    key: Dict[str, str]
    hit: bool = False
    put: bool = False
    load_seconds: float = 0.0
    save_seconds: float = 0.0
    bytes: int = 0


@contextlib.contextmanager
def compile_cache(model: str, fingerprint: str, *, settings: Any = None, engine: str = "",
                  engine_version: str = "", wait: float = 0.0,
                  socket: Optional[str] = None) -> Iterator[CompileCacheResult]:
    """Around an engine's warm-up (its first compiled forwards)::

        with weightcache.compile_cache("llama-8b", w.fingerprint, settings=compile_kwargs):
            model = torch.compile(model, **compile_kwargs)
            model(example)          # compiles, or finds every kernel in the loaded caches

    Before: the artifacts saved under this key are loaded into torch
    (``torch.compiler.load_cache_artifacts``). After, when there were none: torch's caches are
    saved (``torch.compiler.save_cache_artifacts``) and put, for the next engine. Needs torch
    2.6 or later. A failure to put is not the engine's failure: it is recorded in the result's
    ``put`` (False). The node's probe decision (:mod:`weightcache.probes`) is applied first,
    so the compile does not probe the CPU again."""
    from . import probes

    probes.apply(socket=socket)
    import torch

    compiler = getattr(torch, "compiler", None)
    if compiler is None or not hasattr(compiler, "load_cache_artifacts"):
        raise WeightcacheError(
            f"compile_cache needs torch.compiler.load_cache_artifacts (torch 2.6 or later); "
            f"this is torch {torch.__version__}")
    key = artifact_key("torch-compile", model, fingerprint, settings=settings, engine=engine,
                       engine_version=engine_version)
    result = CompileCacheResult(key=key)
    t0 = time.perf_counter()
    blob = get_artifact(key, wait=wait, socket=socket)
    if blob is not None:
        compiler.load_cache_artifacts(blob)
        result.hit = True
        result.bytes = len(blob)
    result.load_seconds = time.perf_counter() - t0
    yield result
    if result.hit:
        return
    t0 = time.perf_counter()
    saved = compiler.save_cache_artifacts()
    if saved is not None:
        data = saved[0]
        result.bytes = len(data)
        result.put = put_artifact(key, data, socket=socket)
    result.save_seconds = time.perf_counter() - t0
