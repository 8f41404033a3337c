// hipsched kernel prelude: prepended (by hipsched.gpu.kernels) to every src_c/hip/*.hip source, so one
// source compiles with hiprtc (AMD) and NVRTC (NVIDIA, HIP's NVIDIA path). NVRTC sees no headers at all,
// so everything a kernel needs beyond the compiler built-ins is spelled out here. Kernels must not
// #include anything; they are `HS_KERNEL` (extern "C" __global__) so their names are stable.
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
