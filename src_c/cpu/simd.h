/* A float vector written once for every variant. A translation unit that defines HS_AVX2 (the *_avx2.c
 * files, compiled under `#pragma GCC target("avx2,fma,f16c")`) gets AVX2/FMA intrinsics on 8 lanes; one
 * that defines HS_AVX512 (the *_avx512.c files, `#pragma GCC target("avx512f,...")`) gets AVX-512 on 16
 * lanes; any other gets plain C arrays of 8 that the compiler maps to SSE2. HS_FN(name) gives each variant
 * its own symbol (name_avx2 / name_avx512 / name_scalar).
 * Two sets of names: hs_v8f / hs_v8_* are 8 lanes (AVX2 and scalar only), and the width-generic
 * hs_vf / hs_v_* have HS_W lanes (8, or 16 under HS_AVX512). The families with an AVX-512 variant
 * (elementwise, similarity, norm, attention, quant) use only the generic names, with
 * strides and tail buffers in HS_W; at HS_W == 8 those names are the hs_v8 ones, so the AVX2 and scalar
 * variants do the same operations in the same order as when they were written with hs_v8 names. */
#ifndef HS_SIMD_H
#define HS_SIMD_H
#include <stdint.h>
#include <math.h>

/* Half precision: stored as 16 bits, computed in float32. These scalar conversions are the reference
 * both variants use for tails and the scalar variant uses throughout; the AVX2 variant converts 8 at a
 * time (F16C for float16, which the AVX2 level requires; shifts for bfloat16) with identical results.
 * float16: IEEE binary16, round to nearest even, overflow to inf, subnormals kept: bit for bit NumPy's
 * and PyTorch's conversion of every float32 but NaNs, which keep their sign and top payload bits and
 * come out quiet, as F16C makes them (NumPy keeps a signalling NaN signalling; PyTorch makes every NaN
 * 0x7e00). bfloat16: the top 16 bits of a float32, round to nearest even, a NaN becomes the
 * quiet NaN 0x7fc0 with its sign (as ml_dtypes converts; PyTorch drops the sign). */
static inline float hs_f32_from_bits(uint32_t u) { union { uint32_t u; float f; } c; c.u = u; return c.f; }
static inline uint32_t hs_bits_from_f32(float f) { union { uint32_t u; float f; } c; c.f = f; return c.u; }

static inline float hs_bf16_to_f32(uint16_t h) { return hs_f32_from_bits((uint32_t)h << 16); }
static inline uint16_t hs_f32_to_bf16(float f) {
    uint32_t u = hs_bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float hs_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1fu)   /* inf; a NaN comes back quiet, as F16C converts it */
        return hs_f32_from_bits(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
    if (exp != 0) return hs_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13)); /* normal */
    /* zero or subnormal: man * 2^-24, exact in float32 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
}
static inline uint16_t hs_f32_to_f16(float f) {
    uint32_t u = hs_bits_from_f32(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));   /* NaN, quieted */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* rounds past 65504: inf (inf too) */
    if (a >= 0x38800000u) {                                    /* normal half: rebias, round to even */
        uint32_t r = a - 0x38000000u;                          /* exponent 127 -> 15 */
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)sign;                /* below half the least subnormal: 0 */
    /* subnormal half: the mantissa with its implicit bit, shifted right, round to even */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

#if defined(HS_AVX2) || defined(HS_AVX512)
#include <immintrin.h>
/* The 8-lane horizontal sum and max, in the one order both SIMD levels reduce in (AVX-512 first adds
 * or maxes its two 8-lane halves lane by lane). */
