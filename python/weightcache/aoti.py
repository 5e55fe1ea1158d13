"""The compiled engine restored from the node: a code-only AOTInductor package kept by the
node daemon as a compile artifact, loaded in a fresh process and bound to the mapped weights
without a copy (docs/engines.md, "AOTInductor packages")::

    import weightcache, weightcache.aoti

    w = weightcache.acquire("llama-8b", device="cuda:0")
    weightcache.bind(model, w)                     # the module runs on the mapped weights
    fn = weightcache.aoti.load("llama-8b", w, module=model, example_inputs=(ids,))
    logits = fn(ids)                               # fn.source: "artifact", "built", ...

On a hit nothing is traced or compiled: the package is fetched, loaded (torch's C++ loader,
without the Python wrapper's per-process CPU probes: weightcache.probes) and its constants
bound to the mapped tensors (``user_managed``: the package runs on the daemon's memory). On a
miss the module is exported, compiled code-only and packaged, put for the next engine (the
publish role), and loaded. A package that the daemon refuses as damaged (DATA_LOSS) or that
does not load is never the engine's crash: the reason is logged and the package rebuilt, or,
when that fails too, the module is compiled with ``torch.compile`` (or run as it is).

The artifact's key names the model fingerprint, the settings and the example inputs' shapes,
torch, Triton, CUDA, the GPU's compute capability and a digest of the module's code
(:func:`code_digest`): a package built for another torch, CUDA or GPU, or from other code, is
another key, never fetched.

A package is native code this process ``dlopen``s: the daemon takes it only from admins and
the publishers the model's spec names for native code (``native_publishers:``). Before a
package is loaded a marker naming it is written under a per-user state directory
(:func:`state_dir`) and removed once the load returns; a marker still there means a load of
that package killed its process (a constructor that crashes), and that package is not loaded
again: the module is compiled instead (``fallback``), the reason naming the package and the
marker, so a bad package does not crash-loop the engine.
"""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import json
import logging
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import probes
from ._artifacts import artifact_key, get_artifact, put_artifact
from ._errors import WeightcacheError

log = logging.getLogger("weightcache")

KIND = "aoti-package"
_MAGIC = b"WCAOTI01"
_FORMAT = 1


class PackageError(WeightcacheError):
    """An AOTInductor artifact that is malformed or does not load; the message says why."""


@dataclass
class AotiModel:
    """A callable compiled model. ``source``: ``"artifact"`` (the package from the daemon),
    ``"built"`` (built here on a miss or after a refused package), ``"compile"`` /
    ``"eager"`` (the fallback: the module under ``torch.compile`` or as it is); ``reason``:
    why it is not ``"artifact"``; ``seconds``: get, load, bind, build."""

    fn: Callable[..., Any]
    key: Dict[str, str]
    source: str
    reason: str = ""
    put: bool = False
    constants: int = 0
    package_bytes: int = 0
    seconds: Dict[str, float] = field(default_factory=dict)
    probes: Optional[probes.Decision] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


# --- the artifact: one blob holding the package and what binding it needs ----------------

def pack(package: bytes, bindings: Mapping[str, str], constants: Mapping[str, Any]) -> bytes:
    """The artifact: ``_MAGIC``, a little-endian u64 header length, a JSON header, the
    package, then each extra constant's raw bytes. ``bindings`` maps a package constant's
    FQN to the name of the mapped weight it is bound to; ``constants`` are the package's
    other constants (e.g. rotary ``inv_freq`` buffers) as CPU tensors."""
    import torch

    entries, blobs, offset = [], [], 0
    for fqn in sorted(constants):
        t = constants[fqn].detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        entries.append({"fqn": fqn, "dtype": str(t.dtype).replace("torch.", ""),
                        "shape": list(t.shape), "offset": offset, "nbytes": len(raw)})
        blobs.append(raw)
        offset += len(raw)
    header = json.dumps({"format": _FORMAT, "package_bytes": len(package),
                         "bindings": dict(sorted(bindings.items())),
                         "constants": entries}).encode()
    return b"".join([_MAGIC, struct.pack("<Q", len(header)), header, package, *blobs])


