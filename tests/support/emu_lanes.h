/* simd.h's width-generic vector emulated as EMU_W plain floats (8 or 16), for the width tests
 * (tests/cpu/test_*_widths.py): a kernel body compiled with it runs its AVX-512 shape (HS_W 16) on any
 * machine. Include after simd.h with no level macro (its scalar section), whose 8-lane names this
 * replaces. Each lane does what each SIMD level does lane by lane: FMA through fmaf (one rounding, as
 * vfmadd), max with vmaxps's rule (the second operand wins on NaN), halves through simd.h's scalar
 * conversions (bit for bit F16C's and the shift rule: tools/simd_exhaustive), the horizontal sum in
 * simd.h's hs__hsum8 order (16 lanes fold their halves first, as the AVX-512 hs_v_hsum does). */
#ifndef EMU_LANES_H
#define EMU_LANES_H
#undef HS_W
#undef HS_FN
#undef hs_v_zero
#undef hs_v_set1
#undef hs_v_load
#undef hs_v_store
#undef hs_v_add
#undef hs_v_sub
#undef hs_v_mul
#undef hs_v_fma
#undef hs_v_max
#undef hs_v_hsum
#undef hs_v_load_f16
#undef hs_v_store_f16
#undef hs_v_load_bf16
#undef hs_v_store_bf16
#define HS_W EMU_W
#define HS_FN(name) name##_emu
typedef struct { float v[EMU_W]; } emu_vf;
#define hs_vf emu_vf
#define EMU_L for (int i = 0; i < EMU_W; i++)
static inline emu_vf hs_v_zero(void) { emu_vf r; EMU_L r.v[i] = 0.f; return r; }
static inline emu_vf hs_v_set1(float x) { emu_vf r; EMU_L r.v[i] = x; return r; }
static inline emu_vf hs_v_load(const float *p) { emu_vf r; EMU_L r.v[i] = p[i]; return r; }
static inline void hs_v_store(float *p, emu_vf a) { EMU_L p[i] = a.v[i]; }
static inline emu_vf hs_v_add(emu_vf a, emu_vf b) { EMU_L a.v[i] += b.v[i]; return a; }
static inline emu_vf hs_v_sub(emu_vf a, emu_vf b) { EMU_L a.v[i] -= b.v[i]; return a; }
static inline emu_vf hs_v_mul(emu_vf a, emu_vf b) { EMU_L a.v[i] *= b.v[i]; return a; }
static inline emu_vf hs_v_fma(emu_vf a, emu_vf b, emu_vf c) { EMU_L c.v[i] = fmaf(a.v[i], b.v[i], c.v[i]); return c; }
static inline emu_vf hs_v_max(emu_vf a, emu_vf b) { EMU_L a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
static inline float hs_v_hsum(emu_vf a) {
    float s[8];
    for (int i = 0; i < 8; i++) s[i] = EMU_W == 16 ? a.v[i] + a.v[(i + 8) % EMU_W] : a.v[i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}
static inline emu_vf hs_v_load_f16(const uint16_t *p) { emu_vf r; EMU_L r.v[i] = hs_f16_to_f32(p[i]); return r; }
static inline void hs_v_store_f16(uint16_t *p, emu_vf a) { EMU_L p[i] = hs_f32_to_f16(a.v[i]); }
static inline emu_vf hs_v_load_bf16(const uint16_t *p) { emu_vf r; EMU_L r.v[i] = hs_bf16_to_f32(p[i]); return r; }
static inline void hs_v_store_bf16(uint16_t *p, emu_vf a) { EMU_L p[i] = hs_f32_to_bf16(a.v[i]); }
#endif
