/* Public spreading-activation functions (graph.h): the index-type-independent helpers (scratch cache,
 * finishing pass), then graph.inc instantiated for int32 and int64 CSR arrays. */
#include <stdlib.h>
#include <string.h>
#include "cpu_features.h"
#include "graph.h"

/* Least edges worth a thread (~0.2 ms of scattering): a parallel region costs microseconds. */
#define HS_GRAPH_GRAIN (1LL << 18)
#define HS_GRAPH_PART_EDGES (1LL << 16)  /* edges per work item of a step (~0.1 ms on one core) */
#define HS_GRAPH_MAX_PARTS 65536
#define HS_GRAPH_CHECK_PART (1LL << 20)  /* indices per work item of the validation pass */
#ifndef GRAPH_PREFETCH
#define GRAPH_PREFETCH 24        /* edges between a target's prefetch and its update */
#endif
#define HS_GRAPH_CHECK_CHUNK 4096  /* indices checked branch-free before looking for the culprit */
#define HS_GRAPH_FINISH_BLOCK 1024  /* activations summed over the thread accumulators at a time */

/* The accumulators (n floats per thread) are kept between calls, all zero: a fresh 8 MB buffer costs
 * page faults on every call, about a tenth of a one-step scatter over 16M edges. One call at a time
 * holds the cached buffer (others allocate their own); buffers over HS_GRAPH_CACHE_MAX are not kept. */
#define HS_GRAPH_CACHE_MAX ((size_t)128 << 20)
static float *graph_cache;
static size_t graph_cache_len;
static int graph_cache_busy;

/* Zeroed scratch of `len` floats; *cached tells graph_acc_put what to do with it. */
static float *graph_acc_get(size_t len, int *cached) {
    *cached = 0;
    if (__atomic_exchange_n(&graph_cache_busy, 1, __ATOMIC_ACQUIRE)) return calloc(len, sizeof(float));
    if (graph_cache_len < len) {
        free(graph_cache);
        graph_cache = len * sizeof(float) <= HS_GRAPH_CACHE_MAX ? calloc(len, sizeof(float)) : NULL;
        graph_cache_len = graph_cache ? len : 0;
    }
    if (!graph_cache) {
        __atomic_store_n(&graph_cache_busy, 0, __ATOMIC_RELEASE);
        return calloc(len, sizeof(float));
    }
    *cached = 1;
    return graph_cache;
}

/* Give the scratch back; `dirty` when a failed step left sums in it (the finish pass zeroes them). */
static void graph_acc_put(float *acc, size_t len, int cached, int dirty) {
    if (!cached) { free(acc); return; }
    if (dirty) memset(acc, 0, len * sizeof(float));
    __atomic_store_n(&graph_cache_busy, 0, __ATOMIC_RELEASE);
}

/* dst[j] = rule(a[j] + decay * sum_t acc[t][j]) for this thread's share of j (inside a parallel region),
 * zeroing the accumulators behind it for the next step or call. The comparisons keep NaN (NaN < 0 and
 * NaN > 1 are false), as np.clip does. */
static void graph_finish(const float *a, float *acc, int nt, int64_t n, float decay, float threshold,
                         float *dst) {
    const int64_t blocks = (n + HS_GRAPH_FINISH_BLOCK - 1) / HS_GRAPH_FINISH_BLOCK;
    #pragma omp for schedule(dynamic, 16)
    for (int64_t blk = 0; blk < blocks; blk++) {
        float sum[HS_GRAPH_FINISH_BLOCK];
        const int64_t j0 = blk * HS_GRAPH_FINISH_BLOCK;
        const int64_t len = n - j0 < HS_GRAPH_FINISH_BLOCK ? n - j0 : HS_GRAPH_FINISH_BLOCK;
        float *a0 = acc + j0;
        memcpy(sum, a0, sizeof(float) * (size_t)len);
        memset(a0, 0, sizeof(float) * (size_t)len);
        for (int t = 1; t < nt; t++) {
            float *at = acc + (size_t)t * (size_t)n + j0;
            for (int64_t j = 0; j < len; j++) sum[j] += at[j];
            memset(at, 0, sizeof(float) * (size_t)len);
        }
        for (int64_t j = 0; j < len; j++) {
            float x = a[j0 + j] + decay * sum[j];
            x = x < 0.0f ? 0.0f : x;
            x = x > 1.0f ? 1.0f : x;
            dst[j0 + j] = x < threshold ? 0.0f : x;
        }
    }
}

#define GRAPH_IDX int32_t
#define GRAPH_UIDX uint32_t
#define GRAPH_IDX_MAX INT32_MAX
#define GRAPH_FN(name) name##_i32
#include "graph.inc"
#undef GRAPH_IDX
#undef GRAPH_UIDX
#undef GRAPH_IDX_MAX
#undef GRAPH_FN

#define GRAPH_IDX int64_t
#define GRAPH_UIDX uint64_t
#define GRAPH_IDX_MAX INT64_MAX
#define GRAPH_FN(name) name##_i64
#include "graph.inc"
#undef GRAPH_IDX
#undef GRAPH_UIDX
#undef GRAPH_IDX_MAX
#undef GRAPH_FN
