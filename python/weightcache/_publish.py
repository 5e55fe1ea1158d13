"""Publishing: an engine donates the weights it processed itself (docs/engines.md)."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_int64, c_uint64, c_void_p
from typing import Any, Callable, Dict, Mapping, Optional

from . import _lib, _torch
from ._errors import CacheMiss, FingerprintMismatch, WeightcacheError
from ._weights import Weights, acquire, engine_identity


def _dtype_name(t: Any) -> str:
    import torch

    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.float64: "F64", torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16",
             torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL"}
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None:
        names[fp8] = "F8_E4M3"
    fp8b = getattr(torch, "float8_e5m2", None)
    if fp8b is not None:
        names[fp8b] = "F8_E5M2"
    if t.dtype not in names:
        raise WeightcacheError(f"publish: dtype {t.dtype} has no safetensors name")
    return names[t.dtype]


def publish(model: str, tensors: Mapping[str, Any], *, engine: str, recipe: str,
            engine_version: str = "", framework_version: Optional[str] = None,
            tp_rank: int = 0, tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1,
            device: Any = None, timeout: float = 600, socket: Optional[str] = None) -> str:
    """Publishes ``tensors`` (processed from the checkpoint of spec ``model``) so that later
    engines map them read-only with ``acquire(model, engine=..., recipe=...)``.

    The daemon allocates the memory on ``device`` (default: where the first tensor lives),
    this process copies every tensor in (a device-to-device copy on a GPU), and the commit
    seals it. If another process publishes the same key at the same time, nothing is copied:
    theirs is served. Returns the fingerprint.

    Example::

        fp = weightcache.publish("llama-8b", dict(model.state_dict()), engine="myengine",
                                 recipe="fp8-v1", device="cuda:0")
    """
    import torch

    if not tensors:
        raise WeightcacheError("publish: no tensors")
    first = next(iter(tensors.values()))
    if device is None:
        device = first.device
    ident = engine_identity(engine, engine_version, framework_version, recipe)
    if not engine or not recipe:
        raise WeightcacheError("publish: engine= and recipe= are required (they name the "
                               "processing in the fingerprint)")
    items = list(tensors.items())
    keep = []  # the ctypes arrays, alive during the call
    arr = (_lib.PublishTensor * len(items))()
    for i, (name, t) in enumerate(items):
        shape = (c_int64 * max(t.dim(), 1))(*t.shape)
        keep.append(shape)
        arr[i].name = name.encode()
        arr[i].dtype = _dtype_name(t).encode()
        arr[i].shape = ctypes.cast(shape, POINTER(c_int64))
        arr[i].ndim = t.dim()
        arr[i].nbytes = t.numel() * t.element_size()
    o = _lib.PublishOptions()
    _lib.lib().wc_publish_options_init(ctypes.byref(o))
    o.model = model.encode()
    o.tp_size, o.tp_rank, o.pp_size, o.pp_rank = tp_size, tp_rank, pp_size, pp_rank
    o.device_uuid = _torch.device_uuid(device).encode()
    for key, value in ident.items():
        setattr(o, key, value.encode())
    o.tensors = arr
    o.tensor_count = len(items)
    o.timeout_ms = int(timeout * 1000)
    with _lib.Client(socket) as c:
        p = _lib.begin_publish(c, o)
        try:
            fingerprint = _lib.lib().wc_publish_fingerprint(p.handle).decode()
            if _lib.lib().wc_publish_joined(p.handle):
                return fingerprint
            target = torch.device(device) if not isinstance(device, int) else \
                torch.device("cuda", device)
            ordinal = -1 if target.type == "cpu" else (
                target.index if target.index is not None else torch.cuda.current_device())
            from ._dlpack import byte_tensor

            # Every device a copy runs on is synchronised before the commit seals the bytes:
            # the destination's, and each CUDA source's (a copy from a GPU to a host
            # destination runs on the source's stream).
            busy = {ordinal} if ordinal >= 0 else set()
            for name, t in items:
                ptr, n, err = c_void_p(), c_uint64(), c_void_p()
                _lib.check(_lib.lib().wc_publish_data(p.handle, name.encode(), ctypes.byref(ptr),
                                                      ctypes.byref(n), ctypes.byref(err)),
                           err, "publish")
                dst = byte_tensor(ptr.value, n.value, ordinal, p)
                src = t.detach().contiguous().reshape(-1).view(torch.uint8)
                if src.is_cuda:
                    busy.add(src.device.index)
                dst.copy_(src, non_blocking=True)
            for d in sorted(busy):
                torch.cuda.synchronize(d)
            err = c_void_p()
            _lib.check(_lib.lib().wc_publish_commit(p.handle, ctypes.byref(err)), err, "publish")
            return fingerprint
        finally:
            p.close()  # without a commit: aborted, nothing left in the daemon


def acquire_or_publish(model: str, load: Callable[[], Mapping[str, Any]], *, engine: str,
                       recipe: str, engine_version: str = "",
                       framework_version: Optional[str] = None, tp_rank: int = 0,
                       tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1, device: Any = None,
                       timeout: float = 600, socket: Optional[str] = None) -> Weights:
    """The engine pattern: acquire the weights published under this recipe; on a miss, run
    ``load`` (the engine's own load-and-process, returning name -> tensor), publish its
    result and return the mapped read-only copy (so every engine runs on the same memory).

    Example::

        w = weightcache.acquire_or_publish("llama-8b", lambda: my_load_and_fp8(model_dir),
                                           engine="myengine", recipe="fp8-v1", device="cuda:0")
        bind(model, w)
    """
    common: Dict[str, Any] = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank,
                                  pp_size=pp_size, device=device, timeout=timeout,
                                  socket=socket, engine=engine, engine_version=engine_version,
                                  framework_version=framework_version, recipe=recipe)
    try:
        return acquire(model, mode="client", **common)
    except (CacheMiss, FingerprintMismatch):
        pass
    tensors = load()
    publish(model, tensors, **common)
    del tensors  # the engine's own copy goes; the mapped one serves
    return acquire(model, mode="client", wait=True, **common)
