"""ctypes bindings of libweightcache.so (include/weightcache/weightcache.h, ABI version 3).

The library is found through ``$WEIGHTCACHE_LIB`` (a path to the .so), else beside this
package (``weightcache/libweightcache.so``, where ``pip install`` puts it when it was copied
there first). It is loaded once, lazily, with ``RTLD_LOCAL | RTLD_DEEPBIND``: its gRPC,
protobuf and abseil resolve inside its own scope first, so copies of those libraries that
torch or grpcio bring into the process neither interpose on it nor see its symbols (it
exports only ``wc_`` symbols anyway).
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_int,
    c_int32,
    c_int64,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Callable, Optional

from ._errors import WeightcacheError, error_from_status

ABI_VERSION = 3
LIB_ENV = "WEIGHTCACHE_LIB"
LIB_NAME = "libweightcache.so"


class AcquireOptions(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("model", c_char_p),
        ("fingerprint", c_char_p),
        ("tp_size", c_int32),
        ("tp_rank", c_int32),
        ("pp_size", c_int32),
        ("pp_rank", c_int32),
        ("compute_capability", c_char_p),
        ("device_uuid", c_char_p),
        ("dtype", c_char_p),
        ("quantization", c_char_p),
        ("wait_ready", c_int32),
        ("load_on_miss", c_int32),
        ("timeout_ms", c_int64),
        ("engine", c_char_p),
        ("engine_version", c_char_p),
        ("framework_version", c_char_p),
        ("recipe", c_char_p),
    ]


class ArtifactKey(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("kind", c_char_p),
        ("model", c_char_p),
        ("fingerprint", c_char_p),
        ("engine", c_char_p),
        ("engine_version", c_char_p),
        ("torch_version", c_char_p),
        ("triton_version", c_char_p),
        ("cuda_version", c_char_p),
        ("compute_capability", c_char_p),
        ("settings_hash", c_char_p),
    ]


class PublishTensor(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("shape", POINTER(c_int64)),
        ("ndim", c_int32),
        ("nbytes", c_uint64),
    ]


class PublishOptions(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("model", c_char_p),
        ("tp_size", c_int32),
        ("tp_rank", c_int32),
        ("pp_size", c_int32),
        ("pp_rank", c_int32),
        ("compute_capability", c_char_p),
        ("device_uuid", c_char_p),
        ("engine", c_char_p),
        ("engine_version", c_char_p),
        ("framework_version", c_char_p),
        ("recipe", c_char_p),
        ("tensors", POINTER(PublishTensor)),
        ("tensor_count", c_uint64),
        ("timeout_ms", c_int64),
    ]


class LeaseInfo(Structure):
    _fields_ = [
        ("id", c_char_p),
        ("model", c_char_p),
        ("fingerprint", c_char_p),
        ("backend", c_char_p),
        ("device_uuid", c_char_p),
        ("model_dir", c_char_p),
        ("spec_yaml", c_char_p),
        ("tp_size", c_int32),
        ("tp_rank", c_int32),
        ("pp_size", c_int32),
        ("pp_rank", c_int32),
        ("total_bytes", c_uint64),
        ("segment_count", c_uint64),
        ("tensor_count", c_uint64),
        ("map_seconds", c_double),
    ]


class Tensor(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("ndim", c_int32),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("data", c_void_p),
        ("nbytes", c_uint64),
        ("segment", c_uint32),
        ("offset", c_uint64),
        ("backend", c_char_p),
        ("device_uuid", c_char_p),
    ]


class Columns(Structure):
    _fields_ = [
        ("count", c_uint64),
        ("names", POINTER(c_char_p)),
        ("dtypes", POINTER(c_char_p)),
        ("ndim", POINTER(c_int32)),
        ("dims", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("segment", POINTER(c_uint32)),
        ("offset", POINTER(c_uint64)),
        ("nbytes", POINTER(c_uint64)),
    ]


class LoadProgress(Structure):
    _fields_ = [
        ("fingerprint", c_char_p),
        ("state", c_char_p),
        ("bytes_done", c_uint64),
        ("bytes_total", c_uint64),
        ("current_file", c_char_p),
        ("error", c_char_p),
        ("elapsed_seconds", c_double),
    ]


PROGRESS_FN = ctypes.CFUNCTYPE(None, POINTER(LoadProgress), c_void_p)
_ERR = POINTER(c_void_p)  # char** (a void* so ctypes does not copy and lose the pointer)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def library_path() -> Path:
    """Where libweightcache.so is taken from: ``$WEIGHTCACHE_LIB``, else beside the package."""
    env = os.environ.get(LIB_ENV)
    if env:
        p = Path(env)
        if not p.is_file():
            raise WeightcacheError(f"{LIB_ENV}={env} is not a file (it must name {LIB_NAME})")
        return p
    p = Path(__file__).resolve().parent / LIB_NAME
    if not p.is_file():
        raise WeightcacheError(
            f"{LIB_NAME} not found beside the package ({p}); set {LIB_ENV} to its path "
            "(a build puts it at build/pkg/client/capi/libweightcache.so) or install the "
            "package with the library copied into python/weightcache/ (docs/engines.md)"
        )
    return p


def _declare(lib: ctypes.CDLL) -> None:
    def fn(name: str, restype, *argtypes) -> None:
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)

    fn("wc_version", c_char_p)
    fn("wc_abi_version", c_int)
    fn("wc_status_name", c_char_p, c_int)
    fn("wc_string_free", None, c_void_p)
    fn("wc_connect", c_int, c_char_p, POINTER(c_void_p), _ERR)
    fn("wc_client_free", None, c_void_p)
    fn("wc_client_socket", c_char_p, c_void_p)
    fn("wc_acquire_options_init", None, POINTER(AcquireOptions))
    fn("wc_acquire", c_int, c_void_p, POINTER(AcquireOptions), POINTER(c_void_p), _ERR)
    fn("wc_lease_close", None, c_void_p)
    fn("wc_lease_info_get", c_int, c_void_p, POINTER(LeaseInfo))
    fn("wc_lease_segment", c_int, c_void_p, c_uint64, POINTER(c_void_p), POINTER(c_uint64), _ERR)
    fn("wc_lease_tensor", c_int, c_void_p, c_uint64, POINTER(Tensor), _ERR)
    fn("wc_lease_tensors", c_int, c_void_p, POINTER(Tensor), c_uint64, POINTER(c_uint64))
    fn("wc_lease_columns", c_int, c_void_p, POINTER(Columns))
    fn("wc_lease_find", c_int, c_void_p, c_char_p, POINTER(Tensor), _ERR)
    fn("wc_lease_check", c_int, c_void_p, c_int, _ERR)
    fn("wc_lease_watch", c_int, c_void_p, c_int, POINTER(c_int), _ERR)
    fn("wc_lease_detach", c_int, c_void_p, _ERR)
    fn("wc_lease_reattach", c_int, c_void_p, c_int32, c_int64, _ERR)
    fn("wc_lease_detached", c_int, c_void_p)
    fn("wc_release", c_int, c_void_p, c_char_p, _ERR)
    fn("wc_status_json", c_int, c_void_p, POINTER(c_void_p), _ERR)
    fn("wc_load", c_int, c_void_p, c_char_p, c_char_p, PROGRESS_FN, c_void_p, _ERR)
    fn("wc_evict", c_int, c_void_p, c_char_p, c_char_p, POINTER(c_uint32), _ERR)
    fn("wc_publish_options_init", None, POINTER(PublishOptions))
    fn("wc_publish_begin", c_int, c_void_p, POINTER(PublishOptions), POINTER(c_void_p), _ERR)
    fn("wc_publish_joined", c_int, c_void_p)
    fn("wc_publish_fingerprint", c_char_p, c_void_p)
    fn("wc_publish_data", c_int, c_void_p, c_char_p, POINTER(c_void_p), POINTER(c_uint64), _ERR)
    fn("wc_publish_commit", c_int, c_void_p, _ERR)
    fn("wc_publish_free", None, c_void_p)
    fn("wc_artifact_key_init", None, POINTER(ArtifactKey))
    fn("wc_artifact_put", c_int, c_void_p, POINTER(ArtifactKey), c_void_p, c_uint64, _ERR)
    fn("wc_artifact_get", c_int, c_void_p, POINTER(ArtifactKey), c_int64, POINTER(c_void_p),
       _ERR)
    fn("wc_artifact_data", c_void_p, c_void_p)
    fn("wc_artifact_size", c_uint64, c_void_p)
    fn("wc_artifact_id", c_char_p, c_void_p)
    fn("wc_artifact_free", None, c_void_p)


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use, once per process)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            mode = os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0)
            try:
                loaded = ctypes.CDLL(str(path), mode=mode)
            except OSError as e:
                raise WeightcacheError(f"cannot load {path}: {e}") from e
            _declare(loaded)
            abi = loaded.wc_abi_version()
            if abi != ABI_VERSION:
                raise WeightcacheError(
                    f"{path} has C ABI version {abi}; this package needs {ABI_VERSION}"
                )
            _lib = loaded
    return _lib


def take_string(p: c_void_p) -> str:
    """Decodes and frees a string the library malloc'd."""
    if not p.value:
        return ""
    try:
        return ctypes.string_at(p.value).decode("utf-8", "replace")
    finally:
        lib().wc_string_free(p)


