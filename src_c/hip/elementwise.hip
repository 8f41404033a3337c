// Elementwise kernels: add (same shape, or b repeating over a's trailing dimensions: a bias), scale,
// silu_mul (SwiGLU's silu(gate) * up) and gelu (torch's two forms),
// for float32, float16 and bfloat16 (suffix f32/f16/bf16): halves are widened to float, the sum or
// product is formed in float and rounded once to the element type, as PyTorch computes them.
//
// Bandwidth-bound, so each has a 16-byte variant (_v8: 8 elements per pack, prelude.h's hs_ld8/hs_st8)
// the glue picks when every pointer is 16-byte aligned (and, for the bias, b's length is a multiple of
// 8); the scalar variants take any pointer (foreign device arrays, offset views).
//
// Bytes in flight (why two packs per thread per iteration, and the glue's grid of one resident wave,
// common.bandwidth_blocks): by Little's law a memory system delivering B bytes/s at latency L needs
// B * L bytes requested and not yet returned. An H100 (132 SMs) copies at ~3.0 TB/s with ~600-800 ns
// of DRAM latency under load: ~2.1 MB in flight, ~16 KB per SM. A thread with one 16-byte load
// outstanding, at the full 2048 resident threads, covers 32 KB per SM: enough only at full occupancy
// and with nothing else in the way. Two packs per input per thread, all loads issued before any
// arithmetic, put 64 B (scale) or 128 B (add) per thread in flight; these kernels take up to 64
// registers on sm_90, so an SM keeps 1024 of their threads (the grid is sized for that): 64-128 KB per
// SM, 4-8x the need, and the loop's bookkeeping is paid once per 32 bytes of each input.

struct HsAddOp {
    static HS_DEV float f(float a, float b, float) { return a + b; }
};
struct HsScaleOp {
    static HS_DEV float f(float x, float, float alpha) { return alpha * x; }
};
// silu(g) * u = g / (1 + exp(-g)) * u in float (accurate expf: g < -88.7 gives -0, g = -inf NaN, as torch)
struct HsSiluMulOp {
    static HS_DEV float f(float g, float u, float) { return g / (1.0f + hs_exp(-g)) * u; }
};
// GELU in double, rounded once (as the CPU engine): alpha 0 is torch's erf form, 0.5 x erfc(-x / sqrt 2);
// alpha 1 its tanh form 0.5 x (1 + tanh(u)), written x / (1 + exp(-2u)) so that 1 + tanh does not cancel.
// Double on purpose: both stay accurate where x is large and negative, and the kernel is memory-bound
// on the GPUs this runs on at any rate worth having.
struct HsGeluOp {
    static HS_DEV float f(float x, float, float alpha) {
        const double v = x;
        if (alpha != 0.0f) {
            const double u = 0.79788456080286535588 * (v + 0.044715 * v * v * v);
            return (float)(v / (1.0 + exp(-2.0 * u)));
        }
        return (float)(0.5 * v * erfc(-v * 0.70710678118654752440));
    }
};

template <class T>
HS_DEV void hs_add_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = hs_st<T>(hs_ld(a[i]) + hs_ld(b[i]));
}

// y[i] = a[i] + b[i % nb]: b's shape is a trailing part of a's, so it repeats every nb elements.
template <class T>
HS_DEV void hs_add_bias_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n,
                             hs_i64 nb) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = hs_st<T>(hs_ld(a[i]) + hs_ld(b[i % nb]));
}

template <class T> HS_DEV void hs_scale_body(const T* __restrict__ x, T* __restrict__ y, float alpha, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = hs_st<T>(alpha * hs_ld(x[i]));
}

// y = Op(a, b) over n elements (b unused when !TWO): packs of 8 elements, two per thread per iteration
// (pack i and pack i + stride, so each warp's accesses stay contiguous), the n % 8 elements past the
// last whole pack by the first threads one at a time. a, b and y 16-byte aligned; any n.
template <class T, class Op, bool TWO>
HS_DEV void hs_map_v8_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, float alpha,
                           hs_i64 n) {
    const hs_i64 n8 = n / 8, s = hs_gstride();
    for (hs_i64 i = hs_gid(); i < n8; i += 2 * s) {
        const hs_i64 j = i + s;
        const bool second = j < n8;
        float u0[8], u1[8], v0[8], v1[8];
        hs_ld8(a, i, u0);
        if (TWO) hs_ld8(b, i, v0);
        if (second) {
            hs_ld8(a, j, u1);
            if (TWO) hs_ld8(b, j, v1);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) u0[e] = Op::f(u0[e], TWO ? v0[e] : 0.0f, alpha);
        hs_st8(y, i, u0);
        if (second) {
#pragma unroll
            for (int e = 0; e < 8; ++e) u1[e] = Op::f(u1[e], TWO ? v1[e] : 0.0f, alpha);
            hs_st8(y, j, u1);
        }
    }
    for (hs_i64 k = 8 * n8 + hs_gid(); k < n; k += s)
        y[k] = hs_st<T>(Op::f(hs_ld(a[k]), TWO ? hs_ld(b[k]) : 0.0f, alpha));
}

