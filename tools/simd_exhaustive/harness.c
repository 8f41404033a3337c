/* Per-level probes of simd.h and elementwise.inc primitives for tools/simd_exhaustive/compare.py (not
 * part of the package build). -DOLD builds them from the hs_v8 names the AVX2 variant had before HS_W. */
#if defined(LVL_AVX2)
#pragma GCC target("avx2,fma,f16c")
#define HS_AVX2 1
#elif defined(LVL_AVX512)
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")
#define HS_AVX512 1
#endif
#include "simd.h"
#include "elementwise.inc"
#ifdef OLD
#define VL hs_v8_load
#define VS hs_v8_store
#define EXP hs_v8_exp
#define EXPN hs_v8_exp_neg
#define W 8
#define SF16 hs_v8_store_f16
#define SBF16 hs_v8_store_bf16
#define LF16 hs_v8_load_f16
#define LBF16 hs_v8_load_bf16
#else
#define VL hs_v_load
#define VS hs_v_store
#define EXP hs_v_exp
#define EXPN hs_v_exp_neg
#define W HS_W
#define SF16 hs_v_store_f16
#define SBF16 hs_v_store_bf16
#define LF16 hs_v_load_f16
#define LBF16 hs_v_load_bf16
#endif
/* n: a multiple of 16 */
void h_exp(const float *x, float *o, long n) { for (long i = 0; i < n; i += W) VS(o + i, EXP(VL(x + i))); }
void h_expn(const float *x, float *o, long n) { for (long i = 0; i < n; i += W) VS(o + i, EXPN(VL(x + i))); }
void h_f16(const float *x, uint16_t *o, long n) { for (long i = 0; i < n; i += W) SF16(o + i, VL(x + i)); }
void h_bf16(const float *x, uint16_t *o, long n) { for (long i = 0; i < n; i += W) SBF16(o + i, VL(x + i)); }
void h_lf16(const uint16_t *x, float *o, long n) { for (long i = 0; i < n; i += W) VS(o + i, LF16(x + i)); }
void h_lbf16(const uint16_t *x, float *o, long n) { for (long i = 0; i < n; i += W) VS(o + i, LBF16(x + i)); }
void h_ref_f16(const float *x, uint16_t *o, long n) { for (long i = 0; i < n; i++) o[i] = hs_f32_to_f16(x[i]); }
void h_ref_bf16(const float *x, uint16_t *o, long n) { for (long i = 0; i < n; i++) o[i] = hs_f32_to_bf16(x[i]); }
void h_ref_lf16(const uint16_t *x, float *o, long n) { for (long i = 0; i < n; i++) o[i] = hs_f16_to_f32(x[i]); }
void h_ref_lbf16(const uint16_t *x, float *o, long n) { for (long i = 0; i < n; i++) o[i] = hs_bf16_to_f32(x[i]); }
