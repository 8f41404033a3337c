/* Public similarity functions: pick the variant once (hs_cpu_level) and split rows over threads, handed
 * out dynamically so a preempted thread does not hold up the other. */
#include <stdlib.h>
#include <string.h>
#include "cpu_features.h"
#include "similarity.h"

#define HS_ROWS_DECL(suf, T_t) \
    HS_VARIANTS(void, hs_cosine_rows_##suf, (const float *q, const float *qinv, int64_t m, int exact, const T_t *T, \
                                         int64_t n, int64_t d, int64_t lo, int64_t hi, float *out)) \
    HS_VARIANTS(void, hs_widen_##suf, (const T_t *src, int64_t count, float *dst))
HS_VARIANTS(void, hs_narrow_f16, (const float *src, int64_t count, uint16_t *dst))
HS_VARIANTS(void, hs_narrow_bf16, (const float *src, int64_t count, uint16_t *dst))
HS_ROWS_DECL(f32, float)
HS_ROWS_DECL(f16, uint16_t)
HS_ROWS_DECL(bf16, uint16_t)
HS_VARIANTS(int64_t, hs_inv_norms_rows, (const float *T, int64_t d, int64_t lo, int64_t hi, float *inv))

#define HS_ROW_BLOCK 256          /* target rows per work item: enough to amortise the loop, small
                                     enough that two threads share the rows evenly */
#define HS_GRAIN (1 << 18)        /* floats read before a second thread pays off */

/* One public cosine per storage type of T; queries are float32 in all. */
#define HS_COSINE_DEF(suf, T_t)                                                                            \
int hs_cosine_##suf(const float *q, int64_t m, const T_t *T, int64_t n, int64_t d, float *out) {          \
    if (m <= 0 || n <= 0) return 0;                                                                        \
    void (*f)(const float *, const float *, int64_t, int, const T_t *, int64_t, int64_t, int64_t, int64_t, \
              float *) = HS_PICK(hs_cosine_rows_##suf);                                                    \
    float qinv_stack[64], *qinv = m <= 64 ? qinv_stack : malloc(sizeof(float) * (size_t)m);               \
    if (!qinv) return -1;                                                                                  \
    int exact = HS_PICK(hs_inv_norms_rows)(q, d, 0, m, qinv) > 0;                                          \
    /* a half element costs half the bytes of a float32 one: the same bytes per thread, not elements */   \
    int nt = hs_threads_for(n * d * m * (int64_t)sizeof(T_t) / 4, HS_GRAIN);                              \
    if (nt == 1) {  /* small calls skip the OpenMP runtime */                                              \
        f(q, qinv, m, exact, T, n, d, 0, n, out);                                                          \
    } else {                                                                                               \
        int64_t blocks = (n + HS_ROW_BLOCK - 1) / HS_ROW_BLOCK;                                            \
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)")                     \
        for (int64_t b = 0; b < blocks; b++) {                                                             \
            int64_t lo = b * HS_ROW_BLOCK, hi = lo + HS_ROW_BLOCK < n ? lo + HS_ROW_BLOCK : n;             \
            f(q, qinv, m, exact, T, n, d, lo, hi, out);                                                    \
        }                                                                                                  \
    }                                                                                                      \
    if (qinv != qinv_stack) free(qinv);                                                                    \
    return 0;                                                                                              \
}
HS_COSINE_DEF(f32, float)
HS_COSINE_DEF(f16, uint16_t)
HS_COSINE_DEF(bf16, uint16_t)

void hs_widen_f16(const uint16_t *src, int64_t count, float *dst) { HS_PICK(hs_widen_f16)(src, count, dst); }
void hs_widen_bf16(const uint16_t *src, int64_t count, float *dst) { HS_PICK(hs_widen_bf16)(src, count, dst); }
void hs_narrow_f16(const float *src, int64_t count, uint16_t *dst) { HS_PICK(hs_narrow_f16)(src, count, dst); }
void hs_narrow_bf16(const float *src, int64_t count, uint16_t *dst) { HS_PICK(hs_narrow_bf16)(src, count, dst); }

int hs_matmul_bf16_avx512bf16(const uint16_t *a, const uint16_t *b, int64_t m, int64_t k, int64_t n, uint16_t *c,
                              int nthreads);

/* Least multiply-adds worth a thread: a 64^3 product (~10 us on one core at vdpbf16ps' rate). */
#define HS_MATMUL_GRAIN (1LL << 18)

int hs_matmul_bf16(const uint16_t *a, const uint16_t *b, int64_t m, int64_t k, int64_t n, uint16_t *c) {
    if (!hs_cpu_bf16_dot()) return 1;
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0) {  /* an empty sum: +0 (all-zero bits) */
        memset(c, 0, sizeof(uint16_t) * (size_t)(m * n));
        return 0;
    }
    return hs_matmul_bf16_avx512bf16(a, b, m, k, n, c, hs_threads_for(m * n * k, HS_MATMUL_GRAIN));
}

int64_t hs_inv_norms_f32(const float *T, int64_t n, int64_t d, float *inv) {
    if (n <= 0) return 0;
    int64_t (*f)(const float *, int64_t, int64_t, int64_t, float *) = HS_PICK(hs_inv_norms_rows);
    int64_t blocks = (n + HS_ROW_BLOCK - 1) / HS_ROW_BLOCK, extreme = 0;
    int nt = hs_threads_for(n * d, HS_GRAIN);
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1) reduction(+: extreme)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t lo = b * HS_ROW_BLOCK, hi = lo + HS_ROW_BLOCK < n ? lo + HS_ROW_BLOCK : n;
        extreme += f(T, d, lo, hi, inv);
    }
    return extreme;
}

void hs_transpose_scale_f32(const float *src, int64_t n, int64_t m, const float *s, float *dst) {
    if (m <= 0 || n <= 0) return;
    /* a tile of src rows stays in L1/L2 while it is written out column by column */
    const int64_t tile = 64, tiles = (n + tile - 1) / tile;
    int nt = hs_threads_for(m * n, HS_GRAIN);
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t lo = t * tile, hi = lo + tile < n ? lo + tile : n;
        for (int64_t i = 0; i < m; i++) {
            float *d = dst + i * n;
            for (int64_t r = lo; r < hi; r++) d[r] = src[r * m + i] * s[r];
        }
    }
}
