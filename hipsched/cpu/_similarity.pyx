# Wrappers of src_c/cpu/similarity*.c: take validated C-contiguous arrays (ops/similarity.py and
# ops/linalg.py check shapes and dtypes), allocate results, run kernels without the GIL.
# Few queries: one fused pass over the targets (dots and norms together, memory-bound). Many queries:
# BLAS (np.matmul) on normalised queries, then the target norms applied while transposing, in C.
# Targets may be float32, float16 or bfloat16: the fused pass reads half targets as they are (half the
# bytes); the BLAS path widens one cache-sized block of them at a time. Queries are widened to float32
# (exact, and they are few), so the scores are the float32 computation on the given values.
cimport numpy as cnp
import numpy as np
from libc.stdint cimport int64_t, uint16_t

from hipsched.cpu._carray cimport f32_ptr, float_ptr, HS_F32, HS_BF16

cnp.import_array()

cdef extern from "similarity.h" nogil:
    int hs_cosine_f32(const float *q, int64_t m, const float *T, int64_t n, int64_t d, float *out)
    int64_t hs_inv_norms_f32(const float *T, int64_t n, int64_t d, float *inv)
    void hs_transpose_scale_f32(const float *src, int64_t n, int64_t m, const float *s, float *dst)
    int hs_cosine_f16(const float *q, int64_t m, const uint16_t *T, int64_t n, int64_t d, float *out)
    int hs_cosine_bf16(const float *q, int64_t m, const uint16_t *T, int64_t n, int64_t d, float *out)
    void hs_widen_f16(const uint16_t *src, int64_t count, float *dst)
    void hs_widen_bf16(const uint16_t *src, int64_t count, float *dst)
    void hs_narrow_f16(const float *src, int64_t count, uint16_t *dst)
    void hs_narrow_bf16(const float *src, int64_t count, uint16_t *dst)
    int hs_topk_f32(const float *scores, int64_t m, int64_t n, int64_t k, int64_t *idx, float *val)
    int hs_matmul_bf16(const uint16_t *a, const uint16_t *b, int64_t m, int64_t k, int64_t n, uint16_t *c)

# Up to this many queries the fused kernel re-reads each target row from L1 per query; beyond it a
# BLAS product reuses targets across queries better.
FUSED_MAX_QUERIES = 12
# Scores held at once by top_k (per block of queries), bytes.
TOPK_BLOCK_BYTES = 32 << 20
# float32 bytes of one widened block of a half corpus on the BLAS path: large enough for BLAS to run
# at speed, small enough to stay in L2/L3 between its widening and its product.
HALF_BLOCK_BYTES = 2 << 20


cdef as_queries(q):
    """Queries as float32: half values widen exactly, and they are few next to the corpus."""
    if q.dtype.name in ("float16", "bfloat16"):
        return np.ascontiguousarray(q, dtype=np.float32)
    return q  # anything else must already be float32 (f32_ptr refuses the rest)


