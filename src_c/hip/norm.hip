// RMS norm over the last axis of a (rows, len) row-major x: y = x / sqrt(mean(x^2) + eps) * w.
// The sum of squares and each product are formed in double and rounded to float once, as the CPU
// engine does, so both give the float64 formula within float32 rounding (they can differ only where
// the order of the double sum moves a result across a float rounding boundary).

// prelude.h's block reduce is float-only; this is the same idiom (shuffle tree per warp, one slot per
// warp in shared memory, the first warp reduces the slots) for a double, for warp 32 and 64 alike.
HS_DEV double hs_warp_sum_f64(double v) {
#pragma unroll
    for (int o = HS_WARP / 2; o > 0; o >>= 1) v += HS_SHFL_XOR(v, o);
    return v;
}

// Every thread of the block must call it; `scratch` is __shared__ double[HS_MAX_WARPS] and may be
// reused by the next call (it syncs before writing).
HS_DEV double hs_block_sum_f64(double v, double* scratch) {
    const int lane = threadIdx.x % HS_WARP, wid = threadIdx.x / HS_WARP;
    const int nw = (blockDim.x + HS_WARP - 1) / HS_WARP;
    v = hs_warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? scratch[lane] : 0.0;
        v = hs_warp_sum_f64(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}

// One block per row; the grid strides over further rows. float32, float16 and bfloat16 (suffix
// f32/f16/bf16; x, w and y of one type): halves are widened exactly, the arithmetic is the float32
// kernel's, and the result is rounded to float and then to the element type (double rounding through
// float can move a half result by one unit in its last place only on an exact float tie, which the
// tests' one-unit bound covers).
template <class T>
HS_DEV void hs_rms_norm_body(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, double eps,
                             hs_i64 rows, hs_i64 len, double* scratch) {
    for (hs_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * len;
        T* yr = y + r * len;
        double s = 0.0;
        for (hs_i64 j = threadIdx.x; j < len; j += blockDim.x) {
            const double v = hs_ld(xr[j]);
            s += v * v;
        }
        s = hs_block_sum_f64(s, scratch);
        const double inv = 1.0 / sqrt(s / (double)len + eps);
        for (hs_i64 j = threadIdx.x; j < len; j += blockDim.x)
            yr[j] = hs_st<T>((float)(((double)hs_ld(xr[j]) * inv) * (double)hs_ld(w[j])));
    }
}

// The row in registers: as the kernel above, but each thread holds up to PACKS 8-element packs of the
// row (pack p = threadIdx.x + k * blockDim.x) from one 16-byte-access read, so x is read from global
// memory once instead of twice; w comes in 16-byte packs too. Same arithmetic per element (the sum of
// squares in double, each product in double rounded once to float), so results differ from the kernel
// above only by the order of the double sum. Needs len % 8 == 0, 16-byte aligned x, w and y, and
// len <= 8 * PACKS * blockDim.x (the glue picks PACKS and the block so).
template <int PACKS, class T>
HS_DEV void hs_rms_norm_regs_body(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, double eps,
                                  hs_i64 rows, hs_i64 len, double* scratch) {
    const hs_i64 np = len / 8;
    for (hs_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * len;
        T* yr = y + r * len;
        float v[PACKS][8];
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < PACKS; ++k) {
            const hs_i64 p = threadIdx.x + (hs_i64)k * blockDim.x;
            if (p < np) {
                hs_ld8(xr, p, v[k]);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const double d = v[k][e];
                    s += d * d;
                }
            }
        }
        s = hs_block_sum_f64(s, scratch);
        const double inv = 1.0 / sqrt(s / (double)len + eps);
#pragma unroll
        for (int k = 0; k < PACKS; ++k) {
            const hs_i64 p = threadIdx.x + (hs_i64)k * blockDim.x;
            if (p < np) {
                float wv[8];
                hs_ld8(w, p, wv);
#pragma unroll
                for (int e = 0; e < 8; ++e) v[k][e] = (float)(((double)v[k][e] * inv) * (double)wv[e]);
                hs_st8(yr, p, v[k]);
            }
        }
    }
}

#define HS_RMS_NORM(S, T)                                                                                     \
    HS_KERNEL void hs_rms_norm_##S(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,        \
                                   double eps, hs_i64 rows, hs_i64 len) {                                     \
        __shared__ double scratch[HS_MAX_WARPS];                                                              \
        hs_rms_norm_body<T>(x, w, y, eps, rows, len, scratch);                                                \
    }                                                                                                         \
    HS_KERNEL void hs_rms_norm_regs_##S##_p1(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, \
                                             double eps, hs_i64 rows, hs_i64 len) {                           \
        __shared__ double scratch[HS_MAX_WARPS];                                                              \
        hs_rms_norm_regs_body<1, T>(x, w, y, eps, rows, len, scratch);                                        \
    }                                                                                                         \
    HS_KERNEL void hs_rms_norm_regs_##S##_p2(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, \
                                             double eps, hs_i64 rows, hs_i64 len) {                           \
        __shared__ double scratch[HS_MAX_WARPS];                                                              \
        hs_rms_norm_regs_body<2, T>(x, w, y, eps, rows, len, scratch);                                        \
    }                                                                                                         \
    HS_KERNEL void hs_rms_norm_regs_##S##_p4(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, \
                                             double eps, hs_i64 rows, hs_i64 len) {                           \
        __shared__ double scratch[HS_MAX_WARPS];                                                              \
        hs_rms_norm_regs_body<4, T>(x, w, y, eps, rows, len, scratch);                                        \
    }
HS_FOR_EACH_FLOAT(HS_RMS_NORM)
