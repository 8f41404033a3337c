/* Public elementwise functions: pick the variant once (hs_cpu_level) and split the work over threads.
 * Grains are the least work worth a thread: a parallel region costs a few microseconds. Work items are
 * handed out dynamically, so a thread the OS preempts (2 shared cores) does not hold up the other. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "cpu_features.h"
#include "elementwise.h"

/* Every range function exists per element type (f32, f16, bf16) and per variant (avx512, avx2, scalar). */
#define HS_TYPED(ret, name, args)                                                          \
    HS_VARIANTS(ret, name##_f32, args) HS_VARIANTS(ret, name##_f16, args) HS_VARIANTS(ret, name##_bf16, args)
HS_TYPED(void, hs_add_range, (const void *a, const void *b, void *out, int64_t n))
HS_TYPED(void, hs_add_scalar_range, (const void *a, const void *b, void *out, int64_t n))
HS_TYPED(void, hs_scale_range, (const void *x, float alpha, void *out, int64_t n))
HS_TYPED(void, hs_softmax_row, (const void *x, void *y, int64_t len))
HS_TYPED(void, hs_softmax_cols, (const void *x, void *y, int64_t len, int64_t inner, int64_t c0, int64_t c1))
HS_TYPED(void, hs_silu_mul_range, (const void *g, const void *u, void *out, int64_t n, int nt))
HS_TYPED(void, hs_gelu_range, (const void *x, void *out, int64_t n, int tanh_form))
HS_TYPED(void, hs_rope_rows, (const void *x, void *out, const float *tab, int64_t rows, int64_t d, int gptj, int nt))
/* bfloat16 silu_mul and rope built for AVX512_BF16 too (elementwise_bf16dot.c: its stores convert two
 * vectors in one vcvtne2ps2bf16, with the same bits), run where hs_cpu_bf16_dot() says so */
void hs_silu_mul_range_bf16_avx512bf16(const void *g, const void *u, void *out, int64_t n, int nt);
void hs_rope_rows_bf16_avx512bf16(const void *x, void *out, const float *tab, int64_t rows, int64_t d, int gptj, int nt);
HS_VARIANTS(void, hs_sfence, (void))
HS_VARIANTS(void, hs_rope_table, (const int64_t *pos, int64_t np, const double *invf, double fmax, int64_t d,
                                  double scale, int gptj, float *tab))
HS_VARIANTS(void, hs_exp_range, (const float *x, float *out, int64_t n))
#define HS_PICK_T(name, dt) \
    ((dt) == HS_F16 ? HS_PICK(name##_f16) : (dt) == HS_BF16 ? HS_PICK(name##_bf16) : HS_PICK(name##_f32))
/* Element i of a typed buffer seen as bytes (es: the element size). */
#define HS_AT(p, i) ((char *)(p) + (i) * es)

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

/* Whether a result of n elements of es bytes at `out` is written with streaming (non-temporal) stores:
 * when it is far larger than the caches it would only evict them, and a normal store first reads each
 * line it writes (a third memory stream beside the input and the output, which memcpy's large copies
 * avoid). Every level's streaming store of a vector needs 64-byte alignment: the result streams from
 * its first 64-byte boundary, and the elements before it (a NumPy out= array starts 16 bytes past one;
 * the wrappers allocate their own results aligned) take plain stores. Returns how many elements come
 * before that boundary, or -1 where the result does not stream (too small, or out not aligned to its
 * element). */
#define HS_STREAM_MIN_BYTES (16 << 20)
static int64_t hs_stream_head(const void *out, int64_t n, int64_t es) {
    if (n * es < HS_STREAM_MIN_BYTES || (uintptr_t)out % (uintptr_t)es) return -1;
    return (int64_t)((64 - ((uintptr_t)out & 63)) & 63) / es;
}

/* Grains and blocks count elements, whatever their size: the conversions make a half element cost
 * about what a float32 one does, though it moves half the bytes. */
void hs_add(hs_dtype dt, const void *a, const void *b, void *out, int64_t n, int64_t nb) {
    if (n <= 0) return;
    int64_t es = hs_dtype_size(dt);
    if (nb == n) {
        void (*f)(const void *, const void *, void *, int64_t) = HS_PICK_T(hs_add_range, dt);
        HS_FOR_BLOCKS(n, HS_GRAIN, f(HS_AT(a, lo), HS_AT(b, lo), HS_AT(out, lo), hi - lo));
    } else if (nb == 1) {
        void (*f)(const void *, const void *, void *, int64_t) = HS_PICK_T(hs_add_scalar_range, dt);
        HS_FOR_BLOCKS(n, HS_GRAIN, f(HS_AT(a, lo), b, HS_AT(out, lo), hi - lo));
    } else {  /* bias: one pass of b per row of nb elements */
        void (*f)(const void *, const void *, void *, int64_t) = HS_PICK_T(hs_add_range, dt);
        int64_t rows = n / nb;
        int nt = hs_threads_for(n, HS_GRAIN);
        #pragma omp parallel for schedule(dynamic, 64) num_threads(nt) if (nt > 1)
        for (int64_t r = 0; r < rows; r++) f(HS_AT(a, r * nb), b, HS_AT(out, r * nb), nb);
    }
}

void hs_add_f32(const float *a, const float *b, float *out, int64_t n, int64_t nb) { hs_add(HS_F32, a, b, out, n, nb); }

void hs_scale(hs_dtype dt, const void *x, float alpha, void *out, int64_t n) {
    if (n <= 0) return;
    int64_t es = hs_dtype_size(dt);
    void (*f)(const void *, float, void *, int64_t) = HS_PICK_T(hs_scale_range, dt);
    HS_FOR_BLOCKS(n, HS_GRAIN, f(HS_AT(x, lo), alpha, HS_AT(out, lo), hi - lo));
}

void hs_scale_f32(const float *x, float alpha, float *out, int64_t n) { hs_scale(HS_F32, x, alpha, out, n); }

void hs_exp_f32(const float *x, float *out, int64_t n) {
    if (n <= 0) return;
    void (*f)(const float *, float *, int64_t) = HS_PICK(hs_exp_range);
    HS_FOR_BLOCKS(n, HS_GRAIN / 4, f(x + lo, out + lo, hi - lo));
}

void hs_softmax(hs_dtype dt, const void *x, void *out, int64_t outer, int64_t len, int64_t inner) {
    int64_t n = outer * len * inner;
    if (n <= 0) return;
    int64_t es = hs_dtype_size(dt);
    int nt = hs_threads_for(n, HS_GRAIN / 4);  /* exp makes softmax compute-heavier than add */
    if (inner == 1) {
        void (*f)(const void *, void *, int64_t) = HS_PICK_T(hs_softmax_row, dt);
        #pragma omp parallel for schedule(dynamic, 16) num_threads(nt) if (nt > 1)
        for (int64_t o = 0; o < outer; o++) f(HS_AT(x, o * len), HS_AT(out, o * len), len);
    } else {
        void (*f)(const void *, void *, int64_t, int64_t, int64_t, int64_t) = HS_PICK_T(hs_softmax_cols, dt);
        int64_t cblocks = (inner + HS_SOFTMAX_COLS - 1) / HS_SOFTMAX_COLS, items = outer * cblocks;
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t o = it / cblocks, c0 = (it % cblocks) * HS_SOFTMAX_COLS;
            int64_t c1 = c0 + HS_SOFTMAX_COLS < inner ? c0 + HS_SOFTMAX_COLS : inner;
            f(HS_AT(x, o * len * inner), HS_AT(out, o * len * inner), len, inner, c0, c1);
        }
    }
}

void hs_softmax_f32(const float *x, float *out, int64_t outer, int64_t len, int64_t inner) {
    hs_softmax(HS_F32, x, out, outer, len, inner);
}

void hs_silu_mul(hs_dtype dt, const void *g, const void *u, void *out, int64_t n) {
    if (n <= 0) return;
    int64_t es = hs_dtype_size(dt);
    void (*f)(const void *, const void *, void *, int64_t, int) = HS_PICK_T(hs_silu_mul_range, dt);
    if (dt == HS_BF16 && hs_cpu_bf16_dot()) f = hs_silu_mul_range_bf16_avx512bf16;
    /* A large result streams from its first 64-byte boundary on (hs_stream_head: a third of the traffic
     * again for silu_mul without it, as np.copyto's memcpy streams); blocks are HS_BLOCK elements, so
     * each starts aligned too. The values are the same either way. */
    int64_t head = hs_stream_head(out, n, es);
    int nt = head >= 0;
    if (head > 0) f(g, u, out, head, 0);
    if (head < 0) head = 0;
    const void *g1 = HS_AT(g, head), *u1 = HS_AT(u, head);
    void *o1 = HS_AT(out, head);
    HS_FOR_BLOCKS(n - head, HS_GRAIN / 4, f(HS_AT(g1, lo), HS_AT(u1, lo), HS_AT(o1, lo), hi - lo, nt));  /* exp: as softmax */
}

void hs_gelu(hs_dtype dt, const void *x, void *out, int64_t n, int tanh_form) {
    if (n <= 0) return;
    int64_t es = hs_dtype_size(dt);
    void (*f)(const void *, void *, int64_t, int) = HS_PICK_T(hs_gelu_range, dt);
    HS_FOR_BLOCKS(n, HS_GRAIN / 64, f(HS_AT(x, lo), HS_AT(out, lo), hi - lo, tanh_form));  /* float64 libm per element */
}

/* Work items are (table batch, block of P sequence positions): the item computes the angles of its P
 * positions once (cos and sin, a row of 2d floats a position, in a heap buffer of up to HS_ROPE_TAB floats) and
 * applies them to every head's rows at those positions (and every batch row, when the positions are
 * shared), so the table's cost is spread over heads x batch rows and it stays in cache while they
 * stream past: each head's P rows are one contiguous run of x, rotated by one call. */
int hs_rope(hs_dtype dt, const void *x, const int64_t *positions, void *out, int64_t batch, int64_t heads,
            int64_t seq, int64_t d, int pos_per_batch, double base, double scale, int gptj) {
    int64_t n = batch * heads * seq * d;
    if (n <= 0) return 0;
    int64_t es = hs_dtype_size(dt), h = d / 2;
    double *invf = (double *)malloc((size_t)h * sizeof(double));
    if (!invf) return -1;
    /* base^(-2i/d) as powers of r = base^(-2/d): one pow instead of d/2 (a decode step's table is a
     * few dozen angles, where the pow calls were most of the kernel's time); the product's relative
     * error, i 2^-53, is 1e-14 at i = 64: nothing at float32's 6e-8 */
    double fmax = 0.0, r = pow(base, -2.0 / (double)d), f = 1.0;
    for (int64_t i = 0; i < h; i++, f *= r) {
        invf[i] = f;
        fmax = f > fmax ? f : fmax;
    }
    /* P positions per item: as many as the table allows (long contiguous runs of each head's rows
     * stream from memory at copy speed; 32-row runs measured ~30% slower, at 32 heads of d = 128), but
     * at least two items per thread when the positions are shared by every row. */
    int nt = hs_threads_for(n, HS_GRAIN);
    int64_t tables = pos_per_batch ? batch : 1;
    int64_t P = HS_ROPE_TAB / (2 * d), share = (seq * tables + 2 * nt - 1) / (2 * nt) / tables;
    if (P > share) P = share;
    if (P < 1) P = 1;
    if (P > seq) P = seq;
    int64_t blocks = (seq + P - 1) / P, items = tables * blocks;
    void (*rows)(const void *, void *, const float *, int64_t, int64_t, int, int) = HS_PICK_T(hs_rope_rows, dt);
    if (dt == HS_BF16 && hs_cpu_bf16_dot()) rows = hs_rope_rows_bf16_avx512bf16;
    void (*fence)(void) = HS_PICK(hs_sfence);
    /* streaming stores where every row, and its second half, starts on a 64-byte boundary */
    int stream = hs_stream_head(out, n, es) == 0 && (d * es) % 128 == 0;
    void (*table)(const int64_t *, int64_t, const double *, double, int64_t, double, int, float *) = HS_PICK(hs_rope_table);
    int failed = 0;
    if (nt > items) nt = (int)items;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int64_t it = 0; it < items; it++) {
        float *tab = (float *)malloc((size_t)(2 * d * P) * sizeof(float));
        if (!tab) {
            #pragma omp atomic write
            failed = 1;
            continue;
        }
        int64_t tb = it / blocks, s0 = (it % blocks) * P, np = s0 + P < seq ? P : seq - s0;
        table(positions + tb * seq * pos_per_batch + s0, np, invf, fmax, d, scale, gptj, tab);
        int64_t b0 = pos_per_batch ? tb : 0, b1 = pos_per_batch ? tb + 1 : batch;
        for (int64_t b = b0; b < b1; b++)
            for (int64_t hd = 0; hd < heads; hd++) {
                int64_t r0 = ((b * heads + hd) * seq + s0) * d;
                rows(HS_AT(x, r0), HS_AT(out, r0), tab, np, d, gptj, stream);
            }
        if (stream) fence();
        free(tab);
    }
    free(invf);
    return failed ? -1 : 0;
}
