/* bfloat16 matmul on AVX512_BF16 (vdpbf16ps): C (m, n) = A (m, k) @ B (k, n), all bfloat16, row-major.
 * This file alone is compiled for AVX512_BF16 besides the AVX-512 level's subsets; similarity.c calls it
 * only when hs_cpu_bf16_dot() says the CPU has it and the level allows it.
 *
 * vdpbf16ps multiplies two pairs of bfloat16 along k per float32 lane (each product exact in float32)
 * and adds both to the lane's float32 accumulator, with denormal inputs read as zero and denormal
 * results flushed to zero whatever MXCSR says (Intel SDM, VDPBF16PS: DAZ and FTZ implied). So the result
 * is the float32 sum of exact products, rounded once to bfloat16 at the end as the widening path
 * rounds it, in another summation order, with bfloat16 denormals (|x| < 2^-126) counted as zero.
 *
 * Work items are blocks of C of 128 columns and up to 192 rows (fewer for a long k), handed out to
 * threads as they free up, with no barrier (a thread the OS deschedules holds up its items, not the
 * others). The operands are repacked into the pair layouts the instruction reads: B by 32-column panels
 * with each k-pair interleaved, (B[2p][c], B[2p + 1][c]), two vectors per pair, each panel once per call
 * by the first thread that needs it (another thread needing it meanwhile packs a private copy rather
 * than wait); A by the item's thread, as panels of 12 rows whose pair p, (A[r][2p], A[r][2p + 1]), is
 * one 32-bit word, the 12 words of a pair together, so each micro-tile step reads 48 contiguous bytes of
 * A (A read in place, 12 rows k apart, ran slower: 161 against 196 GFLOP/s on one Zen 4 core at 1024^3;
 * the rows share few L1 sets). A thread takes its share of a row block's items at a time and keeps its
 * packed A while the rows stay the same. k is padded to even with zeros; rows past m are zero, columns past n are zero
 * (computed, never stored). A 12 x 32 micro-tile keeps its 24 accumulators in registers over the whole
 * of k, so each result is rounded exactly once and no float32 C is held. */
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#define HS_AVX512 1
#include <stdlib.h>
#include <string.h>
#include "simd.h"
#include "similarity.h"

#define MM_MR 12    /* rows per micro-tile: 12 x 2 accumulators, 2 B vectors and a broadcast in 32 zmm */
#define MM_NR 32    /* columns per micro-tile: two vectors of 16 float32 lanes */
/* One work item: up to MM_IM rows (16 micro-tiles) x MM_IN columns (4 panels), its packed A rows at most
 * MM_ABYTES (fewer rows for a long k). A micro-tile step
 * reads 48 bytes of A and 128 of B per 24 vdpbf16ps, which L2 or L3 serve, so the operands need not fit
 * L2. */
#define MM_IM (16 * MM_MR)
#define MM_ABYTES (1 << 20)
#define MM_IN (4 * MM_NR)

/* Panel jp of B: bp[p * 2*MM_NR + 2c + e] = B[2p + e][jp*MM_NR + c], zero past k and n. Two rows of 32
 * columns are interleaved by one two-source word permute per output vector. */
static void mm_pack_b(const uint16_t *b, int64_t k, int64_t n, int64_t k2, int64_t jp, uint16_t *bp) {
    static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                        24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i il = _mm512_loadu_si512(lo_idx), ih = _mm512_loadu_si512(hi_idx);
    int64_t c0 = jp * MM_NR, cols = n - c0 < MM_NR ? n - c0 : MM_NR;
    __mmask32 mask = cols == 32 ? 0xffffffffu : (__mmask32)((1u << cols) - 1u);
    for (int64_t p = 0; p < k2; p++) {
        __m512i r0 = _mm512_maskz_loadu_epi16(mask, b + 2 * p * n + c0);
        __m512i r1 = 2 * p + 1 < k ? _mm512_maskz_loadu_epi16(mask, b + (2 * p + 1) * n + c0) : _mm512_setzero_si512();
        _mm512_storeu_si512(bp + p * 2 * MM_NR, _mm512_permutex2var_epi16(r0, il, r1));
        _mm512_storeu_si512(bp + p * 2 * MM_NR + MM_NR, _mm512_permutex2var_epi16(r0, ih, r1));
    }
}

static inline uint32_t mm_pair(const uint16_t *row, int64_t p, int64_t k) {
    uint32_t lo = row[2 * p], hi = 2 * p + 1 < k ? row[2 * p + 1] : 0;
    return lo | hi << 16;
}

/* Rows [0, rows) of A (at a) as panels of MM_MR: ap[(panel * k2 + p) * MM_MR + r] = pair p of row
 * panel * MM_MR + r, zero for rows past `rows` and the pad past k. */
static void mm_pack_a(const uint16_t *a, int64_t rows, int64_t k, int64_t k2, uint32_t *ap) {
    const int64_t panels = (rows + MM_MR - 1) / MM_MR, full = k / 2;
    for (int64_t q = 0; q < panels; q++) {
        uint32_t *dst = ap + q * k2 * MM_MR;
        for (int r = 0; r < MM_MR; r++) {
            int64_t row = q * MM_MR + r;
            if (row >= rows) {
                for (int64_t p = 0; p < k2; p++) dst[p * MM_MR + r] = 0;
                continue;
            }
            const uint16_t *src = a + row * k;
            for (int64_t p = 0; p < full; p++) {
                uint32_t w;
                memcpy(&w, src + 2 * p, 4);
                dst[p * MM_MR + r] = w;
            }
            if (full < k2) dst[full * MM_MR + r] = mm_pair(src, full, k);
        }
    }
}

/* One micro-tile: rows [0, mr) and columns [0, nr) of C at c (row stride n), from a packed A panel and
 * a packed B panel of k2 pairs. */