cdef cosine_half_into(Q, T, out, object t_inv):
    """cosine_into for a float16/bfloat16 T: one fused pass reading T as half for few queries; for
    many, BLAS on one widened block of T rows at a time (never the whole corpus widened)."""
    cdef int code
    cdef const uint16_t *pt = <const uint16_t *>float_ptr(T, "T", &code)
    cdef float *pq = f32_ptr(Q, "q")
    cdef float *po = f32_ptr(out, "out")
    cdef int64_t m = Q.shape[0], n = T.shape[0], d = T.shape[1], lo, hi, rows
    cdef int rc
    cdef bint bf = code == HS_BF16
    if code == HS_F32:
        raise TypeError("T: expected float16 or bfloat16")
    if m == 0 or n == 0:
        return t_inv
    if m <= FUSED_MAX_QUERIES or d == 0:
        with nogil:
            rc = hs_cosine_bf16(pq, m, pt, n, d, po) if bf else hs_cosine_f16(pq, m, pt, n, d, po)
        if rc != 0:
            raise MemoryError("cosine_similarity: out of memory")
        return t_inv
    rows = max(16, HALF_BLOCK_BYTES // (4 * d))
    block = np.empty((min(rows, n), d), np.float32)
    part = np.empty((m, min(rows, n)), np.float32)
    cdef float *pb = <float *>cnp.PyArray_DATA(block)
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        with nogil:
            if bf:
                hs_widen_bf16(pt + lo * d, (hi - lo) * d, pb)
            else:
                hs_widen_f16(pt + lo * d, (hi - lo) * d, pb)
        if hi - lo == block.shape[0]:
            cosine_into(Q, block, part, None)
            out[:, lo:hi] = part
        else:  # the last, shorter block
            tail = np.empty((m, hi - lo), np.float32)
            cosine_into(Q, block[:hi - lo], tail, None)
            out[:, lo:hi] = tail
    return t_inv


cdef inv_norms(T):
    """Inverse row norms, or None when some row's norm is too small or large for float dots (see
    similarity.h): the caller then takes the fused kernel, which scores such rows in double."""
    cdef float *pt = f32_ptr(T, "T")
    cdef int64_t n = T.shape[0], d = T.shape[1], extreme
    inv = np.empty(n, np.float32)
    cdef float *pi = <float *>cnp.PyArray_DATA(inv)
    with nogil:
        extreme = hs_inv_norms_f32(pt, n, d, pi)
    return None if extreme else inv


cdef cosine_into(Q, T, out, t_inv):
    """out (m, n) = cos(Q (m, d), T (n, d)). t_inv: T's inverse norms, None (not computed yet) or False
    (T has extreme rows: fused kernel only). Returns t_inv so top_k's query blocks share it."""
    if T.dtype != np.float32:
        if Q.ndim != 2 or T.ndim != 2 or Q.shape[1] != T.shape[1] or out.shape != (Q.shape[0], T.shape[0]):
            raise ValueError(f"cosine_similarity: q {Q.shape} and T {T.shape} must be (m, d) and (n, d)")
        return cosine_half_into(Q, T, out, t_inv)
    cdef float *pq = f32_ptr(Q, "q")
    cdef float *pt = f32_ptr(T, "T")
    cdef float *po = f32_ptr(out, "out")
    if Q.ndim != 2 or T.ndim != 2 or Q.shape[1] != T.shape[1] or out.shape != (Q.shape[0], T.shape[0]):
        # the kernels trust these shapes with raw pointers (hipsched.ops reports them properly)
        raise ValueError(f"cosine_similarity: q {Q.shape} and T {T.shape} must be (m, d) and (n, d)")
    cdef int64_t m = Q.shape[0], n = T.shape[0], d = T.shape[1]
    cdef int rc
    if m == 0 or n == 0:
        return t_inv
    q_inv = None
    if m > FUSED_MAX_QUERIES:
        if t_inv is None:
            t_inv = inv_norms(T)
            if t_inv is None:
                t_inv = False  # remembered across top_k's blocks: T needs the fused kernel
        if t_inv is not False:
            q_inv = inv_norms(Q)
    if q_inv is None:
        with nogil:
            rc = hs_cosine_f32(pq, m, pt, n, d, po)
        if rc != 0:
            raise MemoryError("cosine_similarity: out of memory")
        return t_inv
    # T @ Qn.T, (n, m): OpenBLAS runs this shape about twice as fast as Qn @ T.T
    prod = np.matmul(T, (Q * q_inv[:, None]).T)
    cdef float *pp = <float *>cnp.PyArray_DATA(prod)
    cdef float *ps = <float *>cnp.PyArray_DATA(t_inv)
    with nogil:
        hs_transpose_scale_f32(pp, n, m, ps, po)
    return t_inv


def cosine_similarity(q, T):
    """q (d,) or (m, d) against T (n, d) -> (n,) or (m, n) float32. A zero vector scores 0 against any
    finite vector; NaN or inf in either vector gives NaN. q and T each float32, float16 or bfloat16."""
    Q = as_queries(q.reshape(1, -1) if q.ndim == 1 else q)
    out = np.empty((Q.shape[0], T.shape[0]), np.float32)
    cosine_into(Q, T, out, None)
    return out[0] if q.ndim == 1 else out


def top_k(q, T, k):
    """The min(k, n) rows of T most similar to q by cosine -> (indices int64, scores float32), best
    first, ties to the lower index, NaN scores last; q (m, d) gives (m, k') arrays."""
    Q = as_queries(q.reshape(1, -1) if q.ndim == 1 else q)
    if int(k) < 1:
        raise ValueError(f"top_k: k must be >= 1, got {k}")
    cdef int64_t m = Q.shape[0], n = T.shape[0], kk = min(int(k), T.shape[0]), b0, b1, block
    idx = np.empty((m, kk), np.int64)
    val = np.empty((m, kk), np.float32)
    cdef int64_t *pi = <int64_t *>cnp.PyArray_DATA(idx)
    cdef float *pv = <float *>cnp.PyArray_DATA(val)
    cdef float *ps
    cdef int rc
    if m and kk:
        block = max(1, min(m, TOPK_BLOCK_BYTES // (4 * n)))
        scores = np.empty((block, n), np.float32)
        t_inv = None
        for b0 in range(0, m, block):
            b1 = min(m, b0 + block)
            t_inv = cosine_into(Q[b0:b1], T, scores[:b1 - b0], t_inv)
            ps = <float *>cnp.PyArray_DATA(scores)
            with nogil:
                rc = hs_topk_f32(ps, b1 - b0, n, kk, pi + b0 * kk, pv + b0 * kk)
            if rc != 0:
                raise MemoryError("top_k: out of memory")
    if q.ndim == 1:
        return idx[0], val[0]
    return idx, val


# float32 bytes of one row panel of a half matmul's a (and of its result). Each BLAS call packs all
# of b again, so a panel must have enough rows to amortise that: 1 MB panels (256 rows at k = 1024)
# ran 1024^3 in 82 ms against 55 ms for one panel (float32 BLAS: 45 ms); 16 MB bounds the extra memory.
MATMUL_PANEL_BYTES = 16 << 20


cdef widen(x):
    """x (float16/bfloat16, C-contiguous) widened to a new float32 array of its shape (exact)."""
    cdef int code
    cdef const uint16_t *px = <const uint16_t *>float_ptr(x, "x", &code)
    out = np.empty(x.shape, np.float32)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    cdef int64_t count = x.size
    with nogil:
        if code == HS_BF16:
            hs_widen_bf16(px, count, po)
        else:
            hs_widen_f16(px, count, po)
    return out


cdef narrow_into(src, dst):
    """dst (half, C-contiguous) = src (float32, same size) rounded to dst's dtype."""
    cdef int code
    cdef uint16_t *pd = <uint16_t *>float_ptr(dst, "out", &code)
    cdef float *ps = f32_ptr(src, "src")
    cdef int64_t count = src.size
    if dst.size != count:
        raise ValueError("narrow: sizes differ")
    with nogil:
        if code == HS_BF16:
            hs_narrow_bf16(ps, count, pd)
        else:
            hs_narrow_f16(ps, count, pd)


# Least columns of b for the vdpbf16ps kernel: its register tiles are 32 columns wide, so a narrower b
# (a vector: 1) computes mostly padding, and the widening path's BLAS (gemv) is the better one.
BF16_DOT_MIN_COLUMNS = 16


cdef matmul_bf16_dot(a, b):
    """a (m, k) @ b (k, n), both bfloat16, on vdpbf16ps (similarity_bf16dot.c), or None where the CPU
    or the requested level has no AVX512_BF16 (the caller widens)."""
    cdef int code
    cdef const uint16_t *pa = <const uint16_t *>float_ptr(a, "a", &code)
    cdef const uint16_t *pb = <const uint16_t *>float_ptr(b, "b", &code)
    cdef int64_t m = a.shape[0], k = a.shape[1], n = b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"matmul: a {a.shape} and b {b.shape} do not chain")
    out = np.empty((m, n), a.dtype)
    cdef uint16_t *po = <uint16_t *>float_ptr(out, "out", &code)
    cdef int rc
    with nogil:
        rc = hs_matmul_bf16(pa, pb, m, k, n, po)
    if rc < 0:
        raise MemoryError("matmul: out of memory for the packed bfloat16 operands")
    return out if rc == 0 else None


def matmul(a, b):
    """a @ b through NumPy's BLAS. float32 in, float32 out; float16/bfloat16 (both the same: ops
    promotes mixes) in, the same dtype out, accumulated in float32: b is widened once, a and the result
    one row panel at a time, so besides b only a float32 panel of at most 16 MB is ever held. A bfloat16
    matrix a times a matrix b of BF16_DOT_MIN_COLUMNS or more runs on vdpbf16ps instead where the CPU has AVX512_BF16
    (cpu_features()["bf16_dot"]): the same float32 sum of exact products in another order, with
    bfloat16 denormals counted as zero (similarity.h, hs_matmul_bf16)."""
    if a.dtype == np.float32 and b.dtype == np.float32:
        return np.matmul(a, b)
    if a.dtype != b.dtype or a.dtype.name not in ("float16", "bfloat16"):
        raise TypeError(f"matmul: a ({a.dtype}) and b ({b.dtype}) must both be float32, float16 or bfloat16")
    if a.dtype.name == "bfloat16" and a.ndim == 2 and b.ndim == 2 and b.shape[1] >= BF16_DOT_MIN_COLUMNS:
        r = matmul_bf16_dot(a, b)
        if r is not None:
            return r
    b32 = widen(b)
    if a.ndim != 2 or b.ndim > 2:  # batched or vector operands: whole operands (np.matmul's broadcasting rules)
        r = np.asarray(np.matmul(widen(a), b32), order="C")  # 1-d @ 1-d gives a scalar: as 0-d
        out = np.empty(r.shape, a.dtype)
        narrow_into(r, out)
        return out[()] if out.ndim == 0 else out
    cdef int64_t m = a.shape[0], k = a.shape[1], rows, lo, hi
    ncols = b.shape[1] if b.ndim == 2 else 0
    out = np.empty((m, ncols) if b.ndim == 2 else (m,), a.dtype)
    rows = max(1, MATMUL_PANEL_BYTES // (4 * max(1, k, ncols)))
    for lo in range(0, m, rows):
        hi = min(m, lo + rows)
        narrow_into(np.matmul(widen(a[lo:hi]), b32), out[lo:hi])
    return out


include "_threads.pxi"