def unpack(blob: bytes) -> Tuple[bytes, Dict[str, str], Dict[str, Any]]:
    """(package, bindings, constants) from an artifact; :class:`PackageError` naming what is
    wrong when it is not one (every length is checked against the blob)."""
    import torch

    if len(blob) < len(_MAGIC) + 8 or blob[:len(_MAGIC)] != _MAGIC:
        raise PackageError(f"AOTInductor artifact: {len(blob)} bytes without the "
                           f"{_MAGIC.decode()} header (not a weightcache.aoti artifact)")
    (n,) = struct.unpack_from("<Q", blob, len(_MAGIC))
    start = len(_MAGIC) + 8
    if n > len(blob) - start:
        raise PackageError(f"AOTInductor artifact: header of {n} bytes, only "
                           f"{len(blob) - start} follow")
    try:
        h = json.loads(blob[start:start + n])
        if h["format"] != _FORMAT:
            raise PackageError(f"AOTInductor artifact: format {h['format']}, this package "
                               f"reads {_FORMAT}")
        pkg_len = int(h["package_bytes"])
        bindings = {str(k): str(v) for k, v in h["bindings"].items()}
        entries = list(h["constants"])
    except PackageError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise PackageError(f"AOTInductor artifact: bad header: {e!r}") from e
    body = start + n
    if pkg_len < 0 or body + pkg_len > len(blob):
        raise PackageError(f"AOTInductor artifact: package of {pkg_len} bytes, only "
                           f"{len(blob) - body} follow the header")
    package = blob[body:body + pkg_len]
    base = body + pkg_len
    constants: Dict[str, Any] = {}
    for e in entries:
        try:
            dtype = getattr(torch, e["dtype"])
            shape, off, nbytes, fqn = list(e["shape"]), int(e["offset"]), int(e["nbytes"]), e["fqn"]
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise PackageError(f"AOTInductor artifact: bad constant entry {e!r}: {err!r}") from err
        if not isinstance(dtype, torch.dtype) or off < 0 or base + off + nbytes > len(blob):
            raise PackageError(f"AOTInductor artifact: constant {fqn} ({e['dtype']}, "
                               f"{nbytes} bytes at {off}) lies outside the blob or has no dtype")
        raw = bytearray(blob[base + off:base + off + nbytes])
        t = (torch.frombuffer(raw, dtype=torch.uint8) if nbytes
             else torch.empty(0, dtype=torch.uint8))
        try:
            constants[fqn] = t.view(dtype).reshape(shape)
        except RuntimeError as err:
            raise PackageError(f"AOTInductor artifact: constant {fqn}: {nbytes} bytes do not "
                               f"make {e['dtype']} {shape}") from err
    return package, bindings, constants


# --- loading ------------------------------------------------------------------------------

def promote_libstdcxx() -> List[str]:
    """Puts the libstdc++ this process already loaded into the global symbol scope.

    Why: on images whose Inductor links packages with its own copy of libstdc++'s locale code
    (torch 2.11 on Ubuntu 24.04 with /opt/gcc), the package's shared object binds to that copy
    unless the process's libstdc++ is global; torch's is not (a dependency of an extension
    Python opened RTLD_LOCAL), and the first std::regex in the package's constructor crashes
    (SIGSEGV in a codecvt facet; docs/benchmarks.md). RTLD_NOLOAD: nothing new is loaded, the
    one in memory is only made global, as LD_PRELOAD of it would."""
    done = []
    with open("/proc/self/maps") as f:
        paths = sorted({ln.split()[-1] for ln in f if "libstdc++.so" in ln and "/" in ln})
    for path in paths:
        ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
        done.append(path)
    return done


