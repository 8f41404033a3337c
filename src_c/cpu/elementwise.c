/* Public elementwise functions: pick the variant once (hs_cpu_level) and split the work over threads.
 * Grains are the least work worth a thread: a parallel region costs a few microseconds. Work items are
 * handed out dynamically, so a thread the OS preempts (2 shared cores) does not hold up the other. */
#include <stdlib.h>
#include "cpu_features.h"
#include "elementwise.h"

#define HS_BOTH(ret, name, args) ret name##_avx2 args; ret name##_scalar args;
HS_BOTH(void, hs_add_range, (const float *a, const float *b, float *out, int64_t n))
HS_BOTH(void, hs_add_scalar_range, (const float *a, float b, float *out, int64_t n))
HS_BOTH(void, hs_scale_range, (const float *x, float alpha, float *out, int64_t n))
HS_BOTH(void, hs_exp_range, (const float *x, float *out, int64_t n))
HS_BOTH(void, hs_softmax_row, (const float *x, float *y, int64_t len))
HS_BOTH(void, hs_softmax_cols, (const float *x, float *y, int64_t len, int64_t inner, int64_t c0, int64_t c1))
#define HS_PICK(name) (hs_cpu_level() == HS_LEVEL_AVX2 ? name##_avx2 : name##_scalar)

#define HS_BLOCK 16384            /* elements per work item of add/scale/exp (64 KiB) */
#define HS_GRAIN (1 << 18)        /* below ~1 MiB a second thread costs more than it saves */

/* Run BODY (over [lo, hi)) across [0, n) in HS_BLOCK pieces on the threads `grain` allows. A call worth
 * one thread skips the OpenMP runtime altogether (it costs about a microsecond even then). */
#define HS_FOR_BLOCKS(n, grain, BODY)                                                      \
    do {                                                                                   \
        int64_t blocks_ = ((n) + HS_BLOCK - 1) / HS_BLOCK;                                 \
        int threads_ = hs_threads_for((n), (grain));                                       \
        if (threads_ == 1) {                                                               \
            int64_t lo = 0, hi = (n);                                                      \
            BODY;                                                                          \
            break;                                                                         \
        }                                                                                  \
        _Pragma("omp parallel for schedule(dynamic, 4) num_threads(threads_)")             \
        for (int64_t blk = 0; blk < blocks_; blk++) {                                      \
            int64_t lo = blk * HS_BLOCK, hi = lo + HS_BLOCK < (n) ? lo + HS_BLOCK : (n);   \
            BODY;                                                                          \
        }                                                                                  \
    } while (0)

void hs_add_f32(const float *a, const float *b, float *out, int64_t n, int64_t nb) {
    if (n <= 0) return;
    if (nb == n) {
        void (*f)(const float *, const float *, float *, int64_t) = HS_PICK(hs_add_range);
        HS_FOR_BLOCKS(n, HS_GRAIN, f(a + lo, b + lo, out + lo, hi - lo));
    } else if (nb == 1) {
        void (*f)(const float *, float, float *, int64_t) = HS_PICK(hs_add_scalar_range);
        HS_FOR_BLOCKS(n, HS_GRAIN, f(a + lo, b[0], out + lo, hi - lo));
    } else {  /* bias: one pass of b per row of nb elements */
        void (*f)(const float *, const float *, float *, int64_t) = HS_PICK(hs_add_range);
        int64_t rows = n / nb;
        int nt = hs_threads_for(n, HS_GRAIN);
        #pragma omp parallel for schedule(dynamic, 64) num_threads(nt) if (nt > 1)
        for (int64_t r = 0; r < rows; r++) f(a + r * nb, b, out + r * nb, nb);
    }
}

void hs_scale_f32(const float *x, float alpha, float *out, int64_t n) {
    if (n <= 0) return;
    void (*f)(const float *, float, float *, int64_t) = HS_PICK(hs_scale_range);
    HS_FOR_BLOCKS(n, HS_GRAIN, f(x + lo, alpha, out + lo, hi - lo));
}

void hs_exp_f32(const float *x, float *out, int64_t n) {
    if (n <= 0) return;
    void (*f)(const float *, float *, int64_t) = HS_PICK(hs_exp_range);
    HS_FOR_BLOCKS(n, HS_GRAIN / 4, f(x + lo, out + lo, hi - lo));
}

void hs_softmax_f32(const float *x, float *out, int64_t outer, int64_t len, int64_t inner) {
    int64_t n = outer * len * inner;
    if (n <= 0) return;
    int nt = hs_threads_for(n, HS_GRAIN / 4);  /* exp makes softmax compute-heavier than add */
    if (inner == 1) {
        void (*f)(const float *, float *, int64_t) = HS_PICK(hs_softmax_row);
        #pragma omp parallel for schedule(dynamic, 16) num_threads(nt) if (nt > 1)
        for (int64_t o = 0; o < outer; o++) f(x + o * len, out + o * len, len);
    } else {
        void (*f)(const float *, float *, int64_t, int64_t, int64_t, int64_t) = HS_PICK(hs_softmax_cols);
        int64_t cblocks = (inner + HS_SOFTMAX_COLS - 1) / HS_SOFTMAX_COLS, items = outer * cblocks;
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t o = it / cblocks, c0 = (it % cblocks) * HS_SOFTMAX_COLS;
            int64_t c1 = c0 + HS_SOFTMAX_COLS < inner ? c0 + HS_SOFTMAX_COLS : inner;
            f(x + o * len * inner, out + o * len * inner, len, inner, c0, c1);
        }
    }
}
