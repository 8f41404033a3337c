// hipsched kernel prelude: prepended (by hipsched.gpu.compilation.kernels) to every src_c/hip/*.hip source, so one
// source compiles with hiprtc (AMD) and NVRTC (NVIDIA, HIP's NVIDIA path). NVRTC sees no headers at all,
// so everything a kernel needs beyond the compiler built-ins is spelled out here. Kernels must not
// #include anything; they are `HS_KERNEL` (extern "C" __global__) so their names are stable.
// The numbers the kernels share with their launch glue are not defined here or in any .hip file: they are
// hipsched/gpu/compilation/kernel_constants.py's, whose `#define`s come before this file (HS_MFMA_TARGET,
// HS_MMA_MIN_CUDA_ARCH) and after it (the rest).
#if defined(__HIPCC_RTC__) || defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)
#define HS_AMD 1
#ifdef __AMDGCN_WAVEFRONT_SIZE
#define HS_WARP __AMDGCN_WAVEFRONT_SIZE   /* 64 on gfx9 (GCN/CDNA), 32 on gfx10+ (RDNA) */
#else
#define HS_WARP 64
#endif
#define HS_SHFL_DOWN(v, d) __shfl_down((v), (d), HS_WARP)
#define HS_SHFL_XOR(v, m) __shfl_xor((v), (m), HS_WARP)
#define HS_SHFL(v, src) __shfl((v), (src), HS_WARP)
#else
#define HS_NVIDIA 1
#define HS_WARP 32
#define HS_SHFL_DOWN(v, d) __shfl_down_sync(0xffffffffu, (v), (d), 32)
#define HS_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
#define HS_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src), 32)
#endif

#define HS_KERNEL extern "C" __global__
#define HS_DEV __device__ __forceinline__
#define HS_MAX_THREADS 1024
#define HS_MAX_WARPS (HS_MAX_THREADS / 32)   /* scratch slots for a block reduce, either vendor */

typedef long long hs_i64;
typedef unsigned long long hs_u64;
typedef int hs_i32;
typedef unsigned int hs_u32;
typedef unsigned short hs_u16;
typedef unsigned char hs_u8;
typedef signed char hs_i8;

#define HS_FLT_MAX 3.402823466e+38f
#define HS_INF __int_as_float(0x7f800000)
#define HS_NAN __int_as_float(0x7fc00000)

HS_DEV bool hs_isnan(float x) { return x != x; }
HS_DEV float hs_exp(float x) { return expf(x); }      // accurate expf: results must match the CPU engine
HS_DEV float hs_sqrt(float x) { return sqrtf(x); }

// 64-bit grid-stride indexing: sizes may pass 2^31 elements.
HS_DEV hs_i64 hs_gid() { return (hs_i64)blockIdx.x * blockDim.x + threadIdx.x; }
HS_DEV hs_i64 hs_gstride() { return (hs_i64)gridDim.x * blockDim.x; }

struct HsSum { static HS_DEV float op(float a, float b) { return a + b; } static HS_DEV float id() { return 0.0f; } };
// max that propagates NaN (fmaxf would drop it), as the CPU engine's max does.
struct HsMax {
    static HS_DEV float op(float a, float b) { return (a != a || a > b) ? a : b; }
    static HS_DEV float id() { return -HS_INF; }
};

// Every lane ends with the reduction of the whole warp.
template <class R> HS_DEV float hs_warp_reduce(float v) {
#pragma unroll
    for (int o = HS_WARP / 2; o > 0; o >>= 1) v = R::op(v, HS_SHFL_XOR(v, o));
    return v;
}

