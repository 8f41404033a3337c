# The one consumer of DLPack capsules (hipsched/gpu/memory/_dlpack_import.pyx): the compiled call path
# (gpu/launch/_callpath.pyx) cimports `take` and `DLPackHold`; DeviceArray.from_external calls `consume`.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t

# dlpack.h's legacy (unversioned) structs, the ones a `dltensor` capsule holds.
cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void *data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void (*deleter)(DLManagedTensor *) noexcept nogil


cdef class DLPackHold:
    cdef DLManagedTensor *m
    cdef object producer             # the object __dlpack__ was called on, kept with its tensor
    cdef public object library       # the module whose arrays results go back as (set by the call path)
    cdef readonly size_t ptr         # data + byte_offset
    cdef readonly size_t nbytes      # bits // 8 times the elements
    cdef readonly int ndim
    cdef readonly tuple shape
    cdef readonly object strides     # in elements, or None (C-contiguous)
    cdef readonly int code, bits, lanes
    cdef int device_type, device_id


cdef DLPackHold take(object capsule, object producer)
