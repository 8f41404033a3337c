# Wrapper of src_c/cpu/attention.c: takes validated C-contiguous (batch, heads, seq, head_dim) arrays,
# all float32, all float16 or all bfloat16 (ops/attention.py checks shapes and promotes mixes),
# allocates the result in that dtype, runs the kernel without the GIL.
cimport numpy as cnp
import numpy as np
from libc.math cimport sqrt
from libc.stdint cimport int64_t

from hipsched.cpu._carray cimport float_ptr

cnp.import_array()

cdef extern from "attention.h" nogil:
    int hs_attention(const void *q, const void *k, const void *v, void *out, int dtype, int64_t slabs,
                     int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal)


cdef inline void *_ptr_4d(cnp.ndarray a, str name, int *code) except NULL:
    # The kernel reads raw memory: a wrong dtype, layout or rank here would read out of bounds, so refuse
    # it (ops/attention.py converts; this only guards direct callers of the extension).
    if a.ndim != 4:
        raise TypeError(f"attention: {name} must be a 4-d C-contiguous float32/float16/bfloat16 array "
                        f"(validate through hipsched.ops)")
    return float_ptr(a, f"attention: {name}", code)


def attention(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, causal=False, scale=None):
    """softmax(scale * q k^T [causal mask]) v per (batch, head); scale None means 1/sqrt(head_dim)."""
    cdef int cq, ck, cv
    cdef void *pq = _ptr_4d(q, "q", &cq)
    cdef void *pk = _ptr_4d(k, "k", &ck)
    cdef void *pv = _ptr_4d(v, "v", &cv)
    if cq != ck or cq != cv:
        raise TypeError(f"attention: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    qs, ks, vs = (<object>q).shape, (<object>k).shape, (<object>v).shape
    if (qs[0], qs[1], qs[3]) != (ks[0], ks[1], ks[3]) or ks != vs:
        raise ValueError(f"attention: shapes do not match: q {qs} vs k {ks} vs v {vs}")
    cdef int64_t slabs = q.shape[0] * q.shape[1], sq = q.shape[2], sk = k.shape[2], d = q.shape[3]
    cdef float s = (1.0 / sqrt(<double>d) if d > 0 else 1.0) if scale is None else <float>float(scale)
    cdef int c = 1 if causal else 0
    out = np.empty((q.shape[0], q.shape[1], sq, d), dtype=q.dtype)
    cdef void *po = cnp.PyArray_DATA(out)
    cdef int rc
    with nogil:
        rc = hs_attention(pq, pk, pv, po, cq, slabs, sq, sk, d, s, c)
    if rc != 0:
        raise MemoryError("attention: could not allocate the per-thread scratch buffers")
    return out


include "_threads.pxi"