static inline float hs__hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float hs__hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#ifdef HS_AVX2
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
static inline hs_v8f hs_v8_div(hs_v8f a, hs_v8f b) { return _mm256_div_ps(a, b); }
/* lanes (0 1)(2 3)... swapped within each pair: rope's interleaved (GPT-J) layout */
static inline hs_v8f hs_v8_swap_pairs(hs_v8f a) { return _mm256_permute_ps(a, 0xb1); }
/* lanes (0 1)(2 3)... as (0 0)(2 2)... and (1 1)(3 3)...: rope's interleaved (cos, sin) table pairs */
static inline hs_v8f hs_v8_dup_even(hs_v8f a) { return _mm256_moveldup_ps(a); }
static inline hs_v8f hs_v8_dup_odd(hs_v8f a) { return _mm256_movehdup_ps(a); }
/* a b - c in the even lanes, a b + c in the odd ones, each rounded once */
static inline hs_v8f hs_v8_fmaddsub(hs_v8f a, hs_v8f b, hs_v8f c) { return _mm256_fmaddsub_ps(a, b, c); }
static inline hs_v8f hs_v8_max(hs_v8f a, hs_v8f b) { return _mm256_max_ps(a, b); }
static inline float hs_v8_hsum(hs_v8f v) { return hs__hsum8(v); }
static inline float hs_v8_hmax(hs_v8f v) { return hs__hmax8(v); }
static inline hs_v8f hs_v8_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void hs_v8_store_f16(uint16_t *p, hs_v8f v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline hs_v8f hs_v8_load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline void hs_v8_store_bf16(uint16_t *p, hs_v8f v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                  _mm256_and_si256(hi, _mm256_set1_epi32(1)))), 16);
    __m256i qnan = _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    /* 8 x 32-bit lanes (each < 2^16) to 8 x 16-bit: pack within 128-bit halves, then gather them */
    __m256i p16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(p16));
}
/* Non-temporal stores (rope and silu_mul's large outputs: no read for ownership of the destination, as
 * memcpy's large copies). p aligned to the vector's bytes (32 for float32, 16 for the halves); a
 * kernel that uses them ends with hs_v_sfence(). */
