"""DLPack capsules through ctypes: producing a `dltensor` capsule for a device pointer (DeviceArray.__dlpack__).
Consuming one from another library (CuPy, PyTorch, JAX) is _dlpack_import.pyx's, whose type-code table
this reads. Only the legacy unversioned DLManagedTensor is spoken, which every consumer still accepts when
`max_version` is not passed."""
from __future__ import annotations

import ctypes

import numpy as np

from ...dlpack_devices import (GPU_DEVICE_TYPES, kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged,  # noqa: F401
                             kDLROCM, kDLROCMHost)
from ...errors import GpuError
from ._dlpack_import import TYPE_CODES, kDLBfloat


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Raw-pointer variants for the capsule destructor: the capsule is being deallocated there, and
# wrapping it in a py_object would resurrect it (incref/decref) and free it twice.
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

# Capsule names must outlive every capsule: module-level constants.
_NAME = ctypes.c_char_p(b"dltensor")

# Exported tensors alive in other libraries: address of the DLManagedTensor -> (struct, owner).
# No lock: the deleter and the capsule destructor run from the collector and from other libraries'
# finalizers, on whatever thread, possibly one in the middle of registering an export, and each
# access is one dict operation, atomic on its own. The entry popped is let go after the pop, so the
# owner's own finalizers (which may release other capsules) see a consistent dict.
_exported: dict[int, tuple] = {}


@_Deleter
def _deleter(managed):
    _exported.pop(ctypes.cast(managed, ctypes.c_void_p).value, None)


def _capsule_destructor_impl(capsule_ptr):
    # Called when our capsule dies. Consumed capsules were renamed "used_dltensor" and the consumer
    # calls the deleter itself; an unconsumed one still owns its tensor, so release it here.
    if _raw_is_valid(capsule_ptr, _NAME):
        addr = _raw_get_pointer(capsule_ptr, _NAME)
        _exported.pop(addr, None)


_capsule_destructor = _CapsuleDestructor(_capsule_destructor_impl)


def dl_dtype(dtype: np.dtype) -> DLDataType:
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16" and dtype.itemsize == 2:   # ml_dtypes' bfloat16 is NumPy kind 'V'
        return DLDataType(kDLBfloat, 16, 1)
    if dtype.kind not in TYPE_CODES:
        raise GpuError("unsupported", f"dtype {dtype} has no DLPack type code")
    return DLDataType(TYPE_CODES[dtype.kind], dtype.itemsize * 8, 1)


def make_capsule(ptr: int, shape, strides_elems, dtype, device: tuple[int, int], owner):
    """A `dltensor` capsule viewing `ptr`; `owner` is kept alive until the consumer's deleter runs."""
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides_elems) if strides_elems is not None else None
    m = DLManagedTensor()
    m.dl_tensor.data = ptr
    m.dl_tensor.device = DLDevice(*device)
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype = dl_dtype(dtype)
    m.dl_tensor.shape = shape_arr
    m.dl_tensor.strides = strides_arr
    m.dl_tensor.byte_offset = 0
    m.manager_ctx = None
    m.deleter = _deleter
    addr = ctypes.addressof(m)
    _exported[addr] = (m, shape_arr, strides_arr, owner)
    return _api.PyCapsule_New(addr, _NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p))