class _Loaded:
    """A package loaded through torch's C++ loader, called as AOTICompiledModel would be."""

    def __init__(self, loader: Any) -> None:
        import torch.utils._pytree as pytree

        self.loader = loader
        spec = loader.get_call_spec()
        self._pytree = pytree
        self._in = pytree.treespec_loads(spec[0])
        self._out = pytree.treespec_loads(spec[1])
        # boxed_run (torch 2.6+) frees the inputs as it goes, as AOTICompiledModel does;
        # run where a torch has only that.
        self._run = getattr(loader, "boxed_run", None) or loader.run

    def constant_fqns(self) -> List[str]:
        return list(self.loader.get_constant_fqns())

    def load_constants(self, constants: Dict[str, Any]) -> None:
        # use_inactive=False, check_full_update=True, user_managed=True: the tensors given are
        # the constants themselves (no copy into a package-owned buffer).
        self.loader.load_constants(constants, False, True, True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            from torch.export._tree_utils import reorder_kwargs

            kwargs = reorder_kwargs(kwargs, self._in)
        import torch

        flat = [x for x in self._pytree.tree_flatten((args, kwargs))[0]
                if isinstance(x, torch.Tensor)]
        return self._pytree.tree_unflatten(self._run(flat), self._out)


class _Public:
    """A package loaded with torch._inductor.aoti_load_package (the public wrapper, which
    probes the CPU first): used when the C++ loader's constructor is not the one we know."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def constant_fqns(self) -> List[str]:
        return list(self.compiled.get_constant_fqns())

    def load_constants(self, constants: Dict[str, Any]) -> None:
        self.compiled.load_constants(constants, check_full_update=True, user_managed=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)


def _device_index(device: Any) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else -1
    d = torch.device(device)
    return -1 if d.type == "cpu" else (d.index if d.index is not None
                                       else torch.cuda.current_device())


def load_package_file(path: str, *, device: Any = None, loader: str = "direct") -> Any:
    """Loads a .pt2 package; the result has ``constant_fqns()``, ``load_constants(dict)``
    (user-managed) and is called like the exported module. Uses torch's C++ loader directly:
    torch._inductor.aoti_load_package first runs Inductor's CPU vector-ISA probe (a compiler
    and a ``python -c 'import torch'`` per ISA) only to print a warning when the package was
    built on another CPU. Falls back to that public wrapper when the loader's signature is not
    the known one."""
    import torch

    promote_libstdcxx()
    aoti = getattr(torch._C, "_aoti", None)
    loader_cls = getattr(aoti, "AOTIModelPackageLoader", None)
    if loader_cls is None:
        raise PackageError(f"torch {torch.__version__} has no AOTInductor package loader "
                           f"(torch._C._aoti.AOTIModelPackageLoader; torch 2.6 or later)")
    if loader == "torch":
        import torch._inductor

        return _Public(torch._inductor.aoti_load_package(path))
    try:
        # (path, model name, run_single_threaded, num_runners, device_index): torch 2.8-2.11.
        return _Loaded(loader_cls(path, "model", False, 1, _device_index(device)))
    except TypeError as e:
        log.info("weightcache.aoti: torch's package loader takes other arguments (%s); "
                 "loading through torch._inductor.aoti_load_package", e)
    import torch._inductor

    return _Public(torch._inductor.aoti_load_package(path))


def _bind(loaded: Any, weights: Mapping[str, Any], bindings: Mapping[str, str],
          constants: Mapping[str, Any], device: Any) -> int:
    wanted = loaded.constant_fqns()
    out, missing = {}, []
    for fqn in wanted:
        if fqn in bindings and bindings[fqn] in weights:
            out[fqn] = weights[bindings[fqn]]
        elif fqn in constants:
            out[fqn] = constants[fqn].to(device) if device is not None else constants[fqn]
        else:
            missing.append(fqn)
    if missing:
        raise PackageError(f"the package needs constants neither the weights nor the artifact "
                           f"give: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    loaded.load_constants(out)
    return len(out)


def _scratch_dir() -> str:
    return tempfile.mkdtemp(prefix="wc-aoti-",
                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def _load_blob(blob: bytes, weights: Mapping[str, Any], device: Any,
               seconds: Dict[str, float], loader: str = "direct") -> Tuple[Any, int]:
    package, bindings, constants = unpack(blob)
    tmp = _scratch_dir()  # 0700: nobody else swaps the file between write and load
    try:
        path = os.path.join(tmp, "model.pt2")
        with open(path, "wb") as f:
            f.write(package)
        t = time.perf_counter()
        loaded = load_package_file(path, device=device, loader=loader)
        seconds["load"] = time.perf_counter() - t
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the loader extracted what it keeps
    t = time.perf_counter()
    n = _bind(loaded, weights, bindings, constants, device)
    seconds["bind"] = time.perf_counter() - t
    return loaded, n


# --- the loads that died: a marker per key, written before dlopen ------------------------

def state_dir() -> str:
    """Where this user's markers live: ``$WEIGHTCACHE_STATE_DIR``, else
    ``$XDG_STATE_HOME/weightcache``, else ``~/.local/state/weightcache`` (made 0700). In a
    Kubernetes pod point ``WEIGHTCACHE_STATE_DIR`` at an ``emptyDir`` volume: it outlives the
    container's restarts, which a crash-looping engine is."""
    d = os.environ.get("WEIGHTCACHE_STATE_DIR")
    if not d:
        base = os.environ.get("XDG_STATE_HOME") or os.path.join(
            os.path.expanduser("~"), ".local", "state")
        d = os.path.join(base, "weightcache")
    return d