static inline void hs_v8_stream(float *p, hs_v8f v) { _mm256_stream_ps(p, v); }
static inline void hs_v8_stream_f16(uint16_t *p, hs_v8f v) {
    _mm_stream_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void hs_v8_stream_bf16(uint16_t *p, hs_v8f v) {
    __m128i t[1];
    hs_v8_store_bf16((uint16_t *)t, v);   /* the store's rounding, then one streaming store */
    _mm_stream_si128((__m128i *)p, _mm_loadu_si128(t));
}
static inline void hs_v_sfence(void) { _mm_sfence(); }
#define HS_W 8
#define HS_SIMD 1
/* The pieces of elementwise.inc's vector exp beyond plain arithmetic, named for both SIMD levels so that
 * its body is written once. A comparison is folded into the select that uses it, since AVX2 compares to
 * a lane mask and AVX-512 to a mask register. */
typedef __m256i hs_vi;
static inline hs_v8f hs_v8_min(hs_v8f a, hs_v8f b) { return _mm256_min_ps(a, b); }
static inline hs_v8f hs_v8_fnma(hs_v8f a, hs_v8f b, hs_v8f c) { return _mm256_fnmadd_ps(a, b, c); }
static inline hs_v8f hs_v8_round(hs_v8f a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* y, with 0 in the lanes where x < c (ordered: a NaN x keeps its lane) */
static inline hs_v8f hs_v8_zero_if_lt(hs_v8f y, hs_v8f x, hs_v8f c) { return _mm256_andnot_ps(_mm256_cmp_ps(x, c, _CMP_LT_OQ), y); }
/* y, with v in the lanes where x > c (ordered) */
static inline hs_v8f hs_v8_set_if_gt(hs_v8f y, hs_v8f x, hs_v8f c, hs_v8f v) {
    return _mm256_blendv_ps(y, v, _mm256_cmp_ps(x, c, _CMP_GT_OQ));
}
static inline hs_vi hs_v8_to_i32(hs_v8f a) { return _mm256_cvtps_epi32(a); }
static inline hs_vi hs_vi_half(hs_vi n) { return _mm256_srai_epi32(n, 1); }
static inline hs_vi hs_vi_sub(hs_vi a, hs_vi b) { return _mm256_sub_epi32(a, b); }
/* 2^n for n in [-126, 127]: the exponent bits alone */
static inline hs_v8f hs_v8_pow2i(hs_vi n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}
#elif defined(HS_AVX512)
/* 16 lanes, same operations and the same results lane for lane as the AVX2 section (vmaxps/vminps keep
 * their rule that the second operand wins when either is NaN; vcvtps2ph rounds as F16C does); only the
 * horizontal reductions add in a different order, having twice the lanes. */
/* HS_BF16DOT (the *_bf16dot.c files, compiled for AVX512_BF16 too) is the AVX-512 level with vdpbf16ps:
 * its own symbols, chosen where hs_cpu_bf16_dot() says so. */
#ifdef HS_BF16DOT
#define HS_FN(name) name##_avx512bf16
#else
#define HS_FN(name) name##_avx512
#endif
#define HS_W 16
#define HS_SIMD 1
typedef __m512 hs_vf;
typedef __m512i hs_vi;
static inline hs_vf hs_v_zero(void) { return _mm512_setzero_ps(); }
static inline hs_vf hs_v_set1(float x) { return _mm512_set1_ps(x); }
static inline hs_vf hs_v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void hs_v_store(float *p, hs_vf v) { _mm512_storeu_ps(p, v); }
static inline hs_vf hs_v_add(hs_vf a, hs_vf b) { return _mm512_add_ps(a, b); }
static inline hs_vf hs_v_sub(hs_vf a, hs_vf b) { return _mm512_sub_ps(a, b); }
static inline hs_vf hs_v_mul(hs_vf a, hs_vf b) { return _mm512_mul_ps(a, b); }
static inline hs_vf hs_v_fma(hs_vf a, hs_vf b, hs_vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline hs_vf hs_v_div(hs_vf a, hs_vf b) { return _mm512_div_ps(a, b); }
static inline hs_vf hs_v_swap_pairs(hs_vf a) { return _mm512_permute_ps(a, 0xb1); }
static inline hs_vf hs_v_dup_even(hs_vf a) { return _mm512_moveldup_ps(a); }
static inline hs_vf hs_v_dup_odd(hs_vf a) { return _mm512_movehdup_ps(a); }
static inline hs_vf hs_v_fmaddsub(hs_vf a, hs_vf b, hs_vf c) { return _mm512_fmaddsub_ps(a, b, c); }
static inline hs_vf hs_v_fnma(hs_vf a, hs_vf b, hs_vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline hs_vf hs_v_max(hs_vf a, hs_vf b) { return _mm512_max_ps(a, b); }
static inline hs_vf hs_v_min(hs_vf a, hs_vf b) { return _mm512_min_ps(a, b); }
/* The two 8-lane halves added lane by lane, then the AVX2 variant's 8-lane order. */
static inline float hs_v_hsum(hs_vf v) {
    return hs__hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
static inline float hs_v_hmax(hs_vf v) {
    return hs__hmax8(_mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
/* vcvtph2ps / vcvtps2ph: the EVEX forms of the F16C instructions, same conversion rule and the same
 * rounding immediate, so bit for bit the AVX2 variant's (and simd.h's scalar reference). */
static inline hs_vf hs_v_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline void hs_v_store_f16(uint16_t *p, hs_vf v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline hs_vf hs_v_load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
/* The AVX2 store's rule, not vcvtneps2bf16 (AVX512_BF16), whose NaN results differ from ml_dtypes'
 * 0x7fc0 | sign: shift with round to nearest even, NaN to the quiet NaN with its sign. */
static inline void hs_v_store_bf16(uint16_t *p, hs_vf v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                  _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
    __m512i qnan = _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), qnan);
    /* every lane is < 2^16, so vpmovdw's truncation to 16 bits is exact */
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}
/* Non-temporal stores, as the AVX2 level's (p aligned to 64 bytes for float32, 32 for the halves). */
static inline void hs_v_stream(float *p, hs_vf v) { _mm512_stream_ps(p, v); }
static inline void hs_v_stream_f16(uint16_t *p, hs_vf v) {
    _mm256_stream_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void hs_v_stream_bf16(uint16_t *p, hs_vf v) {
    __m256i t[1];
    hs_v_store_bf16((uint16_t *)t, v);
    _mm256_stream_si256((__m256i *)p, _mm256_loadu_si256(t));
}
static inline void hs_v_sfence(void) { _mm_sfence(); }
#ifdef HS_BF16DOT
/* Two vectors as 32 bfloat16 at once (p[0..15] from a, p[16..31] from b) with vcvtne2ps2bf16
 * (AVX512_BF16): round to nearest even, as hs_v_store_bf16, and the same bits for every float32 but
 * NaNs (the instruction keeps the top of the payload; ml_dtypes' rule is 0x7fc0 with the sign) and
 * denormals (read as zero; hs_v_store_bf16 rounds them to bfloat16 denormals). A pair holding either
 * (vfpclassps: quiet or signalling NaN, denormal) is stored by hs_v_store_bf16, lane for lane; every
 * other pair, which is all of them in ordinary data, costs one conversion for 32 elements instead of
 * eight integer steps per 16. The streaming form needs p aligned to 64 bytes. */
static inline int hs__bf16_exact_pair(hs_vf a, hs_vf b) {
    return (_mm512_fpclass_ps_mask(a, 0xa1) | _mm512_fpclass_ps_mask(b, 0xa1)) == 0;
}
static inline void hs_v_store2_bf16(uint16_t *p, hs_vf a, hs_vf b) {
    if (__builtin_expect(hs__bf16_exact_pair(a, b), 1)) {
        _mm512_storeu_si512((void *)p, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    } else {
        hs_v_store_bf16(p, a);
        hs_v_store_bf16(p + 16, b);
    }
}
static inline void hs_v_stream2_bf16(uint16_t *p, hs_vf a, hs_vf b) {
    if (__builtin_expect(hs__bf16_exact_pair(a, b), 1)) {
        _mm512_stream_si512((void *)p, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    } else {
        hs_v_stream_bf16(p, a);
        hs_v_stream_bf16(p + 16, b);
    }
}
#endif
static inline hs_vf hs_v_round(hs_vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline hs_vf hs_v_zero_if_lt(hs_vf y, hs_vf x, hs_vf c) {
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, c, _CMP_LT_OQ), _mm512_setzero_ps());
}
static inline hs_vf hs_v_set_if_gt(hs_vf y, hs_vf x, hs_vf c, hs_vf v) {
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, c, _CMP_GT_OQ), v);
}
static inline hs_vi hs_v_to_i32(hs_vf a) { return _mm512_cvtps_epi32(a); }
static inline hs_vi hs_vi_half(hs_vi n) { return _mm512_srai_epi32(n, 1); }
static inline hs_vi hs_vi_sub(hs_vi a, hs_vi b) { return _mm512_sub_epi32(a, b); }
static inline hs_vf hs_v_pow2i(hs_vi n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
}
#else
#define HS_W 8
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
static inline hs_v8f hs_v8_div(hs_v8f a, hs_v8f b) { for (int i = 0; i < 8; i++) a.v[i] /= b.v[i]; return a; }
static inline hs_v8f hs_v8_swap_pairs(hs_v8f a) {
    for (int i = 0; i < 8; i += 2) { float t = a.v[i]; a.v[i] = a.v[i + 1]; a.v[i + 1] = t; }
    return a;
}
static inline hs_v8f hs_v8_dup_even(hs_v8f a) { for (int i = 0; i < 8; i += 2) a.v[i + 1] = a.v[i]; return a; }
static inline hs_v8f hs_v8_dup_odd(hs_v8f a) { for (int i = 0; i < 8; i += 2) a.v[i] = a.v[i + 1]; return a; }
static inline hs_v8f hs_v8_fmaddsub(hs_v8f a, hs_v8f b, hs_v8f c) {
    for (int i = 0; i < 8; i++) a.v[i] = a.v[i] * b.v[i] + (i & 1 ? c.v[i] : -c.v[i]);
    return a;
}
/* Same NaN rule as _mm256_max_ps (and _mm512_max_ps): when either lane is NaN the second operand
 * wins. Kernels that need NumPy's NaN propagation must check NaN explicitly, at every level. */
static inline hs_v8f hs_v8_max(hs_v8f a, hs_v8f b) { for (int i = 0; i < 8; i++) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
static inline float hs_v8_hsum(hs_v8f a) {
    return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
static inline float hs_v8_hmax(hs_v8f a) { float m = a.v[0]; for (int i = 1; i < 8; i++) m = a.v[i] > m ? a.v[i] : m; return m; }
static inline hs_v8f hs_v8_load_f16(const uint16_t *p) { hs_v8f r; for (int i = 0; i < 8; i++) r.v[i] = hs_f16_to_f32(p[i]); return r; }
static inline void hs_v8_store_f16(uint16_t *p, hs_v8f a) { for (int i = 0; i < 8; i++) p[i] = hs_f32_to_f16(a.v[i]); }
static inline hs_v8f hs_v8_load_bf16(const uint16_t *p) { hs_v8f r; for (int i = 0; i < 8; i++) r.v[i] = hs_bf16_to_f32(p[i]); return r; }
static inline void hs_v8_store_bf16(uint16_t *p, hs_v8f a) { for (int i = 0; i < 8; i++) p[i] = hs_f32_to_bf16(a.v[i]); }
/* The portable level has no streaming stores: plain ones. */
static inline void hs_v8_stream(float *p, hs_v8f v) { hs_v8_store(p, v); }
static inline void hs_v8_stream_f16(uint16_t *p, hs_v8f v) { hs_v8_store_f16(p, v); }
static inline void hs_v8_stream_bf16(uint16_t *p, hs_v8f v) { hs_v8_store_bf16(p, v); }
static inline void hs_v_sfence(void) {}
#endif

#if HS_W == 8
/* The generic names at 8 lanes are the hs_v8 ones (the pieces of the exp exist under HS_AVX2 only). */
typedef hs_v8f hs_vf;
#define hs_v_zero hs_v8_zero
#define hs_v_set1 hs_v8_set1
#define hs_v_load hs_v8_load
#define hs_v_store hs_v8_store
#define hs_v_add hs_v8_add
#define hs_v_sub hs_v8_sub
#define hs_v_mul hs_v8_mul
#define hs_v_fma hs_v8_fma
#define hs_v_div hs_v8_div
#define hs_v_swap_pairs hs_v8_swap_pairs
#define hs_v_dup_even hs_v8_dup_even
#define hs_v_dup_odd hs_v8_dup_odd
#define hs_v_fmaddsub hs_v8_fmaddsub
#define hs_v_max hs_v8_max
#define hs_v_hsum hs_v8_hsum
#define hs_v_hmax hs_v8_hmax
#define hs_v_load_f16 hs_v8_load_f16
#define hs_v_store_f16 hs_v8_store_f16
#define hs_v_load_bf16 hs_v8_load_bf16
#define hs_v_store_bf16 hs_v8_store_bf16
#define hs_v_stream hs_v8_stream
#define hs_v_stream_f16 hs_v8_stream_f16
#define hs_v_stream_bf16 hs_v8_stream_bf16
#ifdef HS_AVX2
#define hs_v_min hs_v8_min
#define hs_v_fnma hs_v8_fnma
#define hs_v_round hs_v8_round
#define hs_v_zero_if_lt hs_v8_zero_if_lt
#define hs_v_set_if_gt hs_v8_set_if_gt
#define hs_v_to_i32 hs_v8_to_i32
#define hs_v_pow2i hs_v8_pow2i
#endif
#endif

#ifndef HS_BF16DOT
/* Two vectors of bfloat16 (p[0..HS_W-1] from a, then b): two stores of one; the AVX512_BF16 build
 * (HS_BF16DOT) converts both in one instruction (above). */
static inline void hs_v_store2_bf16(uint16_t *p, hs_vf a, hs_vf b) { hs_v_store_bf16(p, a); hs_v_store_bf16(p + HS_W, b); }
static inline void hs_v_stream2_bf16(uint16_t *p, hs_vf a, hs_vf b) { hs_v_stream_bf16(p, a); hs_v_stream_bf16(p + HS_W, b); }
#endif
#endif