// Bias add in packs: nb8 = nb / 8 (nb % 8 == 0, so n % 8 == 0 too: no tail), n8 = n / 8.
template <class T>
HS_DEV void hs_add_bias_v8_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n8,
                                hs_i64 nb8) {
    const hs_i64 s = hs_gstride();
    for (hs_i64 i = hs_gid(); i < n8; i += 2 * s) {
        const hs_i64 j = i + s;
        const bool second = j < n8;
        float u0[8], u1[8], v0[8], v1[8];
        hs_ld8(a, i, u0);
        hs_ld8(b, i % nb8, v0);
        if (second) {
            hs_ld8(a, j, u1);
            hs_ld8(b, j % nb8, v1);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) u0[e] += v0[e];
        hs_st8(y, i, u0);
        if (second) {
#pragma unroll
            for (int e = 0; e < 8; ++e) u1[e] += v1[e];
            hs_st8(y, j, u1);
        }
    }
}

// One element at a time, for pointers that are not 16-byte aligned (the _v8 kernels below need them).
template <class T, class Op, bool TWO>
HS_DEV void hs_map_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, float alpha, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride())
        y[i] = hs_st<T>(Op::f(hs_ld(a[i]), TWO ? hs_ld(b[i]) : 0.0f, alpha));
}

#define HS_ELEMENTWISE(S, T)                                                                                     \
    HS_KERNEL void hs_add_##S(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n) {    \
        hs_add_body<T>(a, b, y, n);                                                                              \
    }                                                                                                            \
    HS_KERNEL void hs_add_##S##_v8(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,           \
                                   hs_i64 n) {                                                                   \
        hs_map_v8_body<T, HsAddOp, true>(a, b, y, 0.0f, n);                                                   \
    }                                                                                                            \
    HS_KERNEL void hs_add_bias_##S(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,           \
                                   hs_i64 n, hs_i64 nb) {                                                        \
        hs_add_bias_body<T>(a, b, y, n, nb);                                                                     \
    }                                                                                                            \
    HS_KERNEL void hs_add_bias_##S##_v8(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,      \
                                        hs_i64 n8, hs_i64 nb8) {                                                 \
        hs_add_bias_v8_body<T>(a, b, y, n8, nb8);                                                                \
    }                                                                                                            \
    HS_KERNEL void hs_scale_##S(const T* __restrict__ x, T* __restrict__ y, float alpha, hs_i64 n) {              \
        hs_scale_body<T>(x, y, alpha, n);                                                                        \
    }                                                                                                            \
    HS_KERNEL void hs_scale_##S##_v8(const T* __restrict__ x, T* __restrict__ y, float alpha, hs_i64 n) {         \
        hs_map_v8_body<T, HsScaleOp, false>(x, x, y, alpha, n);                                               \
    }                                                                                                            \
    HS_KERNEL void hs_silu_mul_##S(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y, hs_i64 n) { \
        hs_map_body<T, HsSiluMulOp, true>(g, u, y, 0.0f, n);                                                     \
    }                                                                                                            \
    HS_KERNEL void hs_silu_mul_##S##_v8(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y,      \
                                        hs_i64 n) {                                                              \
        hs_map_v8_body<T, HsSiluMulOp, true>(g, u, y, 0.0f, n);                                                  \
    }                                                                                                            \
    HS_KERNEL void hs_gelu_##S(const T* __restrict__ x, T* __restrict__ y, float tanh_form, hs_i64 n) {           \
        hs_map_body<T, HsGeluOp, false>(x, x, y, tanh_form, n);                                                  \
    }                                                                                                            \
    HS_KERNEL void hs_gelu_##S##_v8(const T* __restrict__ x, T* __restrict__ y, float tanh_form, hs_i64 n) {      \
        hs_map_v8_body<T, HsGeluOp, false>(x, x, y, tanh_form, n);                                               \
    }
HS_FOR_EACH_FLOAT(HS_ELEMENTWISE)
