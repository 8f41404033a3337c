# The compiled common case of an op's CPU side, as the dispatcher (hipsched._dispatch.FastPath) calls it:
# through a C vtable, never through Python. An op spec names its instance (`hot=(module, name)`).
cimport numpy as cnp


cdef class HotOp:
    # The arguments of a call in the op's common case (plain C-contiguous aligned native float32
    # ndarrays of valid shapes, the scalars of the common types), ready for `run`, with its work
    # measure and bytes; None for anything else, which then takes the op's `prepare` (the general
    # path: conversions, device arrays, every error message). Never raises.
    cdef object check(self, tuple args, dict kwargs, double *size, double *nbytes)
    # The result of a call `check` accepted: the same kernel, on the same inputs, as the op's CPU
    # function, so both paths give identical results.
    cdef object run(self, object ready)


cdef inline bint plain_f32(object x) noexcept:
    """What the general path takes without a copy: an exact ndarray (no subclass, whose operators
    may differ), float32 in native byte order, C-contiguous and aligned."""
    if not cnp.PyArray_CheckExact(x):
        return False
    cdef cnp.ndarray a = <cnp.ndarray>x
    return (cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT32 and cnp.PyArray_IS_C_CONTIGUOUS(a)
            and cnp.PyArray_ISALIGNED(a) and cnp.PyArray_ISNOTSWAPPED(a))