// Reduction over a 1-D block, result returned to every thread. All threads of the block must call it;
// `scratch` is __shared__ float[HS_MAX_WARPS] and may be reused by the next call (it syncs first).
template <class R> HS_DEV float hs_block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x % HS_WARP, wid = threadIdx.x / HS_WARP;
    const int nw = (blockDim.x + HS_WARP - 1) / HS_WARP;
    v = hs_warp_reduce<R>(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? scratch[lane] : R::id();
        v = hs_warp_reduce<R>(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}
HS_DEV float hs_block_sum(float v, float* scratch) { return hs_block_reduce<HsSum>(v, scratch); }
HS_DEV float hs_block_max(float v, float* scratch) { return hs_block_reduce<HsMax>(v, scratch); }

// ---------------------------------------------------------------------------------------- half precision
// float16 and bfloat16 live in memory as 16-bit patterns and are float32 in registers: every kernel
// loads with hs_ld, computes and accumulates in float, and rounds once with hs_st<T> on the store.
// Our own 2-byte types rather than __half / __hip_bfloat16 / __nv_bfloat16, because under runtime
// compilation without include paths (what we do) NVRTC has neither cuda_fp16.h nor cuda_bf16.h, and
// ROCm 5.2's hiprtc predefines __half (including hip_fp16.h is a redefinition error) but has no bf16
// type at all. The bit layouts are the same, so device arrays from PyTorch or CuPy are read as they are.
struct hs_half { hs_u16 bits; };
struct hs_bf16 { hs_u16 bits; };
// Four elements in one load: 16 bytes of float, 8 of a half type (the glue's alignment check covers both).
struct alignas(8) hs_half4 { hs_half v[4]; };
struct alignas(8) hs_bf16x4 { hs_bf16 v[4]; };

// Conversions, bit-exact with NumPy/ml_dtypes/PyTorch on every finite and infinite value: round to
// nearest even, float16 overflow to inf (as the format says, and as PyTorch's .half() gives). NaN stays
// NaN (quiet; the payload may differ). The hardware instructions round the same way (IEEE RNE); the
// software forms are what a target without them (the CPU emulator) runs.
#if defined(HS_SOFT_HALF)
HS_DEV float hs_half_to_float(hs_u16 h) {
    const hs_u32 sign = (hs_u32)(h & 0x8000u) << 16, em = h & 0x7fffu;
    if (em >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));   // inf, NaN
    if (em >= 0x0400u) return __uint_as_float(sign | ((em << 13) + 0x38000000u));            // normal
    return __uint_as_float(sign | __float_as_uint((float)em * 5.9604644775390625e-08f));      // em * 2^-24, exact
}
HS_DEV hs_u16 hs_float_to_half(float f) {
    hs_u32 u = __float_as_uint(f);
    const hs_u32 sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return (hs_u16)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));   // NaN, made quiet
    if (u >= 0x477ff000u) return (hs_u16)(sign | 0x7c00u);   // >= 65520 rounds past the largest half
    if (u < 0x38800000u) {
        // below 2^-14: a float add aligns the value to half's subnormal step (2^-24) and rounds to
        // nearest even in hardware; the low mantissa bits of 0.5f + |f| are then the half's bits.
        return (hs_u16)(sign | (__float_as_uint(__uint_as_float(u) + 0.5f) - 0x3f000000u));
    }
    // rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest, ties to the even result
    u += 0xc8000fffu + ((u >> 13) & 1u);
    return (hs_u16)(sign | (u >> 13));
}
#elif defined(HS_AMD)
// clang's _Float16 is a native type on every AMD GPU target: v_cvt_f32_f16 / v_cvt_f16_f32 (RNE).
HS_DEV float hs_half_to_float(hs_u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
HS_DEV hs_u16 hs_float_to_half(float f) { return __builtin_bit_cast(hs_u16, (_Float16)f); }
#else
HS_DEV float hs_half_to_float(hs_u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
HS_DEV hs_u16 hs_float_to_half(float f) { hs_u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif

HS_DEV float hs_bf16_to_float(hs_u16 b) { return __uint_as_float((hs_u32)b << 16); }
// Integer rounding everywhere (sm_80's cvt.rn.bf16.f32 would do, but gfx9 has no such instruction and
// this is a handful of integer operations on a bandwidth-bound path).
HS_DEV hs_u16 hs_float_to_bf16(float f) {
    const hs_u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (hs_u16)((u >> 16) | 0x40u);   // NaN, made quiet
    return (hs_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);   // ties to even; overflow carries into inf
}

HS_DEV float hs_ld(float v) { return v; }
HS_DEV float hs_ld(hs_half v) { return hs_half_to_float(v.bits); }
HS_DEV float hs_ld(hs_bf16 v) { return hs_bf16_to_float(v.bits); }
template <class T> struct HsRound;
template <> struct HsRound<float> { static HS_DEV float st(float v) { return v; } };
template <> struct HsRound<hs_half> { static HS_DEV hs_half st(float v) { hs_half h; h.bits = hs_float_to_half(v); return h; } };
template <> struct HsRound<hs_bf16> { static HS_DEV hs_bf16 st(float v) { hs_bf16 h; h.bits = hs_float_to_bf16(v); return h; } };
// The element type T nearest to v (float: v itself).
template <class T> HS_DEV T hs_st(float v) { return HsRound<T>::st(v); }

// Four consecutive elements as one aligned load/store, widened to / rounded from a float4.
template <class T> struct HsPack4;
template <> struct HsPack4<float> {
    typedef float4 P;
    static HS_DEV float4 ld(const P& p) { return p; }
    static HS_DEV P st(float4 v) { return v; }
};
template <class T, class P4> struct HsPack4Half {
    typedef P4 P;
    static HS_DEV float4 ld(const P& p) { return make_float4(hs_ld(p.v[0]), hs_ld(p.v[1]), hs_ld(p.v[2]), hs_ld(p.v[3])); }
    static HS_DEV P st(float4 v) {
        P p;
        p.v[0] = hs_st<T>(v.x); p.v[1] = hs_st<T>(v.y); p.v[2] = hs_st<T>(v.z); p.v[3] = hs_st<T>(v.w);
        return p;
    }
};
template <> struct HsPack4<hs_half> : HsPack4Half<hs_half, hs_half4> {};
template <> struct HsPack4<hs_bf16> : HsPack4Half<hs_bf16, hs_bf16x4> {};
// Element i of the float4 view of x (x 16-byte aligned for float, 8 for the half types).
template <class T> HS_DEV float4 hs_ld4(const T* x, hs_i64 i) {
    return HsPack4<T>::ld(((const typename HsPack4<T>::P*)x)[i]);
}
template <class T> HS_DEV void hs_st4(T* y, hs_i64 i, float4 v) { ((typename HsPack4<T>::P*)y)[i] = HsPack4<T>::st(v); }

// Stamps a kernel family once per element type: M(S, T) with the name suffix S (kernels are named
// hs_<op>_##S[##_<variant>], which hipsched.gpu.compilation.kernels.kernel_names expands) and the element type T.
#define HS_FOR_EACH_FLOAT(M) M(f32, float) M(f16, hs_half) M(bf16, hs_bf16)

// ------------------------------------------------------------------ 16-byte packs: 8 elements per access
// The bandwidth-bound kernels (elementwise, softmax, rms_norm) move data in 16-byte global accesses, the
// widest one load or store instruction makes (LDG.E.128 / STG.E.128 on NVIDIA, global_load_dwordx4 on
// AMD): fewer instructions and more bytes in flight per thread than 4- or 8-byte accesses. A pack is 8
// consecutive elements: one 16-byte access of a half type, two of float32. Giving every type the same
// 8 elements per pack keeps each thread's elements, and so the order of any reduction over them, the
// same across types: a half kernel's result is the float32 kernel's on the widened inputs, rounded.
// The 16 bytes travel as a float4, the vector type both compilers (and the emulator) know, as raw bits:
// moving bits through float registers changes none of them, NaN payloads included.
template <class T> struct HsBits;   // a half type's 16-bit pattern to and from float
template <> struct HsBits<hs_half> {
    static HS_DEV float widen(hs_u32 b) { return hs_half_to_float((hs_u16)b); }
    static HS_DEV hs_u32 round(float v) { return hs_float_to_half(v); }
};
template <> struct HsBits<hs_bf16> {
    static HS_DEV float widen(hs_u32 b) { return hs_bf16_to_float((hs_u16)b); }
    static HS_DEV hs_u32 round(float v) { return hs_float_to_bf16(v); }
};

template <class T> struct HsPack8 {   // hs_half, hs_bf16: one 16-byte access, element 2k in word k's low half
    static HS_DEV void ld(const T* x, hs_i64 p, float (&v)[8]) {
        const float4 w = ((const float4*)x)[p];
        const hs_u32 u[4] = {__float_as_uint(w.x), __float_as_uint(w.y), __float_as_uint(w.z), __float_as_uint(w.w)};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = HsBits<T>::widen(u[k] & 0xffffu);
            v[2 * k + 1] = HsBits<T>::widen(u[k] >> 16);
        }
    }
    static HS_DEV void st(T* y, hs_i64 p, const float (&v)[8]) {
        hs_u32 u[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) u[k] = HsBits<T>::round(v[2 * k]) | (HsBits<T>::round(v[2 * k + 1]) << 16);
        ((float4*)y)[p] = make_float4(__uint_as_float(u[0]), __uint_as_float(u[1]), __uint_as_float(u[2]),
                                      __uint_as_float(u[3]));
    }
};
template <> struct HsPack8<float> {   // two 16-byte accesses
    static HS_DEV void ld(const float* x, hs_i64 p, float (&v)[8]) {
        const float4 a = ((const float4*)x)[2 * p], b = ((const float4*)x)[2 * p + 1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
    static HS_DEV void st(float* y, hs_i64 p, const float (&v)[8]) {
        ((float4*)y)[2 * p] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4*)y)[2 * p + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
};
// Pack p (elements 8p .. 8p+7) of x, widened to float / rounded from float into y; x and y 16-byte aligned.
template <class T> HS_DEV void hs_ld8(const T* x, hs_i64 p, float (&v)[8]) { HsPack8<T>::ld(x, p, v); }
template <class T> HS_DEV void hs_st8(T* y, hs_i64 p, const float (&v)[8]) { HsPack8<T>::st(y, p, v); }
// The sum of a pack in one fixed order (pairwise), the same for every element type.
HS_DEV float hs_sum8(const float (&v)[8]) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// ---------------------------------------------------------------------------------------- warp matrix
// Matrix-core fragments for the attention kernels (src_c/hip/attention.hip): NVIDIA's mma.sync m16n8k16
// at warp 32 (HS_MMA_M16N8K16) and AMD's MFMA 16x16x16 at wavefront 64 (HS_MFMA_16X16X16). Each
// vendor's fragment layout is its ISA's; the kernels index fragments by these tables, so each vendor's
// kernel body is written for its own layout and shares only these functions' names and the packing.
//
// NVIDIA, the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating point type": with g = lane / 4
// and t = lane % 4, each 32-bit register holds two 16-bit elements, the lower-indexed one in the low half:
//   A (16 x 16, row):  a0 = A[g][2t..2t+1]  a1 = A[g+8][2t..]  a2 = A[g][2t+8..]  a3 = A[g+8][2t+8..]
//   B (16 x 8, col):   b0 = B[2t..2t+1][g]  b1 = B[2t+8..2t+9][g]
//   C, D (16 x 8, f32): c0, c1 = C[g][2t], C[g][2t+1]   c2, c3 = C[g+8][2t], C[g+8][2t+1]
// Two C tiles side by side (columns 0-7, 8-15) are, element for element, one A fragment of 16 x 16: a
// product's result feeds the next product as A without leaving the registers.
// HS_MMA_M16N8K16: the target has them (sm_80+: the bf16 form and cp.async are sm_80's), or the kernel
// emulator (tests/support/gpu_emulator.py) defines HS_EMU_WARP_MATRIX and implements the same operations
// on the CPU in its shim: the kernels then run unchanged, lane for lane.
//
// AMD, v_mfma_f32_16x16x16{f16,bf16_1k} (the CDNA ISA's dense matrix layouts, as AMD's matrix
// instruction calculator prints them): with i = lane % 16 and q = lane / 16, two 32-bit registers hold
// four 16-bit elements, k = 4q .. 4q + 3 in order, the lower k in the low half:
//   A (16 x 16):  A[i][4q .. 4q+3]      B (16 x 16):  B[4q .. 4q+3][i]
//   C, D (16 x 16, f32): c0..c3 = C[4q .. 4q+3][i]
// C holds its columns as A and B hold their rows: a product's D is, element for element, the B (and A)
// fragment of its transpose. So the AMD kernel computes S^T = K Q^T and O^T = V^T P^T, and every value
// a lane holds belongs to one query row (i).
// HS_MFMA_16X16X16: CDNA targets (HS_MFMA_TARGET, from kernel_constants.py's MFMA_TARGETS: gfx908, gfx90a,
// gfx940-942), or the emulator at wavefront 64. gfx908
// (CDNA1) has the float16 instruction but no 16x16x16 bfloat16 one: its bfloat16 product is two
// v_mfma_f32_16x16x8bf16 (A[i][2q..2q+1] per lane), one on each register: the first multiplies the
// k = 4q, 4q+1 elements, the second 4q+2, 4q+3, so together they sum all 16 products, in another order.
// RDNA3's WMMA (gfx11xx) is not used (kernel_constants.py says why); gfx10xx/gfx11xx and other targets run
// the SIMT kernels (the glue picks them, hipsched/gpu/glue/attention.py). HS_MMA_MIN_CUDA_ARCH: sm_80.
#if defined(HS_NVIDIA) && (defined(HS_EMU_WARP_MATRIX) || __CUDA_ARCH__ >= HS_MMA_MIN_CUDA_ARCH)
#define HS_MMA_M16N8K16 1
#endif
#if defined(HS_AMD) && (defined(HS_EMU_WARP_MATRIX) || defined(HS_MFMA_TARGET))
#define HS_MFMA_16X16X16 1
#endif

#if defined(HS_MMA_M16N8K16) || defined(HS_MFMA_16X16X16)
// Two floats rounded to the 16-bit type T (nearest even, as hs_st<T>) in one register: lo in the low half.
template <class T> HS_DEV hs_u32 hs_pack2(float lo, float hi);
#if defined(HS_NVIDIA) && !defined(HS_EMU_WARP_MATRIX)
// cvt.rn.{f16x2,bf16x2}.f32 d, a, b puts a in the upper half: hi first
template <> HS_DEV hs_u32 hs_pack2<hs_half>(float lo, float hi) {
    hs_u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
template <> HS_DEV hs_u32 hs_pack2<hs_bf16>(float lo, float hi) {
    hs_u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
#else
// AMD's hs_float_to_half is v_cvt_f16_f32 (CDNA has no packed bf16 conversion: the integer rounding)
template <> HS_DEV hs_u32 hs_pack2<hs_half>(float lo, float hi) {
    return (hs_u32)hs_float_to_half(lo) | ((hs_u32)hs_float_to_half(hi) << 16);
}
template <> HS_DEV hs_u32 hs_pack2<hs_bf16>(float lo, float hi) {
    return (hs_u32)hs_float_to_bf16(lo) | ((hs_u32)hs_float_to_bf16(hi) << 16);
}
#endif
// The two elements of a packed register, widened (exact).
template <class T> HS_DEV float hs_unpack_lo(hs_u32 r) { T e; e.bits = (hs_u16)(r & 0xffffu); return hs_ld(e); }
template <class T> HS_DEV float hs_unpack_hi(hs_u32 r) { T e; e.bits = (hs_u16)(r >> 16); return hs_ld(e); }
#endif

#if defined(HS_MFMA_16X16X16)
// d = a * b + c, one 16x16x16 product (a, b: 2 registers each, d: 4 floats): the products of the 16-bit
// inputs are exact, the sums float32.
template <class T> HS_DEV void hs_mfma_16x16x16(float* d, const hs_u32* a, const hs_u32* b);
#if defined(HS_EMU_WARP_MATRIX)
template <> HS_DEV void hs_mfma_16x16x16<hs_half>(float* d, const hs_u32* a, const hs_u32* b) { emu_mfma_16x16x16(d, a, b, false); }
template <> HS_DEV void hs_mfma_16x16x16<hs_bf16>(float* d, const hs_u32* a, const hs_u32* b) { emu_mfma_16x16x16(d, a, b, true); }
#else
typedef float hs_f32x4 __attribute__((ext_vector_type(4)));
typedef _Float16 hs_f16x4 __attribute__((ext_vector_type(4)));
typedef short hs_i16x4 __attribute__((ext_vector_type(4)));
typedef short hs_i16x2 __attribute__((ext_vector_type(2)));
HS_DEV hs_u64 hs_u64_of(const hs_u32* r) { return (hs_u64)r[0] | ((hs_u64)r[1] << 32); }
template <> HS_DEV void hs_mfma_16x16x16<hs_half>(float* d, const hs_u32* a, const hs_u32* b) {
    hs_f32x4 c = {d[0], d[1], d[2], d[3]};
    c = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(hs_f16x4, hs_u64_of(a)),
                                              __builtin_bit_cast(hs_f16x4, hs_u64_of(b)), c, 0, 0, 0);
    d[0] = c[0]; d[1] = c[1]; d[2] = c[2]; d[3] = c[3];
}
template <> HS_DEV void hs_mfma_16x16x16<hs_bf16>(float* d, const hs_u32* a, const hs_u32* b) {
    hs_f32x4 c = {d[0], d[1], d[2], d[3]};
#if defined(__gfx908__)
    c = __builtin_amdgcn_mfma_f32_16x16x8bf16(__builtin_bit_cast(hs_i16x2, a[0]), __builtin_bit_cast(hs_i16x2, b[0]), c, 0, 0, 0);
    c = __builtin_amdgcn_mfma_f32_16x16x8bf16(__builtin_bit_cast(hs_i16x2, a[1]), __builtin_bit_cast(hs_i16x2, b[1]), c, 0, 0, 0);
#else
    c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(hs_i16x4, hs_u64_of(a)),
                                                  __builtin_bit_cast(hs_i16x4, hs_u64_of(b)), c, 0, 0, 0);
#endif
    d[0] = c[0]; d[1] = c[1]; d[2] = c[2]; d[3] = c[3];
}
#endif
#endif  // HS_MFMA_16X16X16

#if defined(HS_MMA_M16N8K16)
// d = a * b + c, one m16n8k16 product: the products of the 16-bit inputs are exact, the sums float32.
template <class T> HS_DEV void hs_mma_16816(float* d, const hs_u32* a, const hs_u32* b);
#if defined(HS_EMU_WARP_MATRIX)
template <> HS_DEV void hs_mma_16816<hs_half>(float* d, const hs_u32* a, const hs_u32* b) { emu_mma_m16n8k16(d, a, b, false); }
template <> HS_DEV void hs_mma_16816<hs_bf16>(float* d, const hs_u32* a, const hs_u32* b) { emu_mma_m16n8k16(d, a, b, true); }
#else
template <> HS_DEV void hs_mma_16816<hs_half>(float* d, const hs_u32* a, const hs_u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> HS_DEV void hs_mma_16816<hs_bf16>(float* d, const hs_u32* a, const hs_u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Four 8 x 8 matrices of 16-bit elements from shared memory (ldmatrix .x4): lanes 8i..8i+7 give the
// addresses of matrix i's rows (16 bytes each, 16-byte aligned); r[i] of lane l is then matrix i's
// row l/4, elements 2(l%4) and 2(l%4)+1 (a B fragment of a row-major K tile), or with `trans` the same
// of the transposed matrix: elements (2(l%4), l/4) and (2(l%4)+1, l/4) (a B fragment of a row-major V).
#if defined(HS_EMU_WARP_MATRIX)
HS_DEV void hs_ldsm_x4(hs_u32* r, const void* row) { emu_ldmatrix_x4(r, row, false); }
HS_DEV void hs_ldsm_x4_trans(hs_u32* r, const void* row) { emu_ldmatrix_x4(r, row, true); }
#else
HS_DEV hs_u32 hs_smem_addr(const void* p) {
    hs_u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
HS_DEV void hs_ldsm_x4(hs_u32* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(hs_smem_addr(row)));
}
HS_DEV void hs_ldsm_x4_trans(hs_u32* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(hs_smem_addr(row)));
}
#endif

// 16 bytes global -> shared without passing through registers (cp.async, sm_80+), completed in groups:
// hs_cp_async_commit closes a group, hs_cp_async_wait<N> waits until at most N groups are in flight
// (then a __syncthreads makes every thread's copies visible to the block). The plain form (the
// emulator) copies at once; its commit and wait have nothing to do.
#if defined(HS_EMU_WARP_MATRIX)
HS_DEV void hs_cp_async16(void* smem, const void* gmem) {
    ((hs_u64*)smem)[0] = ((const hs_u64*)gmem)[0];
    ((hs_u64*)smem)[1] = ((const hs_u64*)gmem)[1];
}
HS_DEV void hs_cp_async_commit() {}
template <int N> HS_DEV void hs_cp_async_wait() {}
#else
HS_DEV void hs_cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(hs_smem_addr(smem)), "l"(gmem) : "memory");
}
HS_DEV void hs_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> HS_DEV void hs_cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
#endif
#endif  // HS_MMA_M16N8K16

// ------------------------------------------------------------------ 16 x 16 tiles, either vendor
// One product that a kernel body can be written against once for both vendors (quant.hip's
// hs_qmatmat_*_mma_*): C (16 x 16, float32) += A (16 x 16) B (16 x 16) in the 16-bit type T, with both
// operands in shared memory stored k-contiguous, A as its rows and B as its columns (row i of B's tile is
// column i of B). Both vendors' fragments hold pairs of consecutive k in a register, so in that storage one
// load routine serves A and B alike. NVIDIA: two m16n8k16 (B's columns 0-7, then 8-15), fragments by
// ldmatrix .x4; AMD: one MFMA 16x16x16, a fragment one 8-byte LDS read. A fragment is HS_MM16_REGS
// registers, an accumulator HS_MM16_ACC floats, its element e being C[hs_mm16_row(e)][hs_mm16_col(e)].
#if defined(HS_MMA_M16N8K16) || defined(HS_MFMA_16X16X16)
#define HS_MM16 1
#if defined(HS_MMA_M16N8K16)
#define HS_MM16_REGS 4
#define HS_MM16_ACC 8
// `tile`: the operand's 16 x 16 corner, rows `ld` elements apart, 16-byte aligned (ld a multiple of 8).
// Lane l points ldmatrix at row l % 8 + 8 ((l / 8) % 2), column 8 (l / 16), so r[0..3] are the 8 x 8
// matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15): for A the
// m16n8k16 registers a0..a3; for B (rows = B's columns) b0, b1 of columns 0-7 in r[0], r[2] and of
// columns 8-15 in r[1], r[3].
HS_DEV void hs_mm16_frag(hs_u32* r, const hs_u16* tile, int ld) {
    const int l = threadIdx.x % 32;
    hs_ldsm_x4(r, tile + (l % 8 + 8 * ((l / 8) % 2)) * ld + 8 * (l / 16));
}
template <class T> HS_DEV void hs_mm16(float* c, const hs_u32* a, const hs_u32* b) {
    const hs_u32 lo[2] = {b[0], b[2]}, hi[2] = {b[1], b[3]};
    hs_mma_16816<T>(c, a, lo);
    hs_mma_16816<T>(c + 4, a, hi);
}
HS_DEV int hs_mm16_row(int e) { return (int)(threadIdx.x % 32) / 4 + 8 * ((e / 2) % 2); }
HS_DEV int hs_mm16_col(int e) { return 2 * (int)(threadIdx.x % 4) + e % 2 + 8 * (e / 4); }
#else
#define HS_MM16_REGS 2
#define HS_MM16_ACC 4
// `tile` as above, 8-byte aligned (ld a multiple of 4): lane l reads row l % 16, k 4 (l / 16) .. + 3,
// which is A[i][4q..4q+3] for A and B[4q..4q+3][i] for B in the MFMA layout.
HS_DEV void hs_mm16_frag(hs_u32* r, const hs_u16* tile, int ld) {
    const int l = threadIdx.x % 64;
    const hs_u64 w = *reinterpret_cast<const hs_u64*>(tile + (l % 16) * ld + 4 * (l / 16));
    r[0] = (hs_u32)w;
    r[1] = (hs_u32)(w >> 32);
}
template <class T> HS_DEV void hs_mm16(float* c, const hs_u32* a, const hs_u32* b) { hs_mfma_16x16x16<T>(c, a, b); }
HS_DEV int hs_mm16_row(int e) { return 4 * ((int)(threadIdx.x % 64) / 16) + e; }
HS_DEV int hs_mm16_col(int) { return (int)(threadIdx.x % 16); }
#endif
#endif  // HS_MM16
