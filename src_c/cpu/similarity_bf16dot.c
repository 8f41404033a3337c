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
 * Both operands are repacked once per call into the pair layout the instruction reads: A into panels of
 * MM_MR rows whose k-pairs are 32-bit words, pair p of rows 0..MM_MR-1 together, so a row's pair is one
 * broadcast; B into panels of MM_NR columns whose k-pairs are interleaved, pair p of columns 0..MM_NR-1
 * together (two vectors). k is padded to even with zeros, m and n to whole panels; padded rows and
 * columns are computed and never stored. A micro-tile MM_MR x MM_NR keeps its 24 accumulators in
 * registers over the whole of k, so each result is rounded exactly once and no float32 C is held. */
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#define HS_AVX512 1
#include <stdlib.h>
#include <string.h>
#include "simd.h"
#include "similarity.h"

#define MM_MR 12    /* rows per micro-tile: 12 x 2 accumulators, 2 B vectors and a broadcast in 32 zmm */
#define MM_NR 32    /* columns per micro-tile: two vectors of 16 float32 lanes */
/* Micro-tiles per work item, rows x columns: the item's A panels (MM_GM * MM_MR rows of k) and one B
 * panel stay in L2 while the item walks them; for k = 1024 that is 192 KB of A and 64 KB of B. */
#define MM_GM 8
#define MM_GN 8

static inline uint32_t mm_pair(const uint16_t *row, int64_t p, int64_t k) {
    uint32_t lo = row[2 * p], hi = 2 * p + 1 < k ? row[2 * p + 1] : 0;
    return lo | hi << 16;
}

/* Panel ip of A: ap[p * MM_MR + r] = (A[ip*MM_MR + r][2p], A[..][2p + 1]) as one 32-bit word, zero past
 * m and k. */
static void mm_pack_a(const uint16_t *a, int64_t m, int64_t k, int64_t k2, int64_t ip, uint32_t *ap) {
    for (int r = 0; r < MM_MR; r++) {
        int64_t row = ip * MM_MR + r;
        if (row >= m) {
            for (int64_t p = 0; p < k2; p++) ap[p * MM_MR + r] = 0;
            continue;
        }
        const uint16_t *src = a + row * k;
        int64_t full = k / 2;
        for (int64_t p = 0; p < full; p++) {
            uint32_t w;
            memcpy(&w, src + 2 * p, 4);
            ap[p * MM_MR + r] = w;
        }
        if (full < k2) ap[full * MM_MR + r] = mm_pair(src, full, k);
    }
}

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

/* One micro-tile: rows [0, mr) and columns [0, nr) of C at c (row stride n) from panels ap and bp. */
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

int hs_matmul_bf16_avx512bf16(const uint16_t *a, const uint16_t *b, int64_t m, int64_t k, int64_t n, uint16_t *c,
                              int nthreads) {
    const int64_t k2 = (k + 1) / 2, mp = (m + MM_MR - 1) / MM_MR, np_ = (n + MM_NR - 1) / MM_NR;
    uint32_t *ap = aligned_alloc(64, ((size_t)(mp * k2 * MM_MR) * 4 + 63) / 64 * 64);
    uint16_t *bp = aligned_alloc(64, ((size_t)(np_ * k2 * 2 * MM_NR) * 2 + 63) / 64 * 64);
    if (!ap || !bp) {
        free(ap);
        free(bp);
        return -1;
    }
    const int64_t gm = (mp + MM_GM - 1) / MM_GM, gn = (np_ + MM_GN - 1) / MM_GN;
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        #pragma omp for schedule(static) nowait
        for (int64_t ip = 0; ip < mp; ip++) mm_pack_a(a, m, k, k2, ip, ap + ip * k2 * MM_MR);
        #pragma omp for schedule(static)
        for (int64_t jp = 0; jp < np_; jp++) mm_pack_b(b, k, n, k2, jp, bp + jp * k2 * 2 * MM_NR);
        /* (row group, column group) items, handed out as threads free up */
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < gm * gn; it++) {
            int64_t i0 = it / gn * MM_GM, j0 = it % gn * MM_GN;
            int64_t i1 = i0 + MM_GM < mp ? i0 + MM_GM : mp, j1 = j0 + MM_GN < np_ ? j0 + MM_GN : np_;
            for (int64_t jp = j0; jp < j1; jp++) {
                int nr = n - jp * MM_NR < MM_NR ? (int)(n - jp * MM_NR) : MM_NR;
                for (int64_t ip = i0; ip < i1; ip++) {
                    int mr = m - ip * MM_MR < MM_MR ? (int)(m - ip * MM_MR) : MM_MR;
                    mm_tile(ap + ip * k2 * MM_MR, bp + jp * k2 * 2 * MM_NR, k2, c + ip * MM_MR * n + jp * MM_NR, n,
                            mr, nr);
                }
            }
        }
    }
    free(ap);
    free(bp);
    return 0;
}