def marker_path(key: Mapping[str, str]) -> str:
    """The marker of a load of ``key``'s package (one per key: a key whose package killed a
    load is not loaded again until the daemon holds another package for it)."""
    name = hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(state_dir(), "aoti-loads", name)


def _crashed_before(key: Mapping[str, str], package_sha256: str) -> str:
    """The marker's path when a previous load of this key's package (``package_sha256``; ""
    for one built here) died, else ""."""
    path = marker_path(key)
    try:
        with open(path) as f:
            left = json.load(f)
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return path  # unreadable: a load began and never ended
    if package_sha256 and left.get("sha256") not in ("", package_sha256):
        return ""  # another package now: the one that died was replaced
    return path


class _Marked:
    """The marker of one load, written (and synced) before the package is dlopened, removed
    when the load returns or raises: only a process that died mid-load leaves it."""

    def __init__(self, key: Mapping[str, str], package_sha256: str, source: str) -> None:
        self.path = marker_path(key)
        self.body = json.dumps({"sha256": package_sha256, "source": source, "pid": os.getpid(),
                                "model": key.get("model", ""), "unix_seconds": time.time()})

    def __enter__(self) -> "_Marked":
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(self.body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:  # no state dir: the load goes on, unguarded, and says so
            log.warning("weightcache.aoti: cannot write the load marker %s (%s): a package "
                        "that crashes this process would be loaded again at its restart; set "
                        "WEIGHTCACHE_STATE_DIR to a writable directory", self.path, e)
            self.path = ""
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.path:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def code_digest(module: Any = None, make_module: Optional[Callable[[], Any]] = None) -> str:
    """A digest of the code a package is compiled from: for ``module``, the source of every
    class among its modules (the file defining it, else its source, else its ``forward``'s
    bytecode), by qualified name; for ``make_module`` alone (a hit never builds the module),
    the same of the function that builds it. 32 hex digits; "" when there is neither."""
    target: List[Any] = []
    if module is not None:
        mods = module.modules() if hasattr(module, "modules") else [module]
        target = sorted({type(m) for m in mods}, key=lambda c: (c.__module__, c.__qualname__))
    elif make_module is not None:
        target = [make_module]
    if not target:
        return ""
    h, files = hashlib.sha256(), {}
    for obj in target:
        h.update(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}\0"
                 .encode())
        src = b""
        try:
            path = inspect.getsourcefile(obj)
            if path:
                if path not in files:
                    with open(path, "rb") as f:
                        files[path] = hashlib.sha256(f.read()).digest()
                src = files[path]
        except (TypeError, OSError):
            pass
        if not src:
            try:
                src = inspect.getsource(obj).encode()
            except (TypeError, OSError):
                code = getattr(getattr(obj, "forward", obj), "__code__", None)
                src = code.co_code if code is not None else repr(obj).encode()
        h.update(src + b"\0")
    return h.hexdigest()[:32]


# --- building -----------------------------------------------------------------------------

# Constants packed into the artifact beyond this are a module that does not run on the
# mapped weights (a copy of them would be put as code's baggage): refused, naming them.
_MAX_CONSTANT_BYTES = 256 << 20


