# Wrappers of src_c/cpu/elementwise.c: take validated float32 C-contiguous arrays (ops/elementwise.py
# checks shapes and converts dtypes), allocate the result, run the kernel without the GIL.
cimport numpy as cnp
import numpy as np
from libc.stdint cimport int64_t

from hipsched.cpu._carray cimport f32_ptr

cnp.import_array()

cdef extern from "elementwise.h" nogil:
    void hs_add_f32(const float *a, const float *b, float *out, int64_t n, int64_t nb)
    void hs_scale_f32(const float *x, float alpha, float *out, int64_t n)
    void hs_softmax_f32(const float *x, float *out, int64_t outer, int64_t len, int64_t inner)
    void hs_exp_f32(const float *x, float *out, int64_t n)


def add(a, b):
    """a + b where b has a's shape or a trailing part of it (a bias repeated over the leading axes)."""
    cdef float *pa = f32_ptr(a, "a")
    cdef float *pb = f32_ptr(b, "b")
    cdef int64_t n = a.size, nb = b.size
    if b.ndim > a.ndim or tuple(a.shape[a.ndim - b.ndim:]) != tuple(b.shape):
        raise ValueError(f"add: b {b.shape} is neither a's shape {a.shape} nor a trailing part of it")
    out = np.empty_like(a)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_add_f32(pa, pb, po, n, nb)
    return out


def scale(x, alpha):
    """alpha * x; alpha is rounded to float32 first, as NumPy does for a Python scalar."""
    cdef float *px = f32_ptr(x, "x")
    cdef float a = <float>float(alpha)
    cdef int64_t n = x.size
    out = np.empty_like(x)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_scale_f32(px, a, po, n)
    return out


def softmax(x, int axis=-1):
    """exp(x - max) / sum along `axis` (see hipsched.ops.elementwise for the NaN/inf rules)."""
    cdef float *px = f32_ptr(x, "x")
    cdef int nd = x.ndim
    if nd == 0 or not -nd <= axis < nd:
        raise ValueError(f"softmax: axis {axis} is out of range for shape {x.shape}")
    if axis < 0:
        axis += nd
    cdef int64_t outer = 1, inner = 1, length = cnp.PyArray_DIM(x, axis)
    cdef int i
    for i in range(axis):
        outer *= cnp.PyArray_DIM(x, i)
    for i in range(axis + 1, nd):
        inner *= cnp.PyArray_DIM(x, i)
    out = np.empty_like(x)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_softmax_f32(px, po, outer, length, inner)
    return out


def exp(x):
    """The vectorised exp softmax uses (exposed so tests can measure its error in ulp)."""
    cdef float *px = f32_ptr(x, "x")
    cdef int64_t n = x.size
    out = np.empty_like(x)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_exp_f32(px, po, n)
    return out
