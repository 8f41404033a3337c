# Wiring only: the GGUF Q8_0/Q4_0 kernels live in src_c/cpu/quant*.c; shapes and dtypes are checked
# in hipsched/ops/quant.py before anything here runs. float16/bfloat16 inputs: W is quantized from
# ~1 MB row chunks widened to float32 (exact), so its bytes are those of the float32 values; x of
# qmatmul is widened (it is small next to W) and the float32 result rounded once to x's dtype.
from libc.stdint cimport int64_t, uint8_t

import numpy as np
cimport numpy as cnp

from hipsched.gguf_blocks import row_bytes

cnp.import_array()

cdef extern from "quant.h":
    int HS_Q8_0, HS_Q4_0, HS_QUANT_OK, HS_QUANT_NONFINITE, HS_QUANT_RANGE
    int hs_quant_block_bytes(int qtype)
    int hs_quantize(int qtype, const float *x, int64_t nblocks, uint8_t *out) nogil
    void hs_dequantize(int qtype, const uint8_t *data, int64_t nblocks, float *out) nogil
    void hs_qmatmul(int qtype, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m,
                    float *out) nogil

QTYPES = {"q8_0": HS_Q8_0, "q4_0": HS_Q4_0}
BLOCK_BYTES = {name: hs_quant_block_bytes(code) for name, code in QTYPES.items()}


cdef inline const void *_ptr(cnp.ndarray a):
    return <const void *>cnp.PyArray_DATA(a)


cdef inline int _check_f32(cnp.ndarray a, str what) except -1:
    # The kernels read raw memory: a wrong dtype or layout would read garbage or out of bounds, so refuse
    # it (ops/quant.py converts; this only guards direct callers of the extension).
    if (cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(a)
            or not cnp.PyArray_ISNOTSWAPPED(a) or not cnp.PyArray_ISALIGNED(a)):
        raise TypeError(f"{what} must be a C-contiguous, aligned, native float32 array (validate through hipsched.ops)")
    return 0


cdef inline int _check_blocks(w, int64_t n, int64_t k) except -1:
    cdef cnp.ndarray data = w.data
    if n < 0 or k < 0 or k % 32:
        raise ValueError(f"quant: shape ({n}, {k}) must be non-negative with k a multiple of 32")
    if (cnp.PyArray_TYPE(data) != cnp.NPY_UINT8 or not cnp.PyArray_IS_C_CONTIGUOUS(data)
            or data.size != n * row_bytes(k, w.qtype)):
        raise ValueError(f"quant: block data does not hold a contiguous ({n}, {k}) {w.qtype} matrix")
    return 0


HALF = ("float16", "bfloat16")
# float32 bytes of one widened row chunk of a half W
QUANTIZE_CHUNK_BYTES = 1 << 20


def quantize(cnp.ndarray W, str qtype):
    """W float32, float16 or bfloat16 C-contiguous (n, k), k % 32 == 0 -> uint8 (n, k // 32 * block
    bytes) GGUF blocks. Raises ValueError (naming the first bad row) on NaN/inf, or when a block scale
    overflows fp16."""
    if W.dtype.name in HALF and W.ndim == 2 and W.flags.c_contiguous:
        rows = max(1, QUANTIZE_CHUNK_BYTES // (4 * max(1, W.shape[1])))
        parts = [quantize(np.ascontiguousarray(W[lo:lo + rows], dtype=np.float32), qtype)
                 for lo in range(0, W.shape[0], rows)]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts, axis=0) if parts else np.empty((0, row_bytes(W.shape[1], qtype)), np.uint8)
    cdef int qt = QTYPES[qtype]
    _check_f32(W, "quantize: W")
    if W.ndim != 2 or W.shape[1] % 32:
        raise ValueError(f"quantize: W must be 2-d (n, k) with k a multiple of 32, got shape {(<object>W).shape}")
    cdef int64_t n = W.shape[0], k = W.shape[1], nb = W.size // 32
    cdef cnp.ndarray out = np.empty((n, row_bytes(k, qtype)), dtype=np.uint8)
    cdef const float *x = <const float *>_ptr(W)
    cdef uint8_t *o = <uint8_t *>cnp.PyArray_DATA(out)
    cdef int err
    with nogil:
        err = hs_quantize(qt, x, nb, o)
    if err == HS_QUANT_NONFINITE:
        row = int(np.flatnonzero(~np.isfinite(W).all(axis=1))[0])
        raise ValueError(f"quantize: W has NaN or inf values (first in row {row}); quantize only finite values")
    if err == HS_QUANT_RANGE:
        limit = 127 * 65504.0 if qt == HS_Q8_0 else 8 * 65504.0
        # the kernel's test: the block scale amax / 127 (q8_0) or amax / 8 (q4_0), in float32, rounds to
        # inf in fp16 (values a little over `limit` still round down to 65504 and quantize fine)
        with np.errstate(over="ignore"):
            scales = np.abs(W).max(axis=1) / np.float32(127 if qt == HS_Q8_0 else 8)
            row = int(np.flatnonzero(np.isinf(scales.astype(np.float16)))[0]) if n else 0
        raise ValueError(f"quantize: |W| reaches {float(np.abs(W).max()):g} (row {row}); {qtype} block scales are fp16, "
                         f"so values must stay below about {limit:g} in magnitude")
    return out


def dequantize(w):
    """QuantizedTensor (n, k) -> float32 (n, k)."""
    cdef cnp.ndarray data = w.data
    cdef int qt = QTYPES[w.qtype]
    cdef int64_t n = w.shape[0], k = w.shape[1]
    _check_blocks(w, n, k)
    cdef cnp.ndarray out = np.empty((n, k), dtype=np.float32)
    cdef const uint8_t *d = <const uint8_t *>_ptr(data)
    cdef float *o = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_dequantize(qt, d, (n * k) // 32, o)
    return out


def qmatmul(w, cnp.ndarray x):
    """QuantizedTensor (n, k) @ C-contiguous x (k,) or (k, m) -> (n,) or (n, m) in x's dtype (float32,
    float16 or bfloat16; accumulated in float32)."""
    if x.dtype.name in HALF:
        y = qmatmul(w, np.ascontiguousarray(x, dtype=np.float32))
        with np.errstate(over="ignore"):  # float16 overflow to inf is the format's answer, not a fault
            return y.astype(x.dtype)
    cdef cnp.ndarray data = w.data
    cdef int qt = QTYPES[w.qtype]
    cdef int64_t n = w.shape[0], k = w.shape[1], m
    cdef cnp.ndarray xt, out
    _check_blocks(w, n, k)
    _check_f32(x, "qmatmul: x")
    if x.ndim not in (1, 2) or x.shape[0] != k:
        raise ValueError(f"qmatmul: x must be ({k},) or ({k}, m) for w of shape ({n}, {k}), got {(<object>x).shape}")
    if x.ndim == 1:
        m = 1
        xt = x
        out = np.zeros(n, dtype=np.float32)
    else:
        m = x.shape[1]
        # Columns contiguous, so every weight block meets each column's 32 values in one cache line pair.
        xt = np.ascontiguousarray(x.T) if m > 1 else x
        out = np.zeros((n, m), dtype=np.float32)
    cdef const uint8_t *d = <const uint8_t *>_ptr(data)
    cdef const float *xp = <const float *>_ptr(xt)
    cdef float *o = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_qmatmul(qt, d, n, k, xp, m, o)
    return out


include "_threads.pxi"