def _split_constants(module: Any, weights: Mapping[str, Any]) -> Tuple[Dict[str, str],
                                                                      Dict[str, Any]]:
    """Which of the module's parameters and buffers are mapped weights (bound by name at
    load) and which are not (packed into the artifact). A tensor is a weight when it *is*
    one of ``weights`` (same memory, shape, strides, dtype), or — the module bound to another
    lease of the same weights, mapped at other addresses — when a weight whose name ends its
    FQN has its shape, strides and dtype and equal contents."""
    import torch

    by_ptr = {}
    for name in weights:
        t = weights[name]
        by_ptr[(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)] = name
    names = sorted(weights, key=len, reverse=True)  # the longest name that ends the FQN
    bindings, constants = {}, {}
    for fqn, t in list(module.named_parameters()) + list(module.named_buffers()):
        k = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if k in by_ptr:
            bindings[fqn] = by_ptr[k]
            continue
        for n in names:
            if fqn != n and not fqn.endswith("." + n):
                continue
            w = weights[n]
            if (tuple(w.shape), tuple(w.stride()), w.dtype) == k[1:] and \
                    w.device == t.device and torch.equal(w, t.detach()):
                bindings[fqn] = n
                break
        else:
            constants[fqn] = t.detach()
    total = sum(t.numel() * t.element_size() for t in constants.values())
    if total > _MAX_CONSTANT_BYTES:
        big = sorted(constants, key=lambda f: -constants[f].numel() * constants[f].element_size())
        raise PackageError(f"the module holds {total} bytes of tensors that are not the mapped "
                           f"weights (largest: {', '.join(big[:3])}): bind it to the weights "
                           f"(weightcache.bind) before building its package")
    return bindings, constants


def _build(module: Any, example_inputs: Sequence[Any], weights: Mapping[str, Any],
           inductor_configs: Optional[Dict[str, Any]]) -> bytes:
    import torch

    try:
        import torch._inductor
        import torch.export
    except ImportError:
        pass
    if not hasattr(getattr(torch, "_inductor", None), "aoti_compile_and_package") or \
            not hasattr(getattr(torch, "export", None), "export"):
        raise PackageError(f"torch {torch.__version__} cannot build AOTInductor packages "
                           f"(torch.export and torch._inductor.aoti_compile_and_package; "
                           f"torch 2.6 or later)")
    configs = {"aot_inductor.package_constants_in_so": False, **(inductor_configs or {})}
    tmp = _scratch_dir()
    try:
        with torch.no_grad():
            ep = torch.export.export(module, tuple(example_inputs))
        path = torch._inductor.aoti_compile_and_package(
            ep, package_path=os.path.join(tmp, "model.pt2"), inductor_configs=configs)
        with open(path, "rb") as f:
            package = f.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bindings, constants = _split_constants(module, weights)
    return pack(package, bindings, constants)


def _fallback(module: Any, how: Optional[str]) -> Tuple[Callable[..., Any], str]:
    import torch

    if how == "compile" and hasattr(torch, "compile"):
        return torch.compile(module), "compile"
    return module, "eager"


def package_key(model: str, fingerprint: str, *, example_inputs: Sequence[Any] = (),
                settings: Any = None, engine: str = "", engine_version: str = "",
                code: str = "", **versions: Optional[str]) -> Dict[str, str]:
    """The artifact key of the package: kind ``aoti-package``; the settings hash covers the
    caller's settings, the example inputs' shapes and dtypes (a package is specialized to
    them), ``code`` (:func:`code_digest` of the module) and the artifact format;
    ``engine_version`` defaults to ``code-<16 hex of code>``, so the key shows which code
    it is; ``versions`` (torch_version, triton_version, cuda_version, compute_capability)
    default to this process's."""
    shapes = [[list(x.shape), str(x.dtype)] if hasattr(x, "shape") else repr(x)
              for x in example_inputs]
    if not engine_version and code:
        engine_version = f"code-{code[:16]}"
    return artifact_key(KIND, model, fingerprint, engine=engine, engine_version=engine_version,
                        settings={"settings": settings, "inputs": shapes, "code": code,
                                  "format": _FORMAT},
                        **versions)


