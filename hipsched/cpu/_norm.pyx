# Wrappers of src_c/cpu/norm.c: take validated C-contiguous float32, float16 or bfloat16 arrays
# (ops/norm.py checks shapes, dtypes and eps), allocate the result in x's dtype, run the kernel without
# the GIL.
cimport numpy as cnp
import numpy as np
from libc.stdint cimport int64_t

from hipsched.cpu._carray cimport float_ptr, hs_dtype

cnp.import_array()

cdef extern from "norm.h" nogil:
    void hs_rms_norm(hs_dtype dt, const void *x, const void *w, double eps, void *out, int64_t rows, int64_t len)


def rms_norm(x, weight, double eps=1e-6):
    """x / sqrt(mean(x**2, -1) + eps) * weight over the last axis (see hipsched.ops.norm); x and weight
    of one dtype (the kernel reads both with one element type)."""
    cdef int cx = -1, cw = -1
    cdef void *px = float_ptr(x, "x", &cx)
    cdef void *pw = float_ptr(weight, "weight", &cw)
    if cx != cw:
        raise TypeError(f"rms_norm: x ({x.dtype}) and weight ({weight.dtype}) must have one dtype "
                        f"(promote through hipsched.ops)")
    # the kernel reads len weights per row: a short weight would be read past its end
    if x.ndim < 1 or weight.ndim != 1 or weight.shape[0] != x.shape[x.ndim - 1]:
        raise ValueError(f"rms_norm: weight {weight.shape} must be (x.shape[-1],) for x {x.shape}")
    if not eps > 0:
        raise ValueError(f"rms_norm: eps must be > 0, got {eps!r}")
    cdef int64_t length = x.shape[x.ndim - 1]
    cdef int64_t rows = x.size // length if length else 0
    out = np.empty_like(x)
    cdef void *po = cnp.PyArray_DATA(out)
    cdef hs_dtype dt = <hs_dtype>cx
    with nogil:
        hs_rms_norm(dt, px, pw, eps, po, rows, length)
    return out


include "_threads.pxi"
