"""verify(): compare mapped tensors with the checkpoint files, byte for byte.

A rank's tensor is compared with the whole disk tensor when their shapes are equal, or with
the rank's slice of it when exactly one dimension is ``tp_size`` times smaller (column, row and
vocabulary sharding). Fused views (``qkv_proj``, ``gate_up_proj``, ...) have no disk tensor
and are checked through their parts; anything else without a disk counterpart is reported.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Tuple

from ._bind import FUSED
from ._errors import WeightcacheError


class DiskTensor(NamedTuple):
    path: Path
    dtype: str
    shape: Tuple[int, ...]
    begin: int  # absolute file offset
    end: int


def read_index(model_dir: str) -> Dict[str, DiskTensor]:
    """Every tensor of the *.safetensors files in ``model_dir`` (header only)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WeightcacheError(f"{model_dir}: no *.safetensors files")
    out: Dict[str, DiskTensor] = {}
    for f in files:
        with open(f, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise WeightcacheError(f"{f}: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            size = f.stat().st_size
            if n > size - 8:
                raise WeightcacheError(f"{f}: header length {n} exceeds the file size {size}")
            header = json.loads(fh.read(n))
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, en = e["data_offsets"]
            out[name] = DiskTensor(f, e["dtype"], tuple(e["shape"]), 8 + n + b, 8 + n + en)
    return out


def _disk_bytes(t: DiskTensor) -> Any:
    import numpy as np

    with open(t.path, "rb") as fh:
        fh.seek(t.begin)
        return np.frombuffer(fh.read(t.end - t.begin), dtype=np.uint8)


def tensor_bytes(t: Any) -> Any:
    """A tensor's bytes as a numpy uint8 array of shape ``t.shape + (element_size,)`` (copied
    to the host for CUDA tensors)."""
    import numpy as np
    import torch

    c = t.detach()
    if c.device.type != "cpu":
        c = c.cpu()
    c = c.contiguous()
    raw = c.view(torch.uint8) if c.dim() > 0 else c.reshape(1).view(torch.uint8)
    arr = raw.numpy()
    return np.asarray(arr).reshape(tuple(t.shape) + (t.element_size(),))


def expected_bytes(disk: DiskTensor, shape: Tuple[int, ...], rank: int, size: int) -> Any:
    """The disk tensor's bytes (its rank slice when sharded), shaped like tensor_bytes()."""
    raw = _disk_bytes(disk)
    n = 1
    for d in disk.shape:
        n *= d
    esize = raw.size // n if n else 1
    full = raw.reshape(tuple(disk.shape) + (esize,))
    if tuple(shape) == tuple(disk.shape):
        return full
    dims = [i for i, (a, b) in enumerate(zip(shape, disk.shape)) if a != b]
    if len(shape) == len(disk.shape) and len(dims) == 1 and shape[dims[0]] * size == \
            disk.shape[dims[0]]:
        d = dims[0]
        k = shape[d]
        index = [slice(None)] * full.ndim
        index[d] = slice(rank * k, (rank + 1) * k)
        return full[tuple(index)]
    raise WeightcacheError(f"shape {tuple(shape)} is not the disk shape {disk.shape} or a "
                           f"1/{size} slice of it along one dimension")


class VerifyReport(NamedTuple):
    checked: int
    bytes: int
    fused_views: List[str]  # checked through their parts
    failures: List[str]


def verify(weights: Mapping[str, Any], model_dir: str, *, tp_rank: int = 0,
           tp_size: int = 1) -> VerifyReport:
    """Compares every tensor of ``weights`` with the checkpoint in ``model_dir``."""
    import numpy as np

    index = read_index(model_dir)
    failures: List[str] = []
    fused: List[str] = []
    checked = nbytes = 0
    for name, t in weights.items():
        disk = index.get(name)
        if disk is None:
            if any(f".{k}." in name for k in FUSED):
                fused.append(name)
            else:
                failures.append(f"{name}: not in the checkpoint")
            continue
        try:
            want = expected_bytes(disk, tuple(t.shape), tp_rank, tp_size)
        except WeightcacheError as e:
            failures.append(f"{name}: {e.message}")
            continue
        except ValueError:  # element sizes differ: the daemon converted the dtype
            failures.append(f"{name}: stored as {disk.dtype}, served as {t.dtype} (converted)")
            continue
        got = tensor_bytes(t)
        if got.shape != want.shape or not np.array_equal(got, want):
            failures.append(f"{name}: bytes differ from {disk.path.name}")
        checked += 1
        nbytes += got.size
    return VerifyReport(checked, nbytes, fused, failures)
