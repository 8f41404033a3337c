# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The one consumer of DLPack capsules: a `dltensor` capsule from another library (CuPy, PyTorch, JAX, or
a hipsched DeviceArray), taken after the `__dlpack__(stream=...)` handshake, read in C into a `DLPackHold`
(pointer, shape, strides, type code and bits, device) that owns the producer's tensor from then on: its
deallocation (or `release`) calls the producer's deleter. The compiled call path (gpu/launch/_callpath.pyx)
calls `take` in C for each foreign argument of a replayed call; DeviceArray.from_external calls `consume`.
Only the legacy unversioned DLManagedTensor is spoken, which every producer still gives when
`max_version` is not passed. Producing capsules (DeviceArray.__dlpack__) is dlpack.py's."""
import atexit
import importlib

from cpython.pycapsule cimport PyCapsule_IsValid, PyCapsule_GetPointer, PyCapsule_SetName

import numpy as np

from ...errors import GpuError

# DLDataTypeCode of a NumPy kind (kDLBool = 6), and kDLBfloat, which NumPy has no kind for: the table both
# directions read (dlpack.py's dl_dtype produces with it).
TYPE_CODES = {"i": 0, "u": 1, "f": 2, "b": 6, "c": 5}
_KINDS = {v: k for k, v in TYPE_CODES.items()}
kDLBfloat = 4

# Set at interpreter exit, before modules are torn down: a hold still alive then (a foreign tensor kept
# in a module global) must not call a deleter that may be a ctypes thunk already freed (hipsched's own
# exports' deleter lives in dlpack.py), which would crash the exit. The process is ending: the memory
# goes with it.
cdef bint _exiting = False


def _at_exit():
    global _exiting
    _exiting = True


atexit.register(_at_exit)


def bfloat16_dtype():
    """ml_dtypes' bfloat16, the NumPy dtype for DLPack's kDLBfloat 16 (imported only when one comes)."""
    try:   # deferred: ml_dtypes is optional, needed only for bfloat16. importlib, not Cython's import, which
        ml_dtypes = importlib.import_module("ml_dtypes")   # takes a None in sys.modules for the module
    except ImportError as e:
        raise GpuError("unsupported", "a bfloat16 device array needs the ml_dtypes package for its NumPy dtype "
                                      "(pip install ml_dtypes)") from e
    return np.dtype(ml_dtypes.bfloat16)


def np_dtype(int code, int bits, int lanes=1):
    """The NumPy dtype of a DLDataType (code, bits, lanes); GpuError for one NumPy cannot hold."""
    if code == kDLBfloat and bits == 16 and lanes == 1:
        return bfloat16_dtype()
    if lanes != 1 or code not in _KINDS:
        raise GpuError("unsupported", f"DLPack dtype (code={code}, bits={bits}, lanes={lanes}) not supported")
    return np.dtype("?" if code == 6 else f"{_KINDS[code]}{bits // 8}")


cdef class DLPackHold:
    """A consumed DLPack tensor and its producer's object, kept until the work reading it has run; the
    producer's deleter runs when this goes (or at `release`). Its fields are read once, when taken."""

    @property
    def device(self):
        """(DLPack device type, index)."""
        return (self.device_type, self.device_id)

    @property
    def dtype(self):
        return np_dtype(self.code, self.bits, self.lanes)

    def release(self):
        """Hand the tensor back to its producer now (its deleter runs once; later calls do nothing)."""
        cdef DLManagedTensor *m = self.m
        self.m = NULL
        if m != NULL and m.deleter != NULL and not _exiting:
            m.deleter(m)

    def __dealloc__(self):
        cdef DLManagedTensor *m = self.m
        self.m = NULL
        if m != NULL and m.deleter != NULL and not _exiting:
            m.deleter(m)


cdef DLPackHold take(object capsule, object producer):
    """The tensor of an unconsumed `dltensor` capsule, now owned by the returned hold (the capsule is
    renamed `used_dltensor`, so the producer's capsule destructor leaves it alone); None for anything else."""
    cdef DLManagedTensor *m
    cdef DLTensor *d
    cdef DLPackHold hold
    cdef size_t nbytes
    cdef int i
    if not PyCapsule_IsValid(capsule, b"dltensor"):
        return None
    m = <DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor")
    PyCapsule_SetName(capsule, b"used_dltensor")   # ours now: the producer's destructor must not free it
    hold = DLPackHold.__new__(DLPackHold)
    hold.m = m
    hold.producer = producer
    d = &m.dl_tensor
    hold.ndim = d.ndim
    hold.code = d.dtype.code
    hold.bits = d.dtype.bits
    hold.lanes = d.dtype.lanes
    hold.device_type = d.device.device_type
    hold.device_id = d.device.device_id
    hold.shape = tuple([d.shape[i] for i in range(d.ndim)])
    hold.strides = None if d.strides == NULL else tuple([d.strides[i] for i in range(d.ndim)])
    nbytes = d.dtype.bits // 8
    for i in range(d.ndim):
        nbytes *= <size_t>d.shape[i]
    hold.nbytes = nbytes
    hold.ptr = <size_t>d.data + <size_t>d.byte_offset
    return hold


def consume(capsule, producer=None):
    """The tensor of an unconsumed `dltensor` capsule as a DLPackHold (`producer`, the object that made the
    capsule, is kept with it); GpuError("unsupported") for anything else, a consumed capsule included."""
    hold = take(capsule, producer)
    if hold is None:
        raise GpuError("unsupported", "object is not an unconsumed DLPack 'dltensor' capsule")
    return hold
