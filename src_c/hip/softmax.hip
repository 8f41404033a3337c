// Softmax along any axis, seen as a (outer, len, inner) layout. Same formula as scipy.special.softmax
// and the CPU engine: m = max (NaN propagates), e = exp(x - m), y = e / sum(e). So a row holding NaN
// or +inf, or a row of all -inf, becomes all NaN exactly as that formula gives.

// Scalar and float4 element access for the row kernel, so its algorithm is written once.
template <int VEC> struct HsVec;
template <> struct HsVec<1> {
    typedef float T;
    static HS_DEV float max(float m, float v) { return HsMax::op(m, v); }
    static HS_DEV float exp_shift(float v, float m) { return hs_exp(v - m); }
    static HS_DEV float sum(float v) { return v; }
    static HS_DEV float div(float v, float s) { return v / s; }
};
template <> struct HsVec<4> {
    typedef float4 T;
    static HS_DEV float max(float m, float4 v) {
        return HsMax::op(HsMax::op(HsMax::op(HsMax::op(m, v.x), v.y), v.z), v.w);
    }
    static HS_DEV float4 exp_shift(float4 v, float m) {
        return make_float4(hs_exp(v.x - m), hs_exp(v.y - m), hs_exp(v.z - m), hs_exp(v.w - m));
    }
    static HS_DEV float sum(float4 v) { return (v.x + v.y) + (v.z + v.w); }
    static HS_DEV float4 div(float4 v, float s) { return make_float4(v.x / s, v.y / s, v.z / s, v.w / s); }
};

// inner == 1 (softmax over the last axis): one block per row. When the row fits in shared memory
// (`cached`, dynamic shared size len * 4 bytes) it is read from global memory once, else three times.
// VEC = 4 moves float4 (needs len % 4 == 0 and 16-byte aligned x and y).
template <int VEC>
HS_DEV void hs_softmax_rows_body(const float* __restrict__ x, float* __restrict__ y, hs_i64 rows, hs_i64 len,
                                 int cached, float* row, float* scratch) {
    typedef typename HsVec<VEC>::T V;
    const hs_i64 nv = len / VEC;
    V* rowv = (V*)row;
    for (hs_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const V* xr = (const V*)(x + r * len);
        V* yr = (V*)(y + r * len);
        float m = -HS_INF;
        for (hs_i64 j = threadIdx.x; j < nv; j += blockDim.x) {
            const V v = xr[j];
            if (cached) rowv[j] = v;
            m = HsVec<VEC>::max(m, v);
        }
        m = hs_block_max(m, scratch);
        float s = 0.0f;
        // each thread revisits only the j it wrote, so the cached row needs no barrier here
        for (hs_i64 j = threadIdx.x; j < nv; j += blockDim.x) {
            const V e = HsVec<VEC>::exp_shift(cached ? rowv[j] : xr[j], m);
            if (cached) rowv[j] = e;
            s += HsVec<VEC>::sum(e);
        }
        s = hs_block_sum(s, scratch);
        for (hs_i64 j = threadIdx.x; j < nv; j += blockDim.x)
            yr[j] = HsVec<VEC>::div(cached ? rowv[j] : HsVec<VEC>::exp_shift(xr[j], m), s);
        __syncthreads();  // the next row overwrites `row`
    }
}

HS_KERNEL void hs_softmax_rows_f32(const float* __restrict__ x, float* __restrict__ y, hs_i64 rows, hs_i64 len,
                                   int cached) {
    extern __shared__ float row[];
    __shared__ float scratch[HS_MAX_WARPS];
    hs_softmax_rows_body<1>(x, y, rows, len, cached, row, scratch);
}

HS_KERNEL void hs_softmax_rows_f32_v4(const float* __restrict__ x, float* __restrict__ y, hs_i64 rows,
                                      hs_i64 len, int cached) {
    extern __shared__ float row[];
    __shared__ float scratch[HS_MAX_WARPS];
    hs_softmax_rows_body<4>(x, y, rows, len, cached, row, scratch);
}

// inner > 1 (softmax over a middle or leading axis): one thread per (outer, inner) column, walking the
// axis with stride `inner`, so neighbouring threads read neighbouring addresses.
HS_KERNEL void hs_softmax_strided_f32(const float* __restrict__ x, float* __restrict__ y, hs_i64 outer,
                                      hs_i64 len, hs_i64 inner) {
    const hs_i64 cols = outer * inner;
    for (hs_i64 c = hs_gid(); c < cols; c += hs_gstride()) {
        const hs_i64 o = c / inner, i = c - o * inner;
        const float* xc = x + o * len * inner + i;
        float* yc = y + o * len * inner + i;
        float m = -HS_INF;
        for (hs_i64 j = 0; j < len; ++j) m = HsMax::op(m, xc[j * inner]);
        float s = 0.0f;
        for (hs_i64 j = 0; j < len; ++j) s += hs_exp(xc[j * inner] - m);
        for (hs_i64 j = 0; j < len; ++j) yc[j * inner] = hs_exp(xc[j * inner] - m) / s;
    }
}
