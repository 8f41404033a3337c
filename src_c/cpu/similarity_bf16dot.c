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
 * Work items are (96 rows, 128 columns) blocks of C, handed out to threads as they free up, each with its
 * own buffers (no barrier, no shared scratch: a thread the OS deschedules holds up one item, not all).
 * An item repacks its 128 columns of B into the pair layout the instruction reads: for each k-pair p, the
 * 32 columns of a panel interleaved, (B[2p][c], B[2p + 1][c]), two vectors. A is read where it lies,
 * each row's pair one 32-bit broadcast; an odd k pads it: the item's rows are then copied with a zero
 * after each (k + 1 per row). Rows past m read the last row again (computed, never stored), columns
 * past n are zero in the packed B. A 12 x 32 micro-tile keeps its 24 accumulators in registers over the
 * whole of k, so each result is rounded exactly once and no float32 C is held. */
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#define HS_AVX512 1
#include <stdlib.h>
#include <string.h>
#include "simd.h"
#include "similarity.h"

#define MM_MR 12    /* rows per micro-tile: 12 x 2 accumulators, 2 B vectors and a broadcast in 32 zmm */
#define MM_NR 32    /* columns per micro-tile: two vectors of 16 float32 lanes */
/* One work item: MM_IM rows (8 micro-tiles) x MM_IN columns (4 panels). Its B panels (k x 128 bfloat16:
 * 256 KB at k = 1024) and the A rows it walks (96 x k: 192 KB) stay in L2; packing B costs 1/96 of the
 * item's products. */
#define MM_IM (8 * MM_MR)
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

/* One micro-tile: rows [0, mr) and columns [0, nr) of C at c (row stride n), from rows of A as 32-bit
 * pairs (row r at a + r * lda, k2 pairs; rows past mr repeat the last one) and one packed B panel. */
static void mm_tile(const uint16_t *a, int64_t lda, const uint16_t *bp, int64_t k2, uint16_t *c, int64_t n, int mr,
                    int nr) {
    const uint16_t *ar[MM_MR];
    for (int r = 0; r < MM_MR; r++) ar[r] = a + (r < mr ? r : mr - 1) * lda;
    __m512 acc[MM_MR][2];
    #pragma GCC unroll 12
    for (int r = 0; r < MM_MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k2; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * MM_NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * MM_NR + MM_NR);
        #pragma GCC unroll 12
        for (int r = 0; r < MM_MR; r++) {
            uint32_t w;
            memcpy(&w, ar[r] + 2 * p, 4);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)w);
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

int hs_matmul_bf16_avx512bf16(const uint16_t *a, const uint16_t *b, int64_t m, int64_t k, int64_t n, uint16_t *c,
                              int nthreads) {
    const int64_t k2 = (k + 1) / 2, odd = k & 1, gm = (m + MM_IM - 1) / MM_IM, gn = (n + MM_IN - 1) / MM_IN;
    /* per thread: the item's B panels, and for an odd k its A rows padded to k + 1 */
    const int64_t bcols = n < MM_IN ? (n + MM_NR - 1) / MM_NR * MM_NR : MM_IN;
    const size_t bbytes = (size_t)(k2 * 2 * bcols) * 2, abytes = odd ? (size_t)(MM_IM * 2 * k2) * 2 : 0;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        uint16_t *bp = aligned_alloc(64, (bbytes + abytes + 63) / 64 * 64);
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < gm * gn; it++) {
            if (!bp) { failed = 1; continue; }
            int64_t i0 = it / gn * MM_IM, j0 = it % gn * MM_IN;
            int64_t rows = m - i0 < MM_IM ? m - i0 : MM_IM, cols = n - j0 < MM_IN ? n - j0 : MM_IN;
            int64_t panels = (cols + MM_NR - 1) / MM_NR;
            for (int64_t q = 0; q < panels; q++) mm_pack_b(b, k, n, k2, j0 / MM_NR + q, bp + q * k2 * 2 * MM_NR);
            const uint16_t *ai = a + i0 * k;
            int64_t lda = k;
            if (odd) {
                uint16_t *ap = bp + bbytes / 2;
                for (int64_t r = 0; r < rows; r++) {
                    memcpy(ap + r * (k + 1), ai + r * k, sizeof(uint16_t) * (size_t)k);
                    ap[r * (k + 1) + k] = 0;
                }
                ai = ap;
                lda = k + 1;
            }
            for (int64_t q = 0; q < panels; q++) {
                int nr = cols - q * MM_NR < MM_NR ? (int)(cols - q * MM_NR) : MM_NR;
                for (int64_t r0 = 0; r0 < rows; r0 += MM_MR) {
                    int mr = rows - r0 < MM_MR ? (int)(rows - r0) : MM_MR;
                    mm_tile(ai + r0 * lda, lda, bp + q * k2 * 2 * MM_NR, k2, c + (i0 + r0) * n + j0 + q * MM_NR, n,
                            mr, nr);
                }
            }
        }
        free(bp);
    }
    return failed ? -1 : 0;
}
