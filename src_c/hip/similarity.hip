// Cosine similarity of m queries against the n rows of T, and exact top-k by that score on the device.
// Same arithmetic as the CPU engine: sim = (float)(dot * qinv * tinv) in double, where inv(nn) =
// 1/sqrt(nn) for a norm 0 < nn < inf and 0 otherwise, so NaN or inf in either vector gives NaN.
// A squared norm outside [1e-30, 1e30] in float may have lost its value to under- or overflow, so a
// pair with such a vector (a zero vector included) is scored in double from the inputs instead:
// zero vector -> 0 (NaN if the other holds NaN/inf), as the CPU does.
// Top-k ranks by score descending, ties to the lower index, NaN below every number.
// q and T are float32, float16 or bfloat16 (suffix f32/f16/bf16, both of one type): halves are widened
// on load and everything after is the float32 arithmetic; scores are float32 whatever the inputs.

#define HS_NN_TINY 1e-30f
#define HS_NN_HUGE 1e30f
HS_DEV bool hs_nn_extreme(float nn) { return nn < HS_NN_TINY || nn > HS_NN_HUGE; }  // NaN: false
HS_DEV double hs_inv_sqrt_norm(float nn) { return (nn > 0.0f && nn < HS_INF) ? 1.0 / sqrt((double)nn) : 0.0; }

HS_DEV double hs_warp_sum_d(double v) {
#pragma unroll
    for (int o = HS_WARP / 2; o > 0; o >>= 1) v += HS_SHFL_XOR(v, o);
    return v;
}

// cos(a, b) accumulated in double by a whole warp (every lane gets it): the rare extreme-norm pairs.
template <class E>
__device__ __noinline__ float hs_cos_exact_warp(const E* a, const E* b, hs_i64 d, int lane) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (hs_i64 j = lane; j < d; j += HS_WARP) {
        const double x = hs_ld(a[j]), y = hs_ld(b[j]);
        ab += x * y; aa += x * x; bb += y * y;
    }
    ab = hs_warp_sum_d(ab); aa = hs_warp_sum_d(aa); bb = hs_warp_sum_d(bb);
    if (aa == 0.0 || bb == 0.0) return (float)(ab * 0.0);
    return (float)(ab / (sqrt(aa) * sqrt(bb)));
}

// Inverse norms (float, as the CPU keeps them) of the rows of x (rows, d), one warp per row;
// -1 marks an extreme norm, whose pairs the cosine kernel scores in double.
template <class E>
HS_DEV void hs_row_inv_norm_body(const E* __restrict__ x, float* __restrict__ out, hs_i64 rows, hs_i64 d) {
    const int lane = threadIdx.x % HS_WARP;
    const hs_i64 warps = hs_gstride() / HS_WARP;
    for (hs_i64 r = hs_gid() / HS_WARP; r < rows; r += warps) {
        float s = 0.0f;
        for (hs_i64 j = lane; j < d; j += HS_WARP) { const float v = hs_ld(x[r * d + j]); s += v * v; }
        s = hs_warp_reduce<HsSum>(s);
        if (lane == 0) out[r] = hs_nn_extreme(s) ? -1.0f : (float)hs_inv_sqrt_norm(s);
    }
}

