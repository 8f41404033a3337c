# Shared guard of the CPU wrappers: the C kernels read raw memory, so a pointer is only taken from a
# C-contiguous float ndarray. hipsched.ops validates and converts first; this guards direct callers.
cimport numpy as cnp


cdef extern from "dtypes.h":
    ctypedef enum hs_dtype:
        HS_F32
        HS_F16
        HS_BF16


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


cdef inline void *float_ptr(object a, str name, int *dtype_code) except NULL:
    """Data pointer of a C-contiguous, aligned, native float32/float16/bfloat16 array; its hs_dtype
    code goes to *dtype_code. Half data is returned as raw 16-bit patterns for the kernels to convert."""
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    cdef int t = cnp.PyArray_TYPE(arr)
    cdef int code
    if t == cnp.NPY_FLOAT32:
        code = HS_F32
    elif t == cnp.NPY_FLOAT16:
        code = HS_F16
    # ml_dtypes registers bfloat16 as a user dtype with no fixed type number; its name is what is
    # stable, and the item size guards against an unrelated dtype that happens to share the name
    elif arr.dtype.name == "bfloat16" and arr.dtype.itemsize == 2:
        code = HS_BF16
    else:
        code = -1
    # a swapped byte order keeps the type number, but the bytes are not what the kernels read
    if (code < 0 or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISNOTSWAPPED(arr)
            or not cnp.PyArray_ISALIGNED(arr)):
        raise TypeError(f"{name} must be a C-contiguous, aligned, native-byte-order float32, float16 "
                        f"or bfloat16 array (validate through hipsched.ops)")
    dtype_code[0] = code
    return cnp.PyArray_DATA(arr)
