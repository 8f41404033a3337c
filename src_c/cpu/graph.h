/* Spreading activation over a CSR graph (A[i, j] = weight of the edge i -> j, n x n), on contiguous
 * arrays: indptr (n + 1) and indices (nnz) both int32 or both int64, weights and activations float32.
 * Each step, from the previous activations a:
 *     a_new[j] = a[j] + decay * sum_i w_ij a[i];  clamp to [0, 1];  0 where a_new < threshold.
 * A valid graph: indptr starts at 0, never decreases and ends at nnz; every index is in [0, n).
 * Callers release the GIL. */
#ifndef HS_GRAPH_H
#define HS_GRAPH_H
#include <stdint.h>

enum {
    HS_GRAPH_OK = 0,
    HS_GRAPH_NOMEM = -1,        /* scratch could not be allocated */
    HS_GRAPH_BAD_INDPTR = -2,   /* *bad = the first offending position of indptr (n: it does not end at nnz) */
    HS_GRAPH_BAD_INDEX = -3,    /* *bad = a position of indices holding a value outside [0, n) */
};

/* 0 when indptr starts at 0, never decreases and ends at nnz, and every index lies in [0, n); else an
 * HS_GRAPH_BAD_* code with *bad set. A streaming pass over the graph, split over threads; run before
 * any backend sees the graph. */
int hs_csr_check_i32(const int32_t *indptr, const int32_t *indices, int64_t n, int64_t nnz, int64_t *bad);
int hs_csr_check_i64(const int64_t *indptr, const int64_t *indices, int64_t n, int64_t nnz, int64_t *bad);

/* out (n) = seeds after `steps` steps (steps == 0: a copy of seeds). The graph is checked again as the
 * first step reads it, so a bad graph is reported, never read out of bounds, even unvalidated.
 * Rows whose activation is exactly 0 add nothing, except through a NaN or infinite weight: 0 * w is NaN
 * there, as SciPy's A.T @ a gives (graph.inc, graph_push, says how the steps find such rows). */
int hs_spread_activation_i32(const int32_t *indptr, const int32_t *indices, const float *weights, int64_t n,
                             int64_t nnz, const float *seeds, float *out, float decay, int64_t steps,
                             float threshold, int64_t *bad);
int hs_spread_activation_i64(const int64_t *indptr, const int64_t *indices, const float *weights, int64_t n,
                             int64_t nnz, const float *seeds, float *out, float decay, int64_t steps,
                             float threshold, int64_t *bad);
#endif