HS_DEV float hs_dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// One warp per row of T: the row is streamed once (VEC elements per lane per step) while MQ queries are
// scored against it, and its norm comes from the same loads. Queries beyond MQ take further passes
// over T (mostly from L2). out is (m, n); qinv holds the queries' inverse norms (-1: extreme).
template <int MQ, int VEC, class E>
HS_DEV void hs_cosine_body(const E* __restrict__ q, const float* __restrict__ qinv, const E* __restrict__ T,
                           float* __restrict__ out, hs_i64 m, hs_i64 n, hs_i64 d, hs_i64 q0) {
    const int lane = threadIdx.x % HS_WARP;
    const hs_i64 warps = hs_gstride() / HS_WARP;
    const int nq = (int)((m - q0) < MQ ? (m - q0) : MQ);
    for (hs_i64 r = hs_gid() / HS_WARP; r < n; r += warps) {
        const E* t = T + r * d;
        float acc[MQ];
#pragma unroll
        for (int k = 0; k < MQ; ++k) acc[k] = 0.0f;
        float tt = 0.0f;
        if (VEC == 4) {
            for (hs_i64 j = lane; j < d / 4; j += HS_WARP) {
                const float4 tv = hs_ld4(t, j);
                tt += hs_dot4(tv, tv);
#pragma unroll
                for (int k = 0; k < MQ; ++k)
                    if (k < nq) acc[k] += hs_dot4(tv, hs_ld4(q + (q0 + k) * d, j));
            }
        } else {
            for (hs_i64 j = lane; j < d; j += HS_WARP) {
                const float tv = hs_ld(t[j]);
                tt += tv * tv;
#pragma unroll
                for (int k = 0; k < MQ; ++k)
                    if (k < nq) acc[k] += tv * hs_ld(q[(q0 + k) * d + j]);
            }
        }
        tt = hs_warp_reduce<HsSum>(tt);  // the xor butterfly leaves the same sum in every lane
        const bool row_exact = hs_nn_extreme(tt);
#pragma unroll
        for (int k = 0; k < MQ; ++k) {
            if (k < nq) {
                const float dot = hs_warp_reduce<HsSum>(acc[k]);
                const float qi = qinv[q0 + k];
                const float sim = (row_exact || qi < 0.0f) ? hs_cos_exact_warp(q + (q0 + k) * d, t, d, lane)
                                                           : (float)((double)dot * (double)qi * hs_inv_sqrt_norm(tt));
                if (lane == 0) out[(q0 + k) * n + r] = sim;
            }
        }
    }
}

// q0: first query of this pass. *_v4 need d % 4 == 0 and 16-byte aligned q and T.
#define HS_COSINE(S, E)                                                                                        \
    HS_KERNEL void hs_row_inv_norm_##S(const E* __restrict__ x, float* __restrict__ out, hs_i64 rows, hs_i64 d) { \
        hs_row_inv_norm_body<E>(x, out, rows, d);                                                              \
    }                                                                                                          \
    HS_KERNEL void hs_cosine_##S##_q1(const E* q, const float* qinv, const E* T, float* out, hs_i64 m, hs_i64 n, \
                                      hs_i64 d, hs_i64 q0) { hs_cosine_body<1, 1, E>(q, qinv, T, out, m, n, d, q0); } \
    HS_KERNEL void hs_cosine_##S##_q1_v4(const E* q, const float* qinv, const E* T, float* out, hs_i64 m,       \
                                         hs_i64 n, hs_i64 d, hs_i64 q0) {                                      \
        hs_cosine_body<1, 4, E>(q, qinv, T, out, m, n, d, q0);                                                 \
    }                                                                                                          \
    HS_KERNEL void hs_cosine_##S##_q8(const E* q, const float* qinv, const E* T, float* out, hs_i64 m, hs_i64 n, \
                                      hs_i64 d, hs_i64 q0) { hs_cosine_body<HS_COSINE_MQ, 1, E>(q, qinv, T, out, m, n, d, q0); } \
    HS_KERNEL void hs_cosine_##S##_q8_v4(const E* q, const float* qinv, const E* T, float* out, hs_i64 m,       \
                                         hs_i64 n, hs_i64 d, hs_i64 q0) {                                      \
        hs_cosine_body<HS_COSINE_MQ, 4, E>(q, qinv, T, out, m, n, d, q0);                                      \
    }
HS_FOR_EACH_FLOAT(HS_COSINE)

// ---------------------------------------------------------------------------------------------- top-k

// HS_TOPK_SEG (candidates one block selects from), HS_TOPK_THREADS: hipsched/gpu/compilation/kernel_constants.py.