def load(model: str, weights: Any, *, module: Any = None,
         make_module: Optional[Callable[[], Any]] = None, example_inputs: Sequence[Any] = (),
         settings: Any = None, engine: str = "", engine_version: str = "", device: Any = None,
         inductor_configs: Optional[Dict[str, Any]] = None, fallback: Optional[str] = "compile",
         wait: float = 0.0, loader: str = "direct", code: Optional[str] = None,
         socket: Optional[str] = None) -> AotiModel:
    """The compiled model for ``weights`` (a :class:`weightcache.Weights`): the daemon's
    package when it has one that loads, else built from ``module`` (bound to ``weights``) and
    ``example_inputs``, and put for the next engine. ``make_module``: instead of ``module``,
    called only when the module is needed (a miss or a failure), so that a hit never builds
    it (nor imports transformers). ``fallback``: ``"compile"`` (``torch.compile(module)``, or
    the module where torch has no compile), ``"eager"``, or None (raise instead). ``loader``:
    ``"direct"`` (torch's C++ package loader) or ``"torch"``
    (``torch._inductor.aoti_load_package``, which runs Inductor's CPU probe first).
    ``device`` defaults to the weights' device. ``code``: what identifies the module's code
    in the key (default :func:`code_digest` of ``module``, else of ``make_module``: pass it
    when the function that builds the module does not change with the code, e.g. the
    modeling library's version). A package whose load killed this process before (its
    marker left behind, :func:`marker_path`) is not loaded: the module is compiled
    (``fallback``) and ``reason`` names the package."""
    if loader not in ("direct", "torch"):
        raise WeightcacheError(f"weightcache.aoti.load: loader={loader!r}; "
                               f"use 'direct' or 'torch'")
    decision = probes.apply(socket=socket)  # before anything imports torch._inductor
    if device is None and len(weights):
        device = weights[next(iter(weights))].device
    if code is None:
        code = code_digest(module, make_module)
    key = package_key(model, weights.fingerprint, example_inputs=example_inputs,
                      settings=settings, engine=engine, engine_version=engine_version, code=code)
    seconds: Dict[str, float] = {}
    reason = ""
    t = time.perf_counter()
    try:
        blob = get_artifact(key, wait=wait, socket=socket)
    except WeightcacheError as e:
        if e.code != "DATA_LOSS":
            raise
        blob, reason = None, f"the daemon refused the stored package: {e.message}"
        log.warning("weightcache.aoti: %s; rebuilding", reason)
    seconds["get"] = time.perf_counter() - t
    sha = hashlib.sha256(blob).hexdigest() if blob is not None else ""
    died = _crashed_before(key, sha)
    if died:
        # A load of this package killed the process before: never dlopen it (nor a rebuild of
        # the same code) again; compile the module instead.
        what = f"package sha256:{sha[:16]} of this key" if sha else "the package built here"
        reason = (f"{what} killed a previous load of it (its marker {died} was left behind): "
                  f"not loaded again (remove the marker to retry)")
        log.warning("weightcache.aoti: %s", reason)
    elif blob is not None:
        try:
            with _Marked(key, sha, "artifact"):
                loaded, n = _load_blob(blob, weights, device, seconds, loader)
            return AotiModel(loaded, key, "artifact", constants=n, package_bytes=len(blob),
                             seconds=seconds, probes=decision)
        except Exception as e:  # a package that does not load is never the engine's crash
            reason = f"the package from the daemon did not load: {type(e).__name__}: {e}"
            log.warning("weightcache.aoti: %s; rebuilding", reason)
    elif not reason:
        reason = "no package in the daemon for this key (a miss)"
    if module is None and make_module is not None:
        module = make_module()
    if module is None:
        raise PackageError(f"weightcache.aoti: {reason}, and no module to build it from")
    put = False
    if died:
        if fallback is None:
            raise PackageError(f"weightcache.aoti: {reason}")
        fn, how = _fallback(module, fallback)
        return AotiModel(fn, key, how, reason=reason, seconds=seconds, probes=decision)
    try:
        t = time.perf_counter()
        built = _build(module, example_inputs, weights, inductor_configs)
        seconds["build"] = time.perf_counter() - t
        try:
            put = put_artifact(key, built, socket=socket)
        except WeightcacheError as e:  # e.g. no publish role: the next engine builds too
            log.warning("weightcache.aoti: package built but not put: %s", e)
        with _Marked(key, hashlib.sha256(built).hexdigest(), "built"):
            loaded, n = _load_blob(built, weights, device, seconds, loader)
        return AotiModel(loaded, key, "built", reason=reason, put=put, constants=n,
                         package_bytes=len(built), seconds=seconds, probes=decision)
    except Exception as e:
        if fallback is None:
            raise
        reason = f"{reason}; building the package failed: {type(e).__name__}: {e}"
        fn, how = _fallback(module, fallback)
        log.warning("weightcache.aoti: %s; running the module %s", reason,
                    "under torch.compile" if how == "compile" else "as it is")
        return AotiModel(fn, key, how, reason=reason, put=put, seconds=seconds, probes=decision)
