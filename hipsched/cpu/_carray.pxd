# Shared guard of the CPU wrappers: the C kernels read raw memory, so a pointer is only taken from a
# C-contiguous float32 ndarray. hipsched.ops validates and converts first; this guards direct callers.
cimport numpy as cnp


cdef inline float *f32_ptr(object a, str name) except NULL:
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    # byte-swapped float32 ('>f4') has type NPY_FLOAT32 too, but its bytes are not native floats
    if (cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(arr)
            or not cnp.PyArray_ISNOTSWAPPED(arr) or not cnp.PyArray_ISALIGNED(arr)):
        raise TypeError(f"{name} must be a C-contiguous, aligned, native-byte-order float32 array "
                        f"(validate through hipsched.ops)")
    return <float *>cnp.PyArray_DATA(arr)