// Is (va, ia) ranked before (vb, ib)? Index < 0 marks an empty or taken slot, ranked after everything.
HS_DEV bool hs_topk_better(float va, hs_i64 ia, float vb, hs_i64 ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    const bool na = va != va, nb = vb != vb;
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

// One pass of the selection: block (s, row) takes segment s (HS_TOPK_SEG candidates) of row `row` of
// vals (rows, len) with indices idx_in (same shape; NULL = the position itself), and writes its best
// kout in rank order to out_v/out_i (rows, nseg, kout), padding with index -1. The glue repeats passes
// over the partial results until one segment per row remains. Selection is kout rounds of a block
// arg-best in which each thread keeps its own best and rescans only when that one was taken.
HS_KERNEL void hs_topk_select_f32(const float* __restrict__ vals, const hs_i64* __restrict__ idx_in, hs_i64 len,
                                  int kout, float* __restrict__ out_v, hs_i64* __restrict__ out_i) {
    __shared__ float sv[HS_TOPK_SEG];
    __shared__ hs_i64 si[HS_TOPK_SEG];
    __shared__ float wv[HS_MAX_WARPS];
    __shared__ int wp[HS_MAX_WARPS];
    const hs_i64 row = blockIdx.y, seg = blockIdx.x, nseg = gridDim.x;
    const hs_i64 base = seg * HS_TOPK_SEG;
    const int tid = threadIdx.x, lane = tid % HS_WARP, wid = tid / HS_WARP;
    const int nw = blockDim.x / HS_WARP;
    for (int p = tid; p < HS_TOPK_SEG; p += blockDim.x) {
        const hs_i64 g = base + p;
        if (g < len) {
            sv[p] = vals[row * len + g];
            si[p] = idx_in ? idx_in[row * len + g] : g;
        } else {
            sv[p] = 0.0f;
            si[p] = -1;
        }
    }
    __syncthreads();
    int mine = -1;  // position of this thread's best untaken candidate
    bool rescan = true;
    float* ov = out_v + (row * nseg + seg) * kout;
    hs_i64* oi = out_i + (row * nseg + seg) * kout;
    for (int r = 0; r < kout; ++r) {
        if (rescan) {
            mine = -1;
            for (int p = tid; p < HS_TOPK_SEG; p += blockDim.x)
                if (si[p] >= 0 && (mine < 0 || hs_topk_better(sv[p], si[p], sv[mine], si[mine]))) mine = p;
            rescan = false;
        }
        float v = mine >= 0 ? sv[mine] : 0.0f;
        int pos = mine;
        // warp arg-best (positions travel with values; the index is looked up in shared memory)
#pragma unroll
        for (int o = HS_WARP / 2; o > 0; o >>= 1) {
            const float v2 = HS_SHFL_XOR(v, o);
            const int p2 = HS_SHFL_XOR(pos, o);
            if (p2 >= 0 && (pos < 0 || hs_topk_better(v2, si[p2], v, si[pos]))) { v = v2; pos = p2; }
        }
        if (lane == 0) { wv[wid] = v; wp[wid] = pos; }
        __syncthreads();
        if (wid == 0) {
            v = lane < nw ? wv[lane] : 0.0f;
            pos = lane < nw ? wp[lane] : -1;
#pragma unroll
            for (int o = HS_WARP / 2; o > 0; o >>= 1) {
                const float v2 = HS_SHFL_XOR(v, o);
                const int p2 = HS_SHFL_XOR(pos, o);
                if (p2 >= 0 && (pos < 0 || hs_topk_better(v2, si[p2], v, si[pos]))) { v = v2; pos = p2; }
            }
            if (lane == 0) wp[0] = pos;
        }
        __syncthreads();
        const int win = wp[0];
        if (tid == 0) {
            ov[r] = win >= 0 ? sv[win] : 0.0f;
            oi[r] = win >= 0 ? si[win] : -1;
        }
        __syncthreads();  // everyone has read wp[0] and the winner's slot before it is cleared
        if (win >= 0 && win == mine) {
            si[win] = -1;
            rescan = true;
        }
        __syncthreads();
    }
}