def check(code: int, err: c_void_p, what: str) -> None:
    """Raises the typed exception for a failed call (code != 0), freeing its message."""
    if code == 0:
        return
    message = take_string(err) or what
    raise error_from_status(code, lib().wc_status_name(code).decode(), message)


def enc(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode()


class _Owned:
    """One owned library handle, freed by the named library function exactly once: on
    close() or when garbage-collected, by the process that made it. Closing is atomic (two
    threads closing at once free it once). A forked child (vLLM forks its workers) inherits
    the object but not the right to free it: the handle is the parent's (a gRPC channel does
    not survive fork, and a lease's release would end the parent's lease), so in the child
    close() only forgets it."""

    _free = ""  # the wc_ function that frees the handle
    _what = ""

    def __init__(self, handle: c_void_p) -> None:
        self._handle: Optional[c_void_p] = handle
        self._pid = os.getpid()
        self._close_lock = threading.Lock()

    @property
    def handle(self) -> c_void_p:
        h = self._handle
        if h is None:
            raise WeightcacheError(f"{self._what} is closed")
        return h

    def close(self) -> None:
        with self._close_lock:
            h, self._handle = self._handle, None
        if h is not None and self._pid == os.getpid():
            getattr(lib(), self._free)(h)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class Client(_Owned):
    """An owned wc_client handle (a control-socket connection to the daemon)."""

    _free, _what = "wc_client_free", "client"

    def __init__(self, socket: Optional[str] = None) -> None:
        L = lib()
        handle = c_void_p()
        err = c_void_p()
        check(L.wc_connect(enc(socket or ""), ctypes.byref(handle), ctypes.byref(err)), err,
              "connect")
        super().__init__(handle)
        self.socket = L.wc_client_socket(handle).decode()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status_json(self) -> str:
        out = c_void_p()
        err = c_void_p()
        check(lib().wc_status_json(self.handle, ctypes.byref(out), ctypes.byref(err)), err,
              "status")
        return take_string(out)

    def load(self, model: str = "", spec_yaml: str = "",
             on_progress: Optional[Callable[[LoadProgress], None]] = None) -> None:
        err = c_void_p()

        def cb(p, _user) -> None:  # noqa: ANN001 (ctypes callback)
            if on_progress is not None:
                on_progress(p.contents)

        c_cb = PROGRESS_FN(cb)
        check(lib().wc_load(self.handle, enc(model), enc(spec_yaml), c_cb, None,
                            ctypes.byref(err)), err, "load")

    def evict(self, model: str = "", fingerprint: str = "") -> int:
        n = c_uint32()
        err = c_void_p()
        check(lib().wc_evict(self.handle, enc(model), enc(fingerprint), ctypes.byref(n),
                             ctypes.byref(err)), err, "evict")
        return int(n.value)

    def release(self, lease_id: str) -> None:
        err = c_void_p()
        check(lib().wc_release(self.handle, enc(lease_id), ctypes.byref(err)), err, "release")


class Lease(_Owned):
    """An owned wc_lease handle: the mapping and the lease in the daemon. Closing it (or its
    garbage collection) unmaps; the Python objects that use its memory hold a reference."""

    _free, _what = "wc_lease_close", "lease"


_shared_clients: "dict[tuple[int, str], Client]" = {}
_shared_lock = threading.Lock()


def shared_client(socket: Optional[str]) -> Client:
    """This process's connection to the daemon at ``socket``: made on first use and kept, as a
    C++ engine keeps its client (gRPC reconnects by itself). Keyed by pid too: a forked child
    makes its own (a gRPC channel does not survive fork)."""
    key = (os.getpid(), socket or os.environ.get("WEIGHTCACHE_SOCKET", ""))
    with _shared_lock:
        c = _shared_clients.get(key)
        if c is None or c._handle is None:
            c = Client(socket)
            _shared_clients[key] = c
        return c


def drop_shared_client(client: Client) -> None:
    """Forgets a kept connection, e.g. after the daemon it reached went away. It is not
    closed here: other threads may be inside calls on it (ctypes releases the GIL during a
    call); it is freed when the last of them lets go of it."""
    with _shared_lock:
        for k, c in list(_shared_clients.items()):
            if c is client:
                del _shared_clients[k]


class Publish(_Owned):
    """An owned wc_publish handle. Closing it without a commit aborts the publish."""

    _free, _what = "wc_publish_free", "publish"


def begin_publish(client: Client, options: PublishOptions) -> Publish:
    handle = c_void_p()
    err = c_void_p()
    check(lib().wc_publish_begin(client.handle, ctypes.byref(options), ctypes.byref(handle),
                                 ctypes.byref(err)), err, "publish")
    return Publish(handle)


def acquire_lease(client: Client, options: AcquireOptions) -> Lease:
    handle = c_void_p()
    err = c_void_p()
    check(lib().wc_acquire(client.handle, ctypes.byref(options), ctypes.byref(handle),
                           ctypes.byref(err)), err, "acquire")
    return Lease(handle)


class Artifact(_Owned):
    """An owned wc_artifact handle: a compile artifact mapped read-only. Closing it unmaps."""

    _free, _what = "wc_artifact_free", "artifact"

    def bytes(self) -> bytes:
        """A copy of the artifact's bytes (torch's loaders take ``bytes``)."""
        L = lib()
        return ctypes.string_at(L.wc_artifact_data(self.handle), L.wc_artifact_size(self.handle))

    @property
    def id(self) -> str:
        return lib().wc_artifact_id(self.handle).decode()


def get_artifact(client: Client, key: ArtifactKey, wait_ms: int = 0) -> Artifact:
    handle = c_void_p()
    err = c_void_p()
    check(lib().wc_artifact_get(client.handle, ctypes.byref(key), wait_ms, ctypes.byref(handle),
                                ctypes.byref(err)), err, "get artifact")
    return Artifact(handle)


def put_artifact(client: Client, key: ArtifactKey, data: bytes) -> None:
    err = c_void_p()
    buf = ctypes.create_string_buffer(data, len(data))
    check(lib().wc_artifact_put(client.handle, ctypes.byref(key), ctypes.cast(buf, c_void_p),
                                len(data), ctypes.byref(err)), err, "put artifact")
