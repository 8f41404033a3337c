/* Public elementwise functions: pick the variant once (hs_cpu_level) and split the work over threads.
 * Grains are the least work worth a thread: a parallel region costs a few microseconds. Work items are
 * handed out dynamically, so a thread the OS preempts (2 shared cores) does not hold up the other. Results of
 * HS_NT_MIN floats and more are written with streaming stores (see elementwise.inc). */
#include <stdlib.h>
#include "cpu_features.h"
#include "elementwise.h"

#define HS_BOTH(ret, name, args) ret name##_avx2 args; ret name##_scalar args;
HS_BOTH(void, hs_add_range, (const float *a, const float *b, float *out, int64_t n, int stream))
HS_BOTH(void, hs_add_scalar_range, (const float *a, float b, float *out, int64_t n, int stream))
HS_BOTH(void, hs_scale_range, (const float *x, float alpha, float *out, int64_t n, int stream))
HS_BOTH(void, hs_exp_range, (const float *x, float *out, int64_t n))
HS_BOTH(void, hs_softmax_row, (const float *x, float *y, int64_t len, float *tmp))
HS_BOTH(void, hs_softmax_cols, (const float *x, float *y, int64_t len, int64_t inner, int64_t c0, int64_t c1))
#define HS_PICK(name) (hs_cpu_level() == HS_LEVEL_AVX2 ? name##_avx2 : name##_scalar)

#define HS_BLOCK 16384            /* elements per work item of a streaming op (64 KiB) */
#define HS_GRAIN (1 << 18)        /* below ~1 MiB a second thread costs more than it saves */
#define HS_NT_MIN (1 << 22)       /* results from 16 MiB on bypass the cache (the L3 could not keep them) */
#define HS_SOFTMAX_TMP_MAX 16384  /* longest row whose exponentials a thread keeps in a cached scratch */

/* Streamed stores are weakly ordered: each thread fences once after its last one. */
static inline void hs_stream_fence(int stream) {
#if defined(__x86_64__) || defined(__i386__)
    if (stream) __builtin_ia32_sfence();
#else
    (void)stream;
#endif
}

/* Run BODY(lo, hi) over [0, n) in HS_BLOCK pieces on the threads `grain` allows, then fence. A call
 * worth one thread skips the OpenMP runtime altogether (it costs about a microsecond even then). */
#define HS_FOR_BLOCKS(n, grain, stream, BODY)                                              \
    do {                                                                                   \
        int64_t blocks_ = ((n) + HS_BLOCK - 1) / HS_BLOCK;                                 \
        int threads_ = hs_threads_for((n), (grain));                                       \
        if (threads_ == 1) {                                                               \
            int64_t lo = 0, hi = (n);                                                      \
            BODY;                                                                          \
            hs_stream_fence(stream);                                                       \
            break;                                                                         \
        }                                                                                  \
        _Pragma("omp parallel num_threads(threads_)")                                      \
        {                                                                                  \
            _Pragma("omp for schedule(dynamic, 4) nowait")                                 \
            for (int64_t blk = 0; blk < blocks_; blk++) {                                  \
                int64_t lo = blk * HS_BLOCK, hi = lo + HS_BLOCK < (n) ? lo + HS_BLOCK : (n); \
                BODY;                                                                      \
            }                                                                              \
            hs_stream_fence(stream);                                                       \
        }                                                                                  \
    } while (0)

void hs_add_f32(const float *a, const float *b, float *out, int64_t n, int64_t nb) {
    if (n <= 0) return;
    int stream = n >= HS_NT_MIN;
    if (nb == n) {
        void (*f)(const float *, const float *, float *, int64_t, int) = HS_PICK(hs_add_range);
        HS_FOR_BLOCKS(n, HS_GRAIN, stream, f(a + lo, b + lo, out + lo, hi - lo, stream));
    } else if (nb == 1) {
        void (*f)(const float *, float, float *, int64_t, int) = HS_PICK(hs_add_scalar_range);
        HS_FOR_BLOCKS(n, HS_GRAIN, stream, f(a + lo, b[0], out + lo, hi - lo, stream));
    } else {  /* bias: one pass of b per row of nb elements */
        void (*f)(const float *, const float *, float *, int64_t, int) = HS_PICK(hs_add_range);
        int64_t rows = n / nb;
        #pragma omp parallel num_threads(hs_threads_for(n, HS_GRAIN))
        {
            #pragma omp for schedule(dynamic, 64) nowait
            for (int64_t r = 0; r < rows; r++) f(a + r * nb, b, out + r * nb, nb, stream);
            hs_stream_fence(stream);
        }
    }
}

void hs_scale_f32(const float *x, float alpha, float *out, int64_t n) {
    if (n <= 0) return;
    int stream = n >= HS_NT_MIN;
    void (*f)(const float *, float, float *, int64_t, int) = HS_PICK(hs_scale_range);
    HS_FOR_BLOCKS(n, HS_GRAIN, stream, f(x + lo, alpha, out + lo, hi - lo, stream));
}

void hs_exp_f32(const float *x, float *out, int64_t n) {
    if (n <= 0) return;
    void (*f)(const float *, float *, int64_t) = HS_PICK(hs_exp_range);
    HS_FOR_BLOCKS(n, HS_GRAIN / 4, 0, f(x + lo, out + lo, hi - lo));
}

void hs_softmax_f32(const float *x, float *out, int64_t outer, int64_t len, int64_t inner) {
    int64_t n = outer * len * inner;
    if (n <= 0) return;
    int nt = hs_threads_for(n, HS_GRAIN / 4);  /* exp makes softmax compute-heavier than add */
    if (inner == 1) {
        void (*f)(const float *, float *, int64_t, float *) = HS_PICK(hs_softmax_row);
        int stream = n >= HS_NT_MIN && len <= HS_SOFTMAX_TMP_MAX && hs_cpu_level() == HS_LEVEL_AVX2;
        #pragma omp parallel num_threads(nt)
        {
            float *tmp = stream ? malloc(sizeof(float) * (size_t)len) : NULL;  /* NULL: in place */
            #pragma omp for schedule(dynamic, 16) nowait
            for (int64_t o = 0; o < outer; o++) f(x + o * len, out + o * len, len, tmp);
            hs_stream_fence(tmp != NULL);
            free(tmp);
        }
    } else {
        void (*f)(const float *, float *, int64_t, int64_t, int64_t, int64_t) = HS_PICK(hs_softmax_cols);
        int64_t cblocks = (inner + HS_SOFTMAX_COLS - 1) / HS_SOFTMAX_COLS, items = outer * cblocks;
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int64_t it = 0; it < items; it++) {
            int64_t o = it / cblocks, c0 = (it % cblocks) * HS_SOFTMAX_COLS;
            int64_t c1 = c0 + HS_SOFTMAX_COLS < inner ? c0 + HS_SOFTMAX_COLS : inner;
            f(x + o * len * inner, out + o * len * inner, len, inner, c0, c1);
        }
    }
}
