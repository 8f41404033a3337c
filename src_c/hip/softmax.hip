// Softmax along any axis, seen as a (outer, len, inner) layout. Same formula as scipy.special.softmax
// and the CPU engine: m = max (NaN propagates), e = exp(x - m), y = e / sum(e). So a row holding NaN
// or +inf, or a row of all -inf, becomes all NaN exactly as that formula gives.

// float32, float16 and bfloat16 (suffix f32/f16/bf16): halves are widened on load, max, exponentials and
// sum stay float32, and each result is rounded once to the element type on the store.

// Scalar and float4 element access for the row kernel, so its algorithm is written once; ld/st move
// elements of type T in and out as float (VEC 4: four at a time).
template <int VEC> struct HsVec;
template <> struct HsVec<1> {
    typedef float T;
    template <class E> static HS_DEV float ld(const E* x, hs_i64 j) { return hs_ld(x[j]); }
    template <class E> static HS_DEV void st(E* y, hs_i64 j, float v) { y[j] = hs_st<E>(v); }
    static HS_DEV float max(float m, float v) { return HsMax::op(m, v); }
    static HS_DEV float exp_shift(float v, float m) { return hs_exp(v - m); }
    static HS_DEV float sum(float v) { return v; }
    static HS_DEV float div(float v, float s) { return v / s; }
};
template <> struct HsVec<4> {
    typedef float4 T;
    template <class E> static HS_DEV float4 ld(const E* x, hs_i64 j) { return hs_ld4(x, j); }
    template <class E> static HS_DEV void st(E* y, hs_i64 j, float4 v) { hs_st4(y, j, v); }
    static HS_DEV float max(float m, float4 v) {
        return HsMax::op(HsMax::op(HsMax::op(HsMax::op(m, v.x), v.y), v.z), v.w);
    }
    static HS_DEV float4 exp_shift(float4 v, float m) {
        return make_float4(hs_exp(v.x - m), hs_exp(v.y - m), hs_exp(v.z - m), hs_exp(v.w - m));
    }
    static HS_DEV float sum(float4 v) { return (v.x + v.y) + (v.z + v.w); }
    static HS_DEV float4 div(float4 v, float s) { return make_float4(v.x / s, v.y / s, v.z / s, v.w / s); }
};

// Eight elements (a 16-byte pack: prelude.h's hs_ld8/hs_st8) at a time, for rows too long for the
// register kernel below.
struct HsF8 { float v[8]; };
template <> struct HsVec<8> {
    typedef HsF8 T;
    template <class E> static HS_DEV HsF8 ld(const E* x, hs_i64 j) { HsF8 r; hs_ld8(x, j, r.v); return r; }
    template <class E> static HS_DEV void st(E* y, hs_i64 j, const HsF8& v) { hs_st8(y, j, v.v); }
    static HS_DEV float max(float m, const HsF8& v) {
#pragma unroll
        for (int e = 0; e < 8; ++e) m = HsMax::op(m, v.v[e]);
        return m;
    }
    static HS_DEV HsF8 exp_shift(HsF8 v, float m) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v.v[e] = hs_exp(v.v[e] - m);
        return v;
    }
    static HS_DEV float sum(const HsF8& v) { return hs_sum8(v.v); }
    static HS_DEV HsF8 div(HsF8 v, float s) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v.v[e] = v.v[e] / s;
        return v;
    }
};

// inner == 1 (softmax over the last axis): one block per row. When the row fits in shared memory
// (`cached`, dynamic shared size len * 4 bytes: the row is kept as float whatever E is) it is read
// from global memory once, else three times. VEC = 4 moves four elements (needs len % 4 == 0 and
// 16-byte aligned x and y), VEC = 8 a 16-byte pack (len % 8 == 0, 16-byte aligned x and y).
template <int VEC, class E>
HS_DEV void hs_softmax_rows_body(const E* __restrict__ x, E* __restrict__ y, hs_i64 rows, hs_i64 len,
                                 int cached, float* row, float* scratch) {
    typedef HsVec<VEC> A;
    typedef typename A::T V;
    const hs_i64 nv = len / VEC;
    V* rowv = (V*)row;
    for (hs_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const E* xr = x + r * len;
        E* yr = y + r * len;
        float m = -HS_INF;
        for (hs_i64 j = threadIdx.x; j < nv; j += blockDim.x) {
            const V v = A::ld(xr, j);
            if (cached) rowv[j] = v;
            m = A::max(m, v);
        }
        m = hs_block_max(m, scratch);
        float s = 0.0f;
        // each thread revisits only the j it wrote, so the cached row needs no barrier here
        for (hs_i64 j = threadIdx.x; j < nv; j += blockDim.x) {
            const V e = A::exp_shift(cached ? rowv[j] : A::ld(xr, j), m);
            if (cached) rowv[j] = e;
            s += A::sum(e);
        }
        s = hs_block_sum(s, scratch);
        for (hs_i64 j = threadIdx.x; j < nv; j += blockDim.x)
            A::st(yr, j, A::div(cached ? rowv[j] : A::exp_shift(A::ld(xr, j), m), s));
        __syncthreads();  // the next row overwrites `row`
    }
}