static void mm_tile(const uint32_t *ap, const uint16_t *bp, int64_t k2, uint16_t *c, int64_t n, int mr, int nr) {
    __m512 acc[MM_MR][2];
    #pragma GCC unroll 12
    for (int r = 0; r < MM_MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k2; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * MM_NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * MM_NR + MM_NR);
        #pragma GCC unroll 12
        for (int r = 0; r < MM_MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[p * MM_MR + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
    if (mr == MM_MR && nr == MM_NR) {
        #pragma GCC unroll 12
        for (int r = 0; r < MM_MR; r++) {
            hs_v_store_bf16(c + r * n, acc[r][0]);
            hs_v_store_bf16(c + r * n + 16, acc[r][1]);
        }
        return;
    }
    uint16_t tmp[MM_MR][MM_NR];  /* an edge tile: rounded whole, stored in part */
    for (int r = 0; r < MM_MR; r++) {
        hs_v_store_bf16(tmp[r], acc[r][0]);
        hs_v_store_bf16(tmp[r] + 16, acc[r][1]);
    }
    for (int r = 0; r < mr; r++) memcpy(c + r * n, tmp[r], sizeof(uint16_t) * (size_t)nr);
}

/* Packed panel jp of B: the shared copy, packed here by the first thread to need it; where another
 * thread is packing it at that moment, this thread packs its own copy into mine rather than wait. */
static const uint16_t *mm_panel_b(const uint16_t *b, int64_t k, int64_t n, int64_t k2, int64_t jp, uint16_t *shared,
                                  int *state, uint16_t *mine) {
    uint16_t *dst = shared + jp * k2 * 2 * MM_NR;
    int s = __atomic_load_n(&state[jp], __ATOMIC_ACQUIRE), expected = 0;
    if (s == 2) return dst;
    if (s == 0 && __atomic_compare_exchange_n(&state[jp], &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        mm_pack_b(b, k, n, k2, jp, dst);
        __atomic_store_n(&state[jp], 2, __ATOMIC_RELEASE);
        return dst;
    }
    if (expected == 2) return dst;  /* finished between the load and the exchange */
    mm_pack_b(b, k, n, k2, jp, mine);
    return mine;
}

int hs_matmul_bf16_avx512bf16(const uint16_t *a, const uint16_t *b, int64_t m, int64_t k, int64_t n, uint16_t *c,
                              int nthreads) {
    const int64_t k2 = (k + 1) / 2, gn = (n + MM_IN - 1) / MM_IN, np_ = (n + MM_NR - 1) / MM_NR;
    int64_t im = MM_ABYTES / (4 * k2) / MM_MR * MM_MR;  /* most rows per item */
    im = im < 2 * MM_MR ? 2 * MM_MR : im > MM_IM ? MM_IM : im;
    /* row blocks of nearly equal size, as many as some multiple of the threads where there are enough
     * rows, so that whole row blocks even out over the threads */
    int64_t nb = (m + im - 1) / im;
    if (nb >= nthreads) nb = (nb + nthreads - 1) / nthreads * nthreads;
    im = ((m + nb - 1) / nb + MM_MR - 1) / MM_MR * MM_MR;
    const int64_t gm = (m + im - 1) / im;
    /* B packed once for all items (shared), and per thread: one panel for when the shared one is being
     * packed by another thread, and the item's rows of A */
    uint16_t *shared = aligned_alloc(64, ((size_t)(np_ * k2 * 2 * MM_NR) * 2 + 63) / 64 * 64);
    int *state = calloc((size_t)np_, sizeof(int));
    if (!shared || !state) {
        free(shared);
        free(state);
        return -1;
    }
    const size_t pbytes = ((size_t)(k2 * 2 * MM_NR) * 2 + 63) / 64 * 64, abytes = (size_t)(k2 * im) * 4;
    /* items in row-block order, a thread taking its share of a row block at a time, so that those items
     * share the rows it has packed. (Whole row blocks per take, packing each block's A once, read 0.79x
     * torch in one benchmark run against 0.98x and 1.05x for this, on a shared, noisy machine: coarser
     * takes even out worse over the threads.) */
    const int chunk = gn / nthreads > 1 ? (int)(gn / nthreads) : 1;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        uint16_t *mine = aligned_alloc(64, pbytes + abytes);
        uint32_t *ap = mine ? (uint32_t *)(mine + pbytes / 2) : NULL;
        int64_t packed_rows = -1;  /* the row block whose A this thread holds packed */
        #pragma omp for schedule(dynamic, chunk)
        for (int64_t it = 0; it < gm * gn; it++) {
            if (!mine) { failed = 1; continue; }
            int64_t ib = it / gn, i0 = ib * im, j0 = it % gn * MM_IN;
            int64_t rows = m - i0 < im ? m - i0 : im, cols = n - j0 < MM_IN ? n - j0 : MM_IN;
            if (ib != packed_rows) {
                mm_pack_a(a + i0 * k, rows, k, k2, ap);
                packed_rows = ib;
            }
            for (int64_t q = 0; q * MM_NR < cols; q++) {
                const uint16_t *bp = mm_panel_b(b, k, n, k2, j0 / MM_NR + q, shared, state, mine);
                int nr = cols - q * MM_NR < MM_NR ? (int)(cols - q * MM_NR) : MM_NR;
                for (int64_t r0 = 0; r0 < rows; r0 += MM_MR) {
                    int mr = rows - r0 < MM_MR ? (int)(rows - r0) : MM_MR;
                    mm_tile(ap + r0 * k2, bp, k2, c + (i0 + r0) * n + j0 + q * MM_NR, n, mr, nr);
                }
            }
        }
        free(mine);
    }
    free(shared);
    free(state);
    return failed ? -1 : 0;
}
