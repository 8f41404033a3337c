# Wrappers of src_c/cpu/norm.c: take validated float32 C-contiguous arrays (ops/norm.py checks shapes,
# dtypes and eps), allocate the result, run the kernel without the GIL.
cimport numpy as cnp
import numpy as np
from libc.stdint cimport int64_t

from hipsched.cpu._carray cimport f32_ptr

cnp.import_array()

cdef extern from "norm.h" nogil:
    void hs_rms_norm_f32(const float *x, const float *w, double eps, float *out, int64_t rows, int64_t len)


def rms_norm(x, weight, double eps=1e-6):
    """x / sqrt(mean(x**2, -1) + eps) * weight over the last axis (see hipsched.ops.norm)."""
    cdef float *px = f32_ptr(x, "x")
    cdef float *pw = f32_ptr(weight, "weight")
    # the kernel reads len weights per row: a short weight would be read past its end
    if x.ndim < 1 or weight.ndim != 1 or weight.shape[0] != x.shape[x.ndim - 1]:
        raise ValueError(f"rms_norm: weight {weight.shape} must be (x.shape[-1],) for x {x.shape}")
    if not eps > 0:
        raise ValueError(f"rms_norm: eps must be > 0, got {eps!r}")
    cdef int64_t length = x.shape[x.ndim - 1]
    cdef int64_t rows = x.size // length if length else 0
    out = np.empty_like(x)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_rms_norm_f32(px, pw, eps, po, rows, length)
    return out