// inner == 1, the row in registers: one block per row, each thread holding up to PACKS 8-element packs
// (pack p = threadIdx.x + k * blockDim.x, k < PACKS) as float. One pass over global memory: the row is
// read once with 16-byte loads, max, exponentials and sum come from registers, and the result is
// written once; the shared-memory kernel above re-reads its copy twice and moves 4 or 8 bytes per
// access. Needs len % 8 == 0, 16-byte aligned x and y, and len <= 8 * PACKS * blockDim.x (the glue
// picks PACKS and the block so; longer rows take the kernels above). The packs a thread holds and the
// order it sums them in do not depend on E, so a half type's result is the float32 kernel's on the
// widened row, rounded.
template <int PACKS, class E>
HS_DEV void hs_softmax_regs_body(const E* __restrict__ x, E* __restrict__ y, hs_i64 rows, hs_i64 len,
                                 float* scratch) {
    const hs_i64 np = len / 8;
    for (hs_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const E* xr = x + r * len;
        E* yr = y + r * len;
        float v[PACKS][8];
        float m = -HS_INF;
#pragma unroll
        for (int k = 0; k < PACKS; ++k) {
            const hs_i64 p = threadIdx.x + (hs_i64)k * blockDim.x;
            if (p < np) {
                hs_ld8(xr, p, v[k]);
#pragma unroll
                for (int e = 0; e < 8; ++e) m = HsMax::op(m, v[k][e]);
            }
        }
        m = hs_block_max(m, scratch);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < PACKS; ++k) {
            if (threadIdx.x + (hs_i64)k * blockDim.x < np) {
#pragma unroll
                for (int e = 0; e < 8; ++e) v[k][e] = hs_exp(v[k][e] - m);
                s += hs_sum8(v[k]);
            }
        }
        s = hs_block_sum(s, scratch);
#pragma unroll
        for (int k = 0; k < PACKS; ++k) {
            const hs_i64 p = threadIdx.x + (hs_i64)k * blockDim.x;
            if (p < np) {
#pragma unroll
                for (int e = 0; e < 8; ++e) v[k][e] = v[k][e] / s;
                hs_st8(yr, p, v[k]);
            }
        }
    }
}

// inner > 1 (softmax over a middle or leading axis): one thread per (outer, inner) column, walking the
// axis with stride `inner`, so neighbouring threads read neighbouring addresses.
template <class E>
HS_DEV void hs_softmax_strided_body(const E* __restrict__ x, E* __restrict__ y, hs_i64 outer, hs_i64 len,
                                    hs_i64 inner) {
    const hs_i64 cols = outer * inner;
    for (hs_i64 c = hs_gid(); c < cols; c += hs_gstride()) {
        const hs_i64 o = c / inner, i = c - o * inner;
        const E* xc = x + o * len * inner + i;
        E* yc = y + o * len * inner + i;
        float m = -HS_INF;
        for (hs_i64 j = 0; j < len; ++j) m = HsMax::op(m, hs_ld(xc[j * inner]));
        float s = 0.0f;
        for (hs_i64 j = 0; j < len; ++j) s += hs_exp(hs_ld(xc[j * inner]) - m);
        for (hs_i64 j = 0; j < len; ++j) yc[j * inner] = hs_st<E>(hs_exp(hs_ld(xc[j * inner]) - m) / s);
    }
}

#define HS_SOFTMAX(S, T)                                                                                        \
    HS_KERNEL void hs_softmax_rows_##S(const T* __restrict__ x, T* __restrict__ y, hs_i64 rows, hs_i64 len,      \
                                       int cached) {                                                            \
        extern __shared__ float row[];                                                                          \
        __shared__ float scratch[HS_MAX_WARPS];                                                                 \
        hs_softmax_rows_body<1, T>(x, y, rows, len, cached, row, scratch);                                      \
    }                                                                                                           \
    HS_KERNEL void hs_softmax_rows_##S##_v4(const T* __restrict__ x, T* __restrict__ y, hs_i64 rows, hs_i64 len, \
                                            int cached) {                                                       \
        extern __shared__ float row[];                                                                          \
        __shared__ float scratch[HS_MAX_WARPS];                                                                 \
        hs_softmax_rows_body<4, T>(x, y, rows, len, cached, row, scratch);                                      \
    }                                                                                                           \
    HS_KERNEL void hs_softmax_rows_##S##_v8(const T* __restrict__ x, T* __restrict__ y, hs_i64 rows, hs_i64 len, \
                                            int cached) {                                                       \
        extern __shared__ float row[];                                                                          \
        __shared__ float scratch[HS_MAX_WARPS];                                                                 \
        hs_softmax_rows_body<8, T>(x, y, rows, len, cached, row, scratch);                                      \
    }                                                                                                           \
    HS_KERNEL void hs_softmax_regs_##S##_p1(const T* __restrict__ x, T* __restrict__ y, hs_i64 rows, hs_i64 len) { \
        __shared__ float scratch[HS_MAX_WARPS];                                                                 \
        hs_softmax_regs_body<1, T>(x, y, rows, len, scratch);                                                   \
    }                                                                                                           \
    HS_KERNEL void hs_softmax_regs_##S##_p2(const T* __restrict__ x, T* __restrict__ y, hs_i64 rows, hs_i64 len) { \
        __shared__ float scratch[HS_MAX_WARPS];                                                                 \
        hs_softmax_regs_body<2, T>(x, y, rows, len, scratch);                                                   \
    }                                                                                                           \
    HS_KERNEL void __launch_bounds__(HS_SOFTMAX_REGS_THREADS) hs_softmax_regs_##S##_p4(const T* __restrict__ x, T* __restrict__ y, hs_i64 rows, hs_i64 len) { \
        __shared__ float scratch[HS_MAX_WARPS];                                                                 \
        hs_softmax_regs_body<4, T>(x, y, rows, len, scratch);                                                   \
    }                                                                                                           \
    HS_KERNEL void hs_softmax_strided_##S(const T* __restrict__ x, T* __restrict__ y, hs_i64 outer, hs_i64 len,  \
                                          hs_i64 inner) {                                                       \
        hs_softmax_strided_body<T>(x, y, outer, len, inner);                                                    \
    }
HS_FOR_EACH_FLOAT(HS_SOFTMAX)
