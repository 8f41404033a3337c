// Softmax along any axis, seen as a (outer, len, inner) layout. Same formula as scipy.special.softmax
// and the CPU engine: m = max (NaN propagates), e = exp(x - m), y = e / sum(e). So a row holding NaN
// or +inf, or a row of all -inf, becomes all NaN exactly as that formula gives.

// inner == 1 (softmax over the last axis): one block per row. When the row fits in shared memory
// (`cached`, dynamic shared size len * 4 bytes) it is read from global memory once, else three times.
HS_KERNEL void hs_softmax_rows_f32(const float* __restrict__ x, float* __restrict__ y, hs_i64 rows, hs_i64 len,
                                   int cached) {
    extern __shared__ float row[];
    __shared__ float scratch[HS_MAX_WARPS];
    for (hs_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * len;
        float* yr = y + r * len;
        float m = -HS_INF;
        for (hs_i64 j = threadIdx.x; j < len; j += blockDim.x) {
            const float v = xr[j];
            if (cached) row[j] = v;
            m = HsMax::op(m, v);
        }
        m = hs_block_max(m, scratch);
        float s = 0.0f;
        // each thread revisits only the j it wrote, so the cached row needs no barrier here
        for (hs_i64 j = threadIdx.x; j < len; j += blockDim.x) {
            const float e = hs_exp((cached ? row[j] : xr[j]) - m);
            if (cached) row[j] = e;
            s += e;
        }
        s = hs_block_sum(s, scratch);
        for (hs_i64 j = threadIdx.x; j < len; j += blockDim.x)
            yr[j] = (cached ? row[j] : hs_exp(xr[j] - m)) / s;
        __syncthreads();  // the next row overwrites `row`
    }
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
