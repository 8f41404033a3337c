# Wrapper of src_c/cpu/graph.c: takes a CSR triple (indptr and indices both int32 or both int64, weights
# float32) and float32 seeds (ops/graph.py converts and checks lengths), allocates the result, runs the
# kernel without the GIL and turns the graph-validation codes into ValueErrors.
cimport numpy as cnp
import numpy as np
from libc.stdint cimport int32_t, int64_t

cnp.import_array()

cdef extern from "graph.h" nogil:
    enum:
        HS_GRAPH_OK
        HS_GRAPH_NOMEM
        HS_GRAPH_BAD_INDPTR
        HS_GRAPH_BAD_INDEX
    int hs_csr_check_i32(const int32_t *indptr, const int32_t *indices, int64_t n, int64_t nnz, int64_t *bad)
    int hs_csr_check_i64(const int64_t *indptr, const int64_t *indices, int64_t n, int64_t nnz, int64_t *bad)
    int hs_spread_activation_i32(const int32_t *indptr, const int32_t *indices, const float *weights, int64_t n,
                                 int64_t nnz, const float *seeds, float *out, float decay, int64_t steps,
                                 float threshold, int64_t *bad)
    int hs_spread_activation_i64(const int64_t *indptr, const int64_t *indices, const float *weights, int64_t n,
                                 int64_t nnz, const float *seeds, float *out, float decay, int64_t steps,
                                 float threshold, int64_t *bad)

OP = "spread_activation"


cdef inline void *_vec(cnp.ndarray a, int typenum, str name) except NULL:
    # The kernel reads raw memory: a wrong dtype, layout or rank here would read out of bounds, so refuse
    # it (ops/graph.py converts; this only guards direct callers of the extension).
    if (cnp.PyArray_TYPE(a) != typenum or not cnp.PyArray_IS_C_CONTIGUOUS(a) or a.ndim != 1
            or not cnp.PyArray_ISNOTSWAPPED(a) or not cnp.PyArray_ISALIGNED(a)):
        want = {cnp.NPY_FLOAT32: "float32", cnp.NPY_INT32: "int32 (as indptr)", cnp.NPY_INT64: "int64"}[typenum]
        raise TypeError(f"{OP}: {name} must be a 1-d contiguous {want} array (validate through hipsched.ops)")
    return cnp.PyArray_DATA(a)


cdef int _index_type(cnp.ndarray indptr, cnp.ndarray indices) except -1:
    cdef int t = cnp.PyArray_TYPE(indptr)
    if t != cnp.NPY_INT32 and t != cnp.NPY_INT64:
        t = cnp.NPY_INT64
    _vec(indptr, t, "indptr")
    _vec(indices, t, "indices")
    if indptr.shape[0] < 1:
        raise ValueError(f"{OP}: indptr must hold n + 1 >= 1 offsets, got an empty array")
    return t


cdef _raise_for(int rc, int64_t bad, cnp.ndarray indptr, cnp.ndarray indices):
    cdef int64_t n = indptr.shape[0] - 1, nnz = indices.shape[0]
    if rc == HS_GRAPH_OK:
        return
    if rc == HS_GRAPH_BAD_INDPTR:
        raise ValueError(f"{OP}: indptr is not a valid CSR row pointer at position {bad} (value {indptr[bad]}): "
                         f"it must start at 0, never decrease, and end at nnz = {nnz}")
    if rc == HS_GRAPH_BAD_INDEX:
        raise ValueError(f"{OP}: indices[{bad}] = {indices[bad]} is out of range for a graph of {n} nodes "
                         f"(valid: 0 .. {n - 1})")
    if rc == HS_GRAPH_NOMEM:
        raise MemoryError(f"{OP}: could not allocate the per-thread accumulators ({n} nodes)")


def check_csr(cnp.ndarray indptr, cnp.ndarray indices):
    """ValueError unless indptr starts at 0, never decreases, ends at len(indices), and every index is
    in [0, len(indptr) - 1). One parallel streaming pass, without the GIL."""
    cdef int t = _index_type(indptr, indices)
    cdef void *pp = cnp.PyArray_DATA(indptr)
    cdef void *pi = cnp.PyArray_DATA(indices)
    cdef int64_t n = indptr.shape[0] - 1, nnz = indices.shape[0], bad = 0
    cdef int rc
    with nogil:
        if t == cnp.NPY_INT64:
            rc = hs_csr_check_i64(<int64_t *>pp, <int64_t *>pi, n, nnz, &bad)
        else:
            rc = hs_csr_check_i32(<int32_t *>pp, <int32_t *>pi, n, nnz, &bad)
    _raise_for(rc, bad, indptr, indices)


def spread_activation(cnp.ndarray indptr, cnp.ndarray indices, cnp.ndarray weights, cnp.ndarray seeds,
                      decay=0.5, steps=1, threshold=0.0):
    """Activations after `steps` steps of a[j] += decay * sum_i w_ij a[i], clamp [0, 1], threshold."""
    cdef int t = _index_type(indptr, indices)
    cdef void *pp = cnp.PyArray_DATA(indptr)
    cdef void *pi = cnp.PyArray_DATA(indices)
    cdef float *pw = <float *>_vec(weights, cnp.NPY_FLOAT32, "weights")
    cdef float *ps = <float *>_vec(seeds, cnp.NPY_FLOAT32, "seeds")
    cdef int64_t n = indptr.shape[0] - 1, nnz = indices.shape[0], bad = 0
    if weights.shape[0] != nnz:
        raise ValueError(f"{OP}: shapes do not match: indices ({nnz},) vs weights ({weights.shape[0]},)")
    if seeds.shape[0] != n:
        raise ValueError(f"{OP}: shapes do not match: seeds ({seeds.shape[0]},) vs the graph's {n} nodes")
    cdef float d = <float>float(decay), th = <float>float(threshold)
    cdef int64_t st = steps
    if st < 0:
        raise ValueError(f"{OP}: steps must be >= 0, got {steps}")
    out = np.empty(n, dtype=np.float32)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    cdef int rc
    with nogil:
        if t == cnp.NPY_INT64:
            rc = hs_spread_activation_i64(<int64_t *>pp, <int64_t *>pi, pw, n, nnz, ps, po, d, st, th, &bad)
        else:
            rc = hs_spread_activation_i32(<int32_t *>pp, <int32_t *>pi, pw, n, nnz, ps, po, d, st, th, &bad)
    _raise_for(rc, bad, indptr, indices)
    return out


include "_threads.pxi"
