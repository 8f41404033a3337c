/* An 8-lane float vector written once for both variants: a translation unit that defines HS_AVX2
 * (the *_avx2.c files, compiled under `#pragma GCC target("avx2,fma")`) gets AVX2/FMA intrinsics; any
 * other gets plain C arrays that the compiler maps to SSE2. Kernel bodies use only these names, and
 * HS_FN(name) gives each variant its own symbol (name_avx2 / name_scalar). */
#ifndef HS_SIMD_H
#define HS_SIMD_H
#include <stdint.h>
#include <math.h>

#ifdef HS_AVX2
#include <immintrin.h>
#define HS_FN(name) name##_avx2
typedef __m256 hs_v8f;
static inline hs_v8f hs_v8_zero(void) { return _mm256_setzero_ps(); }
static inline hs_v8f hs_v8_set1(float x) { return _mm256_set1_ps(x); }
static inline hs_v8f hs_v8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void hs_v8_store(float *p, hs_v8f v) { _mm256_storeu_ps(p, v); }
static inline hs_v8f hs_v8_add(hs_v8f a, hs_v8f b) { return _mm256_add_ps(a, b); }
static inline hs_v8f hs_v8_sub(hs_v8f a, hs_v8f b) { return _mm256_sub_ps(a, b); }
static inline hs_v8f hs_v8_mul(hs_v8f a, hs_v8f b) { return _mm256_mul_ps(a, b); }
static inline hs_v8f hs_v8_fma(hs_v8f a, hs_v8f b, hs_v8f c) { return _mm256_fmadd_ps(a, b, c); }
static inline hs_v8f hs_v8_max(hs_v8f a, hs_v8f b) { return _mm256_max_ps(a, b); }
static inline float hs_v8_hsum(hs_v8f v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float hs_v8_hmax(hs_v8f v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
#define HS_FN(name) name##_scalar
typedef struct { float v[8]; } hs_v8f;
static inline hs_v8f hs_v8_zero(void) { hs_v8f r; for (int i = 0; i < 8; i++) r.v[i] = 0.f; return r; }
static inline hs_v8f hs_v8_set1(float x) { hs_v8f r; for (int i = 0; i < 8; i++) r.v[i] = x; return r; }
static inline hs_v8f hs_v8_load(const float *p) { hs_v8f r; for (int i = 0; i < 8; i++) r.v[i] = p[i]; return r; }
static inline void hs_v8_store(float *p, hs_v8f a) { for (int i = 0; i < 8; i++) p[i] = a.v[i]; }
static inline hs_v8f hs_v8_add(hs_v8f a, hs_v8f b) { for (int i = 0; i < 8; i++) a.v[i] += b.v[i]; return a; }
static inline hs_v8f hs_v8_sub(hs_v8f a, hs_v8f b) { for (int i = 0; i < 8; i++) a.v[i] -= b.v[i]; return a; }
static inline hs_v8f hs_v8_mul(hs_v8f a, hs_v8f b) { for (int i = 0; i < 8; i++) a.v[i] *= b.v[i]; return a; }
static inline hs_v8f hs_v8_fma(hs_v8f a, hs_v8f b, hs_v8f c) { for (int i = 0; i < 8; i++) c.v[i] += a.v[i] * b.v[i]; return c; }
/* Same NaN rule as _mm256_max_ps: when either lane is NaN the second operand wins. Kernels that need
 * NumPy's NaN propagation must check NaN explicitly, on both variants. */
static inline hs_v8f hs_v8_max(hs_v8f a, hs_v8f b) { for (int i = 0; i < 8; i++) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
static inline float hs_v8_hsum(hs_v8f a) {
    return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
static inline float hs_v8_hmax(hs_v8f a) { float m = a.v[0]; for (int i = 1; i < 8; i++) m = a.v[i] > m ? a.v[i] : m; return m; }
#endif
#endif
