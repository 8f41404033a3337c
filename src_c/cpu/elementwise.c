/* Public elementwise functions: pick the variant once (hs_cpu_level) and split the work over threads.
 * Grains are the least work worth a thread: a parallel region costs a few microseconds. */
#include <stdlib.h>
#include "cpu_features.h"
#include "elementwise.h"

#define HS_BOTH(ret, name, args) ret name##_avx2 args; ret name##_scalar args;
HS_BOTH(void, hs_add_range, (const float *a, const float *b, float *out, int64_t n, int stream))
HS_BOTH(void, hs_add_scalar_range, (const float *a, float b, float *out, int64_t n, int stream))
HS_BOTH(void, hs_scale_range, (const float *x, float alpha, float *out, int64_t n, int stream))
HS_BOTH(void, hs_exp_range, (const float *x, float *out, int64_t n))
HS_BOTH(void, hs_softmax_row, (const float *x, float *y, int64_t len))
HS_BOTH(void, hs_softmax_cols, (const float *x, float *y, int64_t len, int64_t inner, int64_t c0, int64_t c1))
#define HS_PICK(name) (hs_cpu_level() == HS_LEVEL_AVX2 ? name##_avx2 : name##_scalar)

#define HS_STREAM_BLOCK 16384    /* elements per work item of a streaming op (64 KiB) */
#define HS_STREAM_GRAIN (1 << 18) /* below ~1 MiB a second thread costs more than it saves */
#define HS_NT_MIN (1 << 22)       /* results from 16 MiB on bypass the cache (the L3 could not keep them) */

void hs_add_f32(const float *a, const float *b, float *out, int64_t n, int64_t nb) {
    if (n <= 0) return;
    int stream = n >= HS_NT_MIN;
    if (nb == n) {
        void (*f)(const float *, const float *, float *, int64_t, int) = HS_PICK(hs_add_range);
        int64_t blocks = (n + HS_STREAM_BLOCK - 1) / HS_STREAM_BLOCK;
        #pragma omp parallel for schedule(static) num_threads(hs_threads_for(n, HS_STREAM_GRAIN))
        for (int64_t blk = 0; blk < blocks; blk++) {
            int64_t lo = blk * HS_STREAM_BLOCK, hi = lo + HS_STREAM_BLOCK < n ? lo + HS_STREAM_BLOCK : n;
            f(a + lo, b + lo, out + lo, hi - lo, stream);
        }
    } else if (nb == 1) {
        void (*f)(const float *, float, float *, int64_t, int) = HS_PICK(hs_add_scalar_range);
        int64_t blocks = (n + HS_STREAM_BLOCK - 1) / HS_STREAM_BLOCK;
        #pragma omp parallel for schedule(static) num_threads(hs_threads_for(n, HS_STREAM_GRAIN))
        for (int64_t blk = 0; blk < blocks; blk++) {
            int64_t lo = blk * HS_STREAM_BLOCK, hi = lo + HS_STREAM_BLOCK < n ? lo + HS_STREAM_BLOCK : n;
            f(a + lo, b[0], out + lo, hi - lo, stream);
        }
    } else {  /* bias: one pass of b per row of nb elements */
        void (*f)(const float *, const float *, float *, int64_t, int) = HS_PICK(hs_add_range);
        int64_t rows = n / nb;
        #pragma omp parallel for schedule(static) num_threads(hs_threads_for(n, HS_STREAM_GRAIN))
        for (int64_t r = 0; r < rows; r++) f(a + r * nb, b, out + r * nb, nb, stream);
    }
}

void hs_scale_f32(const float *x, float alpha, float *out, int64_t n) {
    if (n <= 0) return;
    void (*f)(const float *, float, float *, int64_t, int) = HS_PICK(hs_scale_range);
    int64_t blocks = (n + HS_STREAM_BLOCK - 1) / HS_STREAM_BLOCK;
    #pragma omp parallel for schedule(static) num_threads(hs_threads_for(n, HS_STREAM_GRAIN))
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t lo = blk * HS_STREAM_BLOCK, hi = lo + HS_STREAM_BLOCK < n ? lo + HS_STREAM_BLOCK : n;
        f(x + lo, alpha, out + lo, hi - lo, n >= HS_NT_MIN);
    }
}

void hs_exp_f32(const float *x, float *out, int64_t n) {
    if (n <= 0) return;
    void (*f)(const float *, float *, int64_t) = HS_PICK(hs_exp_range);
    int64_t blocks = (n + HS_STREAM_BLOCK - 1) / HS_STREAM_BLOCK;
    #pragma omp parallel for schedule(static) num_threads(hs_threads_for(n, HS_STREAM_GRAIN / 4))
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t lo = blk * HS_STREAM_BLOCK, hi = lo + HS_STREAM_BLOCK < n ? lo + HS_STREAM_BLOCK : n;
        f(x + lo, out + lo, hi - lo);
    }
}

void hs_softmax_f32(const float *x, float *out, int64_t outer, int64_t len, int64_t inner) {
    int64_t n = outer * len * inner;
    if (n <= 0) return;
    int nt = hs_threads_for(n, HS_STREAM_GRAIN / 4);  /* exp makes softmax compute-heavier than add */
    if (inner == 1) {
        void (*f)(const float *, float *, int64_t) = HS_PICK(hs_softmax_row);
        #pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t o = 0; o < outer; o++) f(x + o * len, out + o * len, len);
    } else {
        void (*f)(const float *, float *, int64_t, int64_t, int64_t, int64_t) = HS_PICK(hs_softmax_cols);
        int64_t cblocks = (inner + HS_SOFTMAX_COLS - 1) / HS_SOFTMAX_COLS, items = outer * cblocks;
        #pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t it = 0; it < items; it++) {
            int64_t o = it / cblocks, c0 = (it % cblocks) * HS_SOFTMAX_COLS;
            int64_t c1 = c0 + HS_SOFTMAX_COLS < inner ? c0 + HS_SOFTMAX_COLS : inner;
            f(x + o * len * inner, out + o * len * inner, len, inner, c0, c1);
        }
    }
}
