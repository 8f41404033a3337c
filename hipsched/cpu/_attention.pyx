# Wrapper of src_c/cpu/attention.c: takes validated C-contiguous (batch, heads, seq, head_dim) arrays,
# all float32, all float16 or all bfloat16 (ops/attention.py checks shapes and promotes mixes), k and v
# with heads_kv heads dividing q's, kv_len None or int64 (batch,), causal 0/False, 1/True/"upper_left" or
# 2/"lower_right"; allocates the result in that dtype, runs the kernel without the GIL.
cimport numpy as cnp
import numpy as np
from libc.math cimport sqrt
from libc.stdint cimport int64_t

from hipsched.cpu._carray cimport float_ptr

cnp.import_array()

cdef extern from "attention.h" nogil:
    int hs_attention(const void *q, const void *k, const void *v, void *out, int dtype, int64_t batch,
                     int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                     float scale, int causal, const int64_t *kv_len)


cdef inline void *_ptr_4d(cnp.ndarray a, str name, int *code) except NULL:
    # The kernel reads raw memory: a wrong dtype, layout or rank here would read out of bounds, so refuse
    # it (ops/attention.py converts; this only guards direct callers of the extension).
    if a.ndim != 4:
        raise TypeError(f"attention: {name} must be a 4-d C-contiguous float32/float16/bfloat16 array "
                        f"(validate through hipsched.ops)")
    return float_ptr(a, f"attention: {name}", code)


_CAUSAL = {"upper_left": 1, "lower_right": 2}


def attention_call(q, k, v, kv_len=None, causal=False, scale=None):
    """The op spec's entry (backends/cpu.py calls f(*call.args, **call.params)): kv_len travels among the
    arrays, so that a split call slices it with q, k and v."""
    return attention(q, k, v, causal, scale, kv_len)


def attention(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, causal=False, scale=None, kv_len=None):
    """softmax(scale * q k^T [causal mask]) v per (batch, head); scale None means 1/sqrt(head_dim)."""
    cdef int cq, ck, cv
    cdef void *pq = _ptr_4d(q, "q", &cq)
    cdef void *pk = _ptr_4d(k, "k", &ck)
    cdef void *pv = _ptr_4d(v, "v", &cv)
    if cq != ck or cq != cv:
        raise TypeError(f"attention: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    qs, ks, vs = (<object>q).shape, (<object>k).shape, (<object>v).shape
    if (qs[0], qs[3]) != (ks[0], ks[3]) or ks != vs or (ks[1] == 0 and qs[1] != 0) or (ks[1] and qs[1] % ks[1]):
        raise ValueError(f"attention: shapes do not match: q {qs} vs k {ks} vs v {vs}")
    cdef int c
    if isinstance(causal, str):
        if causal not in _CAUSAL:
            raise ValueError(f"attention: causal must be False, True, 'upper_left' or 'lower_right', got {causal!r}")
        c = _CAUSAL[causal]
    else:
        c = int(causal)
        if c not in (0, 1, 2):
            raise ValueError(f"attention: causal code must be 0, 1 or 2, got {causal!r}")
    cdef cnp.ndarray lens
    cdef const int64_t *plen = NULL
    if kv_len is not None:
        lens = kv_len
        if lens.dtype != np.int64 or lens.ndim != 1 or lens.shape[0] != q.shape[0] or not lens.flags.c_contiguous:
            raise TypeError("attention: kv_len must be a C-contiguous int64 array of shape (batch,) "
                            "(validate through hipsched.ops)")
        plen = <const int64_t *>cnp.PyArray_DATA(lens)
    cdef int64_t b = q.shape[0], hq = q.shape[1], hkv = k.shape[1], sq = q.shape[2], sk = k.shape[2], d = q.shape[3]
    cdef float s = (1.0 / sqrt(<double>d) if d > 0 else 1.0) if scale is None else <float>float(scale)
    out = np.empty((q.shape[0], q.shape[1], sq, d), dtype=q.dtype)
    cdef void *po = cnp.PyArray_DATA(out)
    cdef int rc
    with nogil:
        rc = hs_attention(pq, pk, pv, po, cq, b, hq, hkv if hkv > 0 else 1, sq, sk, d, s, c, plen)
    if rc == -2:
        raise ValueError(f"attention: kv_len entries must be within [0, seq_k] = [0, {sk}]")
    if rc != 0:
        raise MemoryError("attention: could not allocate the per-thread scratch buffers")
    return out


include "_threads.pxi"
