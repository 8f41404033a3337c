# Wrapper of src_c/cpu/attention.c: takes validated float32 C-contiguous (batch, heads, seq, head_dim)
# arrays (ops/attention.py checks shapes and converts dtypes), allocates the result, runs the kernel
# without the GIL.
cimport numpy as cnp
import numpy as np
from libc.math cimport sqrt
from libc.stdint cimport int64_t

cnp.import_array()

cdef extern from "attention.h" nogil:
    int hs_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t slabs,
                         int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal)


cdef inline float *_f32_4d(cnp.ndarray a, str name) except NULL:
    # The kernel reads raw memory: a wrong dtype, layout or rank here would read out of bounds, so refuse
    # it (ops/attention.py converts; this only guards direct callers of the extension).
    if (cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(a) or a.ndim != 4
            or not cnp.PyArray_ISNOTSWAPPED(a) or not cnp.PyArray_ISALIGNED(a)):
        raise TypeError(f"attention: {name} must be a 4-d C-contiguous float32 array (validate through hipsched.ops)")
    return <float *>cnp.PyArray_DATA(a)


def attention(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, causal=False, scale=None):
    """softmax(scale * q k^T [causal mask]) v per (batch, head); scale None means 1/sqrt(head_dim)."""
    cdef float *pq = _f32_4d(q, "q")
    cdef float *pk = _f32_4d(k, "k")
    cdef float *pv = _f32_4d(v, "v")
    qs, ks, vs = (<object>q).shape, (<object>k).shape, (<object>v).shape
    if (qs[0], qs[1], qs[3]) != (ks[0], ks[1], ks[3]) or ks != vs:
        raise ValueError(f"attention: shapes do not match: q {qs} vs k {ks} vs v {vs}")
    cdef int64_t slabs = q.shape[0] * q.shape[1], sq = q.shape[2], sk = k.shape[2], d = q.shape[3]
    cdef float s = (1.0 / sqrt(<double>d) if d > 0 else 1.0) if scale is None else <float>float(scale)
    cdef int c = 1 if causal else 0
    out = np.empty((q.shape[0], q.shape[1], sq, d), dtype=np.float32)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    cdef int rc
    with nogil:
        rc = hs_attention_f32(pq, pk, pv, po, slabs, sq, sk, d, s, c)
    if rc != 0:
        raise MemoryError("attention: could not allocate the per-thread scratch buffers")
    return out
