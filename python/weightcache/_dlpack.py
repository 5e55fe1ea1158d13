"""Zero-copy torch tensors over mapped memory through DLPack (legacy ``dltensor`` capsules,
which every torch from 1.10 to 2.x imports).

Each segment of a lease becomes one uint8 tensor whose DLPack deleter holds a reference to an
owner object (the lease): torch calls the deleter when the last tensor sharing that storage
(every view of it, every as_strided tensor cut from it) is freed, and only then may the
mapping go.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p
from typing import Any

KDL_CPU = 1
KDL_CUDA = 2
KDL_UINT = 1


class _Device(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", _Device),
        ("ndim", c_int32),
        ("dtype", _DType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class _Managed(Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", _DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]
_incref = ctypes.pythonapi.Py_IncRef
_incref.argtypes = [ctypes.py_object]
_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes = [c_void_p]


class _Holder:
    """What manager_ctx points at: the DLPack structs and the owner, kept alive together."""

    __slots__ = ("managed", "shape", "owner")

    def __init__(self, managed: _Managed, shape: Any, owner: object) -> None:
        self.managed = managed
        self.shape = shape
        self.owner = owner


def _delete(managed: Any) -> None:
    # Called by torch (any thread; ctypes takes the GIL) when the storage dies: drops the
    # reference taken in byte_tensor, which frees the holder and, if it was the last, the owner.
    try:
        _decref(managed.contents.manager_ctx)
    except Exception:  # interpreter shutdown
        pass


_delete_fn = _DELETER(_delete)


def byte_tensor(ptr: int, nbytes: int, cuda_ordinal: int, owner: object) -> Any:
    """A 1-D uint8 torch tensor over ``nbytes`` at ``ptr`` (host memory when ``cuda_ordinal``
    is -1, else device memory on ``cuda:<cuda_ordinal>``), sharing it without a copy; its
    storage keeps ``owner`` alive."""
    from torch.utils import dlpack

    shape = (c_int64 * 1)(nbytes)
    managed = _Managed()
    t = managed.dl_tensor
    t.data = ptr
    t.device = _Device(KDL_CPU if cuda_ordinal < 0 else KDL_CUDA, max(cuda_ordinal, 0))
    t.ndim = 1
    t.dtype = _DType(KDL_UINT, 8, 1)
    t.shape = shape
    t.strides = None
    t.byte_offset = 0
    holder = _Holder(managed, shape, owner)
    managed.manager_ctx = id(holder)
    managed.deleter = _delete_fn
    _incref(holder)  # released by _delete
    capsule = _capsule_new(ctypes.addressof(managed), b"dltensor", None)
    try:
        return dlpack.from_dlpack(capsule)
    except BaseException:
        _decref(id(holder))
        raise
