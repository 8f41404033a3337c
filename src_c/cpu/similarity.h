/* Cosine similarity and exact top-k on contiguous float32. Row norms come from the same pass over the
 * targets as the dot products (the targets are what costs: memory bandwidth). The wrapper
 * (_similarity.pyx) uses these for few queries, and BLAS (np.matmul) plus hs_inv_norms_f32 and
 * hs_transpose_scale_f32 for many. */
#ifndef HS_SIMILARITY_H
#define HS_SIMILARITY_H
#include <stdint.h>

/* out[i*n + r] = cos(q_i, T_r) for m queries q (m, d) and targets T (n, d), one pass over T.
 * Either vector zero (norm exactly 0) and the other finite -> 0; NaN/inf -> NaN as the formula gives.
 * 0, or -1 when out of memory. */
int hs_cosine_f32(const float *q, int64_t m, const float *T, int64_t n, int64_t d, float *out);
/* The same with T stored as float16 / bfloat16 (uint16_t bits; queries float32): T is read as half and
 * converted in registers, so the pass reads half the bytes; every product and sum is float32, so the
 * scores equal hs_cosine_f32's on T widened exactly to float32. */
int hs_cosine_f16(const float *q, int64_t m, const uint16_t *T, int64_t n, int64_t d, float *out);
int hs_cosine_bf16(const float *q, int64_t m, const uint16_t *T, int64_t n, int64_t d, float *out);

/* dst[0, count) = src widened to float32 (exact): a block of a half corpus for the BLAS path. */
void hs_widen_f16(const uint16_t *src, int64_t count, float *dst);
void hs_widen_bf16(const uint16_t *src, int64_t count, float *dst);
/* dst[0, count) = src rounded to the half type (round to nearest even; float16 overflows to inf). */
void hs_narrow_f16(const float *src, int64_t count, uint16_t *dst);
void hs_narrow_bf16(const float *src, int64_t count, uint16_t *dst);

/* c (m, n) = a (m, k) @ b (k, n), all bfloat16 (uint16_t bits), row-major, on AVX512_BF16's vdpbf16ps
 * (similarity_bf16dot.c): float32 sums of exact products, rounded once to bfloat16; bfloat16 denormals
 * count as zero and float32 denormal sums flush to zero (the instruction's fixed DAZ/FTZ). Returns 1,
 * computing nothing, where hs_cpu_bf16_dot() is false (the caller widens instead); 0, or -1 when out of
 * memory for the packed operands (b's size, and per thread up to 1 MB of a and one panel of b). */
int hs_matmul_bf16(const uint16_t *a, const uint16_t *b, int64_t m, int64_t k, int64_t n, uint16_t *c);

/* inv[r] = 1 / ||T_r|| for T (n, d); 0 where the norm is 0 or not finite (so a zero row scores 0,
 * and a NaN/inf row scores NaN through its NaN/inf dot product). Returns how many rows have norms so
 * small or large (values beyond ~1e-15 or ~1e15) that a float dot product with them loses precision:
 * when not 0, score with hs_cosine_f32, which handles those rows in double. */
int64_t hs_inv_norms_f32(const float *T, int64_t n, int64_t d, float *inv);

/* dst[i, r] = src[r, i] * s[r]: BLAS's (n, m) product of targets and normalised queries, turned into
 * (m, n) cosines in one pass. */
void hs_transpose_scale_f32(const float *src, int64_t n, int64_t m, const float *s, float *dst);

/* For each of m rows of scores (m, n), the k best (k <= n): idx/val (m, k), best first. Order: higher
 * score first, ties to the lower index, NaN after every number (NaNs by index). 0, or -1 when out of
 * memory. */
int hs_topk_f32(const float *scores, int64_t m, int64_t n, int64_t k, int64_t *idx, float *val);
#endif
