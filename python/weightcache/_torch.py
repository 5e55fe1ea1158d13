"""torch specifics: dtypes, and naming devices the way the daemon does (GPU UUIDs)."""

from __future__ import annotations

import ctypes
import re
from typing import Any, Dict, Optional

# safetensors dtype name -> (torch attribute, element size in bytes)
_DTYPES: Dict[str, tuple] = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "I16": ("int16", 2),
    "U16": ("uint16", 2),
    "I32": ("int32", 4),
    "U32": ("uint32", 4),
    "I64": ("int64", 8),
    "U64": ("uint64", 8),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F32": ("float32", 4),
    "F64": ("float64", 8),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)

# What the daemon calls a dtype it converts to ("bf16") for each torch dtype.
_SPEC_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def torch_dtype(name: str, tensor: str) -> Any:
    """The torch dtype of safetensors dtype ``name`` (for tensor ``tensor``, named in errors)."""
    import torch

    from ._errors import WeightcacheError

    entry = _DTYPES.get(name)
    dt = getattr(torch, entry[0], None) if entry else None
    if dt is None:
        raise WeightcacheError(
            f"tensor '{tensor}': dtype {name} has no torch type in torch {torch.__version__}"
            + (" (float8 types need torch >= 2.1)" if name.startswith("F8") else "")
        )
    return dt


def element_size(name: str) -> int:
    return _DTYPES[name][1] if name in _DTYPES else 1


def spec_dtype(dtype: Any) -> str:
    """The daemon's name for a dtype given as a torch dtype or a string ("bf16")."""
    if dtype is None:
        return ""
    if isinstance(dtype, str):
        return dtype
    from ._errors import WeightcacheError

    name = str(dtype).replace("torch.", "")
    if name not in _SPEC_DTYPES:
        raise WeightcacheError(
            f"dtype={dtype}: the cache serves bf16, fp16 or fp32 (torch.bfloat16, "
            "torch.float16, torch.float32)"
        )
    return _SPEC_DTYPES[name]


def _uuid_from_driver(ordinal: int) -> Optional[str]:
    """The GPU UUID of this process's CUDA ordinal, asked from the driver (cuDeviceGetUuid),
    for torch versions whose device properties lack ``uuid``."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev = ctypes.c_int()
    raw = (ctypes.c_ubyte * 16)()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None
    get = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
    if get(raw, dev) != 0:
        return None
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def gpu_uuid(ordinal: int) -> str:
    """The UUID ("GPU-...") of ``cuda:<ordinal>`` as this process numbers its GPUs."""
    import torch

    from ._errors import WeightcacheError

    n = torch.cuda.device_count()
    if not 0 <= ordinal < n:
        raise WeightcacheError(f"device cuda:{ordinal}: this process sees {n} CUDA device(s)")
    u = getattr(torch.cuda.get_device_properties(ordinal), "uuid", None)
    s = str(u) if u is not None else ""
    if s.startswith("GPU-"):
        s = s[4:]
    if not _UUID.match(s):  # an older torch, or a form we do not know: ask the driver
        s = (_uuid_from_driver(ordinal) or "")[4:]
    if not _UUID.match(s):
        raise WeightcacheError(f"cannot read the UUID of cuda:{ordinal}")
    return "GPU-" + s.lower()


def cuda_ordinal(uuid: str) -> int:
    """This process's ordinal of the GPU named ``uuid`` (whatever CUDA_VISIBLE_DEVICES is)."""
    import torch

    from ._errors import WeightcacheError

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for i in range(n):
        if gpu_uuid(i) == uuid:
            return i
    raise WeightcacheError(
        f"the lease's memory is on GPU {uuid}, which this process does not see "
        f"({n} visible CUDA device(s); check CUDA_VISIBLE_DEVICES)"
    )


def device_uuid(device: Any) -> str:
    """The daemon's name for ``device``: "" for the CPU, a GPU UUID for a CUDA device.

    Accepts None (""), a torch.device, "cpu", "cuda", "cuda:N", an int N, or "GPU-..."."""
    from ._errors import WeightcacheError

    if device is None:
        return ""
    if isinstance(device, str) and device.startswith("GPU-"):
        return device
    import torch

    try:
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    except (RuntimeError, TypeError) as e:
        raise WeightcacheError(
            f"device={device!r}: give a torch device, 'cuda:N', an int or a GPU UUID ({e})"
        ) from e
    if d.type == "cpu":
        return ""
    if d.type != "cuda":
        raise WeightcacheError(f"device={device!r}: the cache serves cpu and cuda devices")
    return gpu_uuid(d.index if d.index is not None else torch.cuda.current_device())
