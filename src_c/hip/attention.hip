// Flash-attention style scaled dot-product attention, fp32 on SIMT cores (no tensor cores: results must
// match the CPU engine to ~1e-5), for q (B, H, Sq, hd), k and v (B, H, Sk, hd), all contiguous.
//
// Tiling: a block of 128 threads owns ROWS query rows of one (batch, head). G = D/16 threads share a
// row, each holding 16 of its (padded) dims as 4 float4 chunks interleaved across the group (chunk t
// of thread g covers dims 4*(t*G+g) .. +3, so the G lanes of a row read consecutive 16-byte words of
// a shared key: no bank conflicts, and every row group of the warp reads the same words: broadcast).
// Each thread carries R = 4 rows, so every float a lane reads from shared memory (one LDS.128 = 4
// floats) feeds 4 FMAs, and a score's cross-lane sum (log2(G) shuffles) is paid once per row and key
// for 16 FMAs. At R = 2 the shared-memory pipe (128 bytes a clock per SM, i.e. one float per lane and
// clock, against 4 warp-FMAs a clock) bound the kernel at under half the FMA peak; at R = 4 the reads
// and shuffles take 40 clocks per warp and key at d64 against the FMAs' 32 (docs/design/kernels.md, "Attention on
// SIMT cores"). R = 8 would not fit the registers: q and o alone are 32 * R of them.
// The two lanes of a pair (2n, 2n+1) hold the same dims of two rows, so they read the same shared
// addresses (a pair-uniform read, which NVIDIA's shared memory can return packed); a row's lanes are
// therefore 2 apart and its sums shuffle with masks 2 .. G.
// K and V stream through shared memory in tiles of BK keys (HSA_KV_BYTES for both); an online softmax
// in base 2 (q pre-scaled by scale*log2(e)) keeps the state per row at (m, l, o): no Sq x Sk matrix.
// Causal is top-left aligned like torch SDPA(is_causal=True): row i sees keys j <= i, and key tiles
// entirely above a block's last row are skipped. A row that sees no key (Sk == 0) gets zeros.
//
// Entry points per head-dim class (hd <= D, the rest zero-padded): hs_attention_d32/_d64/_d128/_d256 for
// float32, hs_attention_f16_d* and hs_attention_bf16_d* for float16 and bfloat16 q, k, v and out: those
// are widened on load (K and V tiles are float in shared memory), the running max, sum and output
// accumulate in float32, and each output is rounded once to the element type.
// Launch: block 128, grid (ceil(Sq / ROWS) * B * H), ROWS = HSA_R * 128 / (D / 16).

// HSA_THREADS (the launch bounds), HSA_R and HSA_DIMS: hipsched/gpu/compilation/kernel_constants.py.
#define HSA_CHUNK 8           // keys scored together before one online-softmax rescale
#define HSA_LOG2E 1.4426950408889634f
// K and V tiles together: at 255 registers (sm_90) or 351 VGPRs (gfx90a) registers already hold an SM
// to 2 blocks and a CU to 1 wave per SIMD, so 32 KiB costs no occupancy on either (nor sm_75's 64 KiB).
#define HSA_KV_BYTES 32768

HS_DEV float hsa_dot4(float4 a, float4 b, float acc) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
HS_DEV void hsa_axpy4(float4& o, float p, float4 v) {
    o.x = fmaf(p, v.x, o.x); o.y = fmaf(p, v.y, o.y); o.z = fmaf(p, v.z, o.z); o.w = fmaf(p, v.w, o.w);
}

template <int D, class E>
HS_DEV void hsa_attention(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                          E* __restrict__ out, hs_i64 sq, hs_i64 sk, int hd, float scale, int causal,
                          int group, hs_i64 heads, const hs_i64* __restrict__ kvlen) {
    constexpr int G = D / HSA_DIMS;                  // threads per query row
    constexpr int STRIDE = HSA_THREADS / G;          // distance between a thread's rows
    constexpr int ROWS = STRIDE * HSA_R;             // query rows per block
    constexpr int BK = HSA_KV_BYTES / (8 * D);       // keys per shared tile
    constexpr int D4 = D / 4;
    static_assert(BK % HSA_CHUNK == 0, "a key tile is whole chunks");
    __shared__ float4 ks[BK][D4];
    __shared__ float4 vs[BK][D4];

    const int tid = threadIdx.x;
    const int g = (tid >> 1) % G;
    const hs_i64 tiles = (sq + ROWS - 1) / ROWS;
    const hs_i64 bh = (hs_i64)blockIdx.x / tiles;
    const hs_i64 q0 = ((hs_i64)blockIdx.x % tiles) * ROWS;
    const hs_i64 row0 = q0 + ((tid & 1) | (((tid >> 1) / G) << 1));   // rows row0 + i * STRIDE
    // grouped heads: query head bh % heads reads KV slab bh / group; kv_len bounds the keys, and
    // lower_right (causal 2) shifts every row's last visible key by off = kv_len - sq
    const hs_i64 skv = kvlen ? kvlen[bh / heads] : sk;
    const hs_i64 off = causal == 2 ? skv - sq : 0;
    const E* kb = k + (bh / group) * sk * hd;
    const E* vb = v + (bh / group) * sk * hd;

    const float qs = scale * HSA_LOG2E;
    float4 qr[HSA_R][4], o[HSA_R][4];
    float m[HSA_R], l[HSA_R];
#pragma unroll
    for (int i = 0; i < HSA_R; ++i) {
        const hs_i64 row = row0 + i * STRIDE;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            float e[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int d = 4 * (t * G + g) + c;
                e[c] = (row < sq && d < hd) ? hs_ld(q[(bh * sq + row) * hd + d]) * qs : 0.0f;
            }
            qr[i][t] = make_float4(e[0], e[1], e[2], e[3]);
            o[i][t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        m[i] = -HS_INF;
        l[i] = 0.0f;
    }

    // Causal: keys past the block's last row are masked for every row of the block.
    hs_i64 kend = skv;
    if (causal && q0 + off + ROWS < kend) kend = q0 + off + ROWS;

    float* ksf = reinterpret_cast<float*>(ks);
    float* vsf = reinterpret_cast<float*>(vs);
    for (hs_i64 kt = 0; kt < kend; kt += BK) {
        for (int idx = tid; idx < BK * D; idx += HSA_THREADS) {
            const int j = idx / D, d = idx % D;
            const hs_i64 key = kt + j;
            const bool in = key < kend && d < hd;
            ksf[idx] = in ? hs_ld(kb[key * hd + d]) : 0.0f;
            vsf[idx] = in ? hs_ld(vb[key * hd + d]) : 0.0f;
        }
        __syncthreads();
#pragma unroll 1
        for (int c0 = 0; c0 < BK; c0 += HSA_CHUNK) {
            // Row i sees the chunk's keys jj < lim[i] (both bounds, Sk and causal, are upper bounds on
            // the key), in 32-bit chunk coordinates: 64-bit key and row compares per key and row would
            // cost registers the accumulators need.
            int lim[HSA_R];
#pragma unroll
            for (int i = 0; i < HSA_R; ++i) {
                hs_i64 end = kend - (kt + c0);
                if (causal && row0 + off + i * STRIDE + 1 - (kt + c0) < end) end = row0 + off + i * STRIDE + 1 - (kt + c0);
                lim[i] = (int)(end < 0 ? 0 : end < HSA_CHUNK ? end : HSA_CHUNK);
            }
            float s[HSA_R][HSA_CHUNK];
#pragma unroll
            for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                float4 kv[4];
#pragma unroll
                for (int t = 0; t < 4; ++t) kv[t] = ks[c0 + jj][t * G + g];
#pragma unroll
                for (int i = 0; i < HSA_R; ++i) {
                    float p = hsa_dot4(qr[i][0], kv[0], 0.0f);
                    p = hsa_dot4(qr[i][1], kv[1], p);
                    p = hsa_dot4(qr[i][2], kv[2], p);
                    p = hsa_dot4(qr[i][3], kv[3], p);
#pragma unroll
                    for (int msk = 2; msk < 2 * G; msk <<= 1) p += HS_SHFL_XOR(p, msk);
                    s[i][jj] = jj < lim[i] ? p : -HS_INF;
                }
            }
#pragma unroll
            for (int i = 0; i < HSA_R; ++i) {
                float mnew = m[i];
#pragma unroll
                for (int jj = 0; jj < HSA_CHUNK; ++jj) mnew = fmaxf(mnew, s[i][jj]);
                // Until a row has seen a key its max is -inf; a finite stand-in keeps exp2 at exactly 0
                // instead of NaN, without a branch that would split the lanes of a shuffle group.
                const float ms = (mnew == -HS_INF) ? 0.0f : mnew;
                const float alpha = exp2f(m[i] - ms);
                m[i] = mnew;
                l[i] *= alpha;
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    o[i][t].x *= alpha; o[i][t].y *= alpha; o[i][t].z *= alpha; o[i][t].w *= alpha;
                }
#pragma unroll
                for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                    s[i][jj] = exp2f(s[i][jj] - ms);
                    l[i] += s[i][jj];
                }
            }
            // A key hidden from this row must not reach it at all: weight 0 times an inf or NaN value
            // would still be NaN (the CPU engine skips hidden keys the same way). Only the chunks on the
            // causal diagonal or past Sk check each key; the rest run the loop without a test per key.
            if (lim[0] == HSA_CHUNK) {   // row0 is the thread's first row: every row sees every key
#pragma unroll
                for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                    float4 vv[4];
#pragma unroll
                    for (int t = 0; t < 4; ++t) vv[t] = vs[c0 + jj][t * G + g];
#pragma unroll
                    for (int i = 0; i < HSA_R; ++i) {
#pragma unroll
                        for (int t = 0; t < 4; ++t) hsa_axpy4(o[i][t], s[i][jj], vv[t]);
                    }
                }
            } else {
#pragma unroll
                for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                    float4 vv[4];
#pragma unroll
                    for (int t = 0; t < 4; ++t) vv[t] = vs[c0 + jj][t * G + g];
#pragma unroll
                    for (int i = 0; i < HSA_R; ++i) {
                        if (jj >= lim[i]) continue;
#pragma unroll
                        for (int t = 0; t < 4; ++t) hsa_axpy4(o[i][t], s[i][jj], vv[t]);
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < HSA_R; ++i) {
        const hs_i64 row = row0 + i * STRIDE;
        if (row >= sq) continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        E* orow = out + (bh * sq + row) * hd;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int d = 4 * (t * G + g);
            if (d + 0 < hd) orow[d + 0] = hs_st<E>(o[i][t].x * inv);
            if (d + 1 < hd) orow[d + 1] = hs_st<E>(o[i][t].y * inv);
            if (d + 2 < hd) orow[d + 2] = hs_st<E>(o[i][t].z * inv);
            if (d + 3 < hd) orow[d + 3] = hs_st<E>(o[i][t].w * inv);
        }
    }
}

// P is the name's type part: empty for float32 (the names predate the half kernels), f16_ or bf16_.
#define HSA_ENTRY_T(P, E, D)                                                                              \
    HS_KERNEL void __launch_bounds__(HSA_THREADS) hs_attention_##P##d##D(                                 \
        const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, E* __restrict__ out,   \
        hs_i64 sq, hs_i64 sk, int hd, float scale, int causal, int group, hs_i64 heads,                   \
        const hs_i64* __restrict__ kvlen) {                                                               \
        hsa_attention<D, E>(q, k, v, out, sq, sk, hd, scale, causal, group, heads, kvlen);                   \
    }
#define HSA_ENTRY(D) HSA_ENTRY_T(, float, D) HSA_ENTRY_T(f16_, hs_half, D) HSA_ENTRY_T(bf16_, hs_bf16, D)

HSA_ENTRY(32)
HSA_ENTRY(64)
HSA_ENTRY(128)
HSA_ENTRY(256)

// ------------------------------------------------------------------------------------ decode (split-K)
// One query per head (Sq == 1, the decode step against a KV cache), flash-decoding style: the keys of one
// (batch, KV head) are cut into `nsplit` ranges of `chunk` keys, one block per (slab, block of up to
// HSD_G query heads of the slab's group, range), so that a single query still fills the device; each block
// reads its K and V range once for all of its query heads, and a second kernel combines the ranges.
// A block is HSA_THREADS threads in groups of TPK = D / 8, a group per key (each thread 8 dims, one
// 16-byte load of K and of V per key for half, two for float32), KPB = HSA_THREADS / TPK keys in flight
// per block step; a score is the group's 8-dim dot products summed over log2(TPK) xor shuffles. Each group
// runs the online softmax (base 2, q pre-scaled by scale * log2(e)) over its keys, per query head; the
// block then merges its groups through shared memory and writes per query head (max, sum, unnormalised
// output) to `part` (float32, (B * H, nsplit, D + 2)). The loop runs the same number of steps in every
// lane (a key past the range is a masked step), so the shuffles always see the whole warp.
// Bandwidth: docs/design/kernels.md, "Decode attention on the GPU".
#define HSD_G 8   // query heads per block: q and o take 2 * 8 * HSD_G registers per thread

template <int D, class E>
HS_DEV void hsd_decode(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                       float* __restrict__ part, hs_i64 sk, int hd, float scale, int causal, int group, hs_i64 hkv,
                       const hs_i64* __restrict__ kvlen, int nsplit, hs_i64 chunk) {
    constexpr int TPK = D / 8;
    constexpr int KPB = HSA_THREADS / TPK;
    __shared__ float red[KPB][HSD_G][D + 2];
    const int tid = threadIdx.x, lk = tid / TPK, lt = tid % TPK;
    const int hblocks = (group + HSD_G - 1) / HSD_G;
    hs_i64 bid = (hs_i64)blockIdx.x;
    const int split = (int)(bid % nsplit);
    bid /= nsplit;
    const int hb = (int)(bid % hblocks);
    const hs_i64 slab = bid / hblocks;   // b * hkv + KV head
    const int g0 = hb * HSD_G, ng = group - g0 < HSD_G ? group - g0 : HSD_G;
    const hs_i64 skv = kvlen ? kvlen[slab / hkv] : sk;
    // the one query sits at position skv - 1 under lower_right (every valid key), at 0 under upper_left
    const hs_i64 kend = causal == 1 ? (skv < 1 ? skv : 1) : skv;
    const hs_i64 j0 = split * chunk, j1 = j0 + chunk < kend ? j0 + chunk : kend;
    const bool vec = hd % 8 == 0 && ((hs_u64)k % 16) == 0 && ((hs_u64)v % 16) == 0 && ((hs_u64)q % 16) == 0;
    const float qs = scale * HSA_LOG2E;
    const int d0 = lt * 8;

    float qr[HSD_G][8], o[HSD_G][8], m[HSD_G], l[HSD_G];
#pragma unroll
    for (int gi = 0; gi < HSD_G; ++gi) {
        const hs_i64 row = slab * group + g0 + gi;   // the query head's row of q (Sq == 1)
        if (gi < ng && vec && d0 < hd) {
            hs_ld8(q + row * hd, d0 / 8, qr[gi]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) qr[gi][e] = gi < ng && d0 + e < hd ? hs_ld(q[row * hd + d0 + e]) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) { qr[gi][e] *= qs; o[gi][e] = 0.0f; }
        m[gi] = -HS_INF;
        l[gi] = 0.0f;
    }
    const E* kb = k + slab * sk * hd;
    const E* vb = v + slab * sk * hd;
    const hs_i64 steps = j1 > j0 ? (j1 - j0 + KPB - 1) / KPB : 0;
    // key j0 + st * KPB + lk of step st into (kx, vx): zeros past the range (a masked step) and past hd
    auto fetch = [&](hs_i64 st, float (&kx)[8], float (&vx)[8]) {
        const hs_i64 j = j0 + st * KPB + lk;
        const bool valid = st < steps && j < j1;
        if (valid && vec && d0 < hd) {
            hs_ld8(kb + j * hd, d0 / 8, kx);
            hs_ld8(vb + j * hd, d0 / 8, vx);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const bool in = valid && d0 + e < hd;
                kx[e] = in ? hs_ld(kb[j * hd + d0 + e]) : 0.0f;
                vx[e] = in ? hs_ld(vb[j * hd + d0 + e]) : 0.0f;
            }
        }
    };
    float kv[8], vv[8];
    fetch(0, kv, vv);
#pragma unroll 1
    for (hs_i64 st = 0; st < steps; ++st) {
        const bool valid = j0 + st * KPB + lk < j1;
        // the next step's loads go out before this step's arithmetic: two steps of K and V in flight per
        // thread (docs/design/kernels.md, "Decode attention on the GPU": bytes in flight per SM)
        float kn[8], vn[8];
        fetch(st + 1, kn, vn);
#pragma unroll
        for (int gi = 0; gi < HSD_G; ++gi) {
            if (gi < ng) {   // block-uniform; a guard, not a break, so the loop unrolls and the
                             // per-head arrays stay in registers
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) s = fmaf(qr[gi][e], kv[e], s);
#pragma unroll
                for (int msk = 1; msk < TPK; msk <<= 1) s += HS_SHFL_XOR(s, msk);
                if (valid) {
                    const float mn = fmaxf(m[gi], s);
                    const float ms = mn == -HS_INF ? 0.0f : mn;   // as the SIMT kernel: exp2 stays 0, not NaN
                    const float alpha = exp2f(m[gi] - ms), p = exp2f(s - ms);
                    l[gi] = fmaf(l[gi], alpha, p);
#pragma unroll
                    for (int e = 0; e < 8; ++e) o[gi][e] = fmaf(p, vv[e], o[gi][e] * alpha);
                    m[gi] = mn;
                }
            }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) { kv[e] = kn[e]; vv[e] = vn[e]; }
    }
    // merge the block's KPB key groups, per query head and dim
#pragma unroll
    for (int gi = 0; gi < HSD_G; ++gi) {
        if (gi < ng) {
#pragma unroll
            for (int e = 0; e < 8; ++e) red[lk][gi][2 + d0 + e] = o[gi][e];
            if (lt == 0) { red[lk][gi][0] = m[gi]; red[lk][gi][1] = l[gi]; }
        }
    }
    __syncthreads();
    for (int idx = tid; idx < ng * D; idx += HSA_THREADS) {
        const int gi = idx / D, dd = idx % D;
        float M = -HS_INF;
        for (int g2 = 0; g2 < KPB; ++g2) M = fmaxf(M, red[g2][gi][0]);
        float L = 0.0f, O = 0.0f;
        for (int g2 = 0; g2 < KPB; ++g2) {
            const float mg = red[g2][gi][0];
            const float w = mg == -HS_INF ? 0.0f : exp2f(mg - M);   // a group that saw no key weighs nothing
            L = fmaf(red[g2][gi][1], w, L);
            O = fmaf(red[g2][gi][2 + dd], w, O);
        }
        float* pr = part + ((slab * group + g0 + gi) * nsplit + split) * (hs_i64)(D + 2);
        pr[2 + dd] = O;
        if (dd == 0) { pr[0] = M; pr[1] = L; }
    }
}

// out row r (B * H rows, Sq == 1) from its nsplit partials: M = max m_s, out = sum_s 2^(m_s - M) o_s / sum_s
// 2^(m_s - M) l_s; a row whose ranges saw no key (kv_len 0) gets zeros.
template <class E>
HS_DEV void hsd_combine(const float* __restrict__ part, E* __restrict__ out, int hd, int dstride, int nsplit) {
    const hs_i64 r = (hs_i64)blockIdx.x;
    const float* pr = part + r * nsplit * (hs_i64)dstride;
    float M = -HS_INF;
    for (int s2 = 0; s2 < nsplit; ++s2) M = fmaxf(M, pr[s2 * dstride]);
    float L = 0.0f;
    for (int s2 = 0; s2 < nsplit; ++s2) {
        const float ms = pr[s2 * dstride];
        L = fmaf(pr[s2 * dstride + 1], ms == -HS_INF ? 0.0f : exp2f(ms - M), L);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int dd = threadIdx.x; dd < hd; dd += HSA_THREADS) {
        float O = 0.0f;
        for (int s2 = 0; s2 < nsplit; ++s2) {
            const float ms = pr[s2 * dstride];
            O = fmaf(pr[s2 * dstride + 2 + dd], ms == -HS_INF ? 0.0f : exp2f(ms - M), O);
        }
        out[r * hd + dd] = hs_st<E>(O * inv);
    }
}

#define HSD_ENTRY_T(P, E, D)                                                                              \
    HS_KERNEL void __launch_bounds__(HSA_THREADS) hs_attention_decode_##P##d##D(                          \
        const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, float* __restrict__ part, \
        hs_i64 sk, int hd, float scale, int causal, int group, hs_i64 hkv, const hs_i64* __restrict__ kvlen, \
        int nsplit, hs_i64 chunk) {                                                                       \
        hsd_decode<D, E>(q, k, v, part, sk, hd, scale, causal, group, hkv, kvlen, nsplit, chunk);         \
    }
#define HSD_ENTRY(D) HSD_ENTRY_T(, float, D) HSD_ENTRY_T(f16_, hs_half, D) HSD_ENTRY_T(bf16_, hs_bf16, D)
HSD_ENTRY(32)
HSD_ENTRY(64)
HSD_ENTRY(128)
HSD_ENTRY(256)
#define HSD_COMBINE(P, E)                                                                                 \
    HS_KERNEL void __launch_bounds__(HSA_THREADS) hs_attention_decode_combine_##P(                        \
        const float* __restrict__ part, E* __restrict__ out, int hd, int dstride, int nsplit) {           \
        hsd_combine<E>(part, out, hd, dstride, nsplit);                                                   \
    }
HSD_COMBINE(f32, float)
HSD_COMBINE(f16, hs_half)
HSD_COMBINE(bf16, hs_bf16)

// ------------------------------------------------------------------------------------ tensor cores
// FlashAttention-2 on NVIDIA's mma.sync m16n8k16 (prelude.h's "warp matrix" section), for float16 and
// bfloat16 q, k, v: hs_attention_f16_mma_d<D> and hs_attention_bf16_mma_d<D>, D = 32, 64, 128, 256.
//
// A block of 4 warps owns 64 query rows of one (batch, head), 16 per warp, and streams K and V through
// shared memory in tiles of BN keys, double-buffered: the next tile's cp.async copies are in flight while
// the warps compute on this one. Each warp keeps its Q rows in registers as mma A fragments, computes
// its 16 x BN scores S = Q K^T with K's B fragments from ldmatrix, and runs the online softmax (base 2,
// running max m and sum l per row, in float32) on S's accumulator fragments: a lane holds two elements
// of rows g and g + 8 per 8-key tile (prelude.h's layouts), and the row max is a max over the 4 lanes of
// a row (2 shuffles). P = 2^(S*scale*log2(e) - m) is rounded to the input type, as FlashAttention does,
// and, since two S tiles side by side are laid out as one A fragment, feeds O += P V directly (V's B
// fragments from ldmatrix .trans). l sums the rounded P, so the weights that multiply V are exactly the
// ones normalised: a row's output is a convex combination of V rows before its final rounding.
// The scale is applied to S in float32 (not folded into Q, which would round q * scale to 16 bits).
//
// Causal (top-left aligned, as the SIMT kernel): the block stops at its last row's keys, a warp skips
// key steps of 16 that lie wholly above its rows, and masks the scores of the one 16 x 16 step on its
// diagonal. A hidden key must not reach a row at all, and in the diagonal step the tensor core would
// multiply a hidden key's weight 0 by its value: 0 * inf is NaN. So that step first checks its 16 V
// rows; if one holds inf or NaN (rare: one warp vote per diagonal step otherwise), the step is done
// without the tensor core, visible keys only. Keys past Sk (and dims past hd) are zeros in shared
// memory, so a zero weight meets a zero value there. A row that sees no key (Sk == 0) gets zeros.
// Launch: block 128, grid (ceil(Sq / 64) * B * H), the heaviest causal tiles first.
#if defined(HS_MMA_M16N8K16) || defined(HS_MFMA_16X16X16)
template <class E> HS_DEV bool hsm_nonfinite2(hs_u32 w);
// exponent all ones in either half: inf or NaN
template <> HS_DEV bool hsm_nonfinite2<hs_half>(hs_u32 w) { return (w & 0x7c00u) == 0x7c00u || (w & 0x7c000000u) == 0x7c000000u; }
template <> HS_DEV bool hsm_nonfinite2<hs_bf16>(hs_u32 w) { return (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u; }
#endif

#if defined(HS_MMA_M16N8K16)
// HSM_WARPS, HSM_THREADS (HSM_WARPS * 32) and HSM_ROWS (HSM_WARPS * 16): kernel_constants.py.

// One BN x D tile of K and of V into shared memory, rows of LD elements, zeros past `kend` and `hd`.
// `vec`: hd a multiple of 8 and k, v 16-byte aligned, so rows go as 16-byte cp.async copies.
template <int D, int BN, int LD>
HS_DEV void hsm_load_tile(hs_u16 (*kd)[LD], hs_u16 (*vd)[LD], const hs_u16* kb, const hs_u16* vb, hs_i64 kt,
                          hs_i64 kend, int hd, bool vec) {
    constexpr int CH = D / 8;   // 16-byte chunks per row
    for (int idx = threadIdx.x; idx < BN * CH; idx += HSM_THREADS) {
        const int j = idx / CH, c = (idx % CH) * 8;
        const hs_i64 key = kt + j;
        hs_u16* kdst = &kd[j][c];
        hs_u16* vdst = &vd[j][c];
        if (vec && key < kend && c < hd) {
            hs_cp_async16(kdst, kb + key * hd + c);
            hs_cp_async16(vdst, vb + key * hd + c);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const bool in = key < kend && c + e < hd;
                kdst[e] = in ? kb[key * hd + c + e] : (hs_u16)0;
                vdst[e] = in ? vb[key * hd + c + e] : (hs_u16)0;
            }
        }
    }
    hs_cp_async_commit();
}

// The A fragment of Q's rows `row`, row + 8 and dims col .. col + 1, col + 8 .. col + 9 (col even), zeros
// past sq and hd. `word`: hd even and q 4-byte aligned, so each pair is one 32-bit load.
HS_DEV void hsm_q_frag(hs_u32 a[4], const hs_u16* qb, hs_i64 row0, int col0, hs_i64 sq, int hd, bool word) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const hs_i64 row = row0 + 8 * (i & 1);
        const int col = col0 + 8 * (i >> 1);
        if (word) {
            a[i] = row < sq && col < hd ? *reinterpret_cast<const hs_u32*>(qb + row * hd + col) : 0u;
        } else {
            const hs_u32 lo = row < sq && col < hd ? qb[row * hd + col] : 0u;
            const hs_u32 hi = row < sq && col + 1 < hd ? qb[row * hd + col + 1] : 0u;
            a[i] = lo | (hi << 16);
        }
    }
}

template <int D, class E>
HS_DEV void hsm_attention(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                          E* __restrict__ out, hs_i64 sq, hs_i64 sk, int hd, float scale, int causal,
                          int group, hs_i64 heads, const hs_i64* __restrict__ kvlen) {
    // keys per tile: registers for S, 16 KiB or so per buffer pair (d256: 16 keys, 8 registers of S)
    constexpr int BN = D == 256 ? 16 : D == 128 ? 32 : 64;
    constexpr int LD = D + 8;                // row stride: 16 bytes of padding, so ldmatrix's 8 rows hit 8 bank groups
    constexpr int KS = D / 16;               // k steps of Q K^T
    // Q's A fragments held in registers for the whole block up to d128; at d256 they would be 64 registers
    // beside O's 128, past the 255 a thread has (NVRTC spilled), so each k step reads its fragment again
    // (4 32-bit loads a lane, from L1: the block's 32 KiB of Q stays there, read once from memory)
    constexpr bool QREG = D <= 128;
    constexpr int NT = BN / 8;               // 8-key tiles of S
    constexpr int DT = D / 8;                // 8-dim tiles of O
    alignas(16) __shared__ hs_u16 ks[2][BN][LD];
    alignas(16) __shared__ hs_u16 vs[2][BN][LD];
    __shared__ float pw[HSM_WARPS][16][16];  // the rare no-tensor-core diagonal step's weights

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const hs_i64 tiles = (sq + HSM_ROWS - 1) / HSM_ROWS;
    const hs_i64 bh = (hs_i64)blockIdx.x / tiles;
    const hs_i64 q0 = (tiles - 1 - (hs_i64)blockIdx.x % tiles) * HSM_ROWS;   // causal: longest rows first
    const hs_i64 r0 = q0 + 16 * warp;
    const hs_u16* qb = reinterpret_cast<const hs_u16*>(q) + bh * sq * hd;
    // grouped heads, kv_len and lower_right as in the SIMT kernel; the planner sends lower_right here only
    // when every row's offset off is a multiple of 16, so the diagonal steps stay aligned to 16 keys
    const hs_i64 skv = kvlen ? kvlen[bh / heads] : sk;
    const hs_i64 off = causal == 2 ? skv - sq : 0;
    const hs_i64 rd = r0 + off;   // the key on the warp's first row's diagonal (its last visible one)
    const hs_u16* kb = reinterpret_cast<const hs_u16*>(k) + (bh / group) * sk * hd;
    const hs_u16* vb = reinterpret_cast<const hs_u16*>(v) + (bh / group) * sk * hd;
    const bool vec = hd % 8 == 0 && ((hs_u64)kb % 16) == 0 && ((hs_u64)vb % 16) == 0;

    // an even hd and a 4-byte aligned q: a fragment's pair (col, col + 1), col even, is one 32-bit word
    const bool qw = hd % 2 == 0 && ((hs_u64)qb % 4) == 0;
    hs_u32 qa[QREG ? KS : 1][4];
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) hsm_q_frag(qa[QREG ? kk : 0], qb, r0 + g, 16 * kk + 2 * t, sq, hd, qw);
    }
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {-HS_INF, -HS_INF}, l[2] = {0.0f, 0.0f};   // rows g and g + 8; l is this lane's part
    const float qs = scale * HSA_LOG2E;

    hs_i64 kend = skv;
    if (causal && q0 + off + HSM_ROWS < kend) kend = q0 + off + HSM_ROWS;
    const hs_i64 ntiles = (kend + BN - 1) / BN;
    if (ntiles > 0) hsm_load_tile<D, BN, LD>(ks[0], vs[0], kb, vb, 0, kend, hd, vec);
#pragma unroll 1
    for (hs_i64 it = 0; it < ntiles; ++it) {
        const int buf = (int)(it & 1);
        const hs_i64 kt = it * BN;
        if (it + 1 < ntiles) {
            hsm_load_tile<D, BN, LD>(ks[buf ^ 1], vs[buf ^ 1], kb, vb, kt + BN, kend, hd, vec);
            hs_cp_async_wait<1>();
        } else {
            hs_cp_async_wait<0>();
        }
        __syncthreads();
        if (!causal || kt <= rd + 15) {   // warp-uniform: some key of the tile is visible to the warp
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
                hs_u32 qf[4];
                if (!QREG) hsm_q_frag(qf, qb, r0 + g, 16 * kk + 2 * t, sq, hd, qw);
                const hs_u32* a = QREG ? qa[QREG ? kk : 0] : qf;
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    // matrices: keys +0 / +8 (lane / 16) by dims +0 / +8 ((lane / 8) % 2)
                    hs_u32 b[4];
                    hs_ldsm_x4(b, &ks[buf][16 * np + (lane / 16) * 8 + lane % 8][16 * kk + ((lane / 8) % 2) * 8]);
                    hs_mma_16816<E>(s[2 * np], a, b);
                    hs_mma_16816<E>(s[2 * np + 1], a, b + 2);
                }
            }
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const hs_i64 key = kt + 8 * nt + 2 * t + (i & 1);
                    const hs_i64 row = r0 + g + 8 * (i >> 1);
                    const bool vis = key < skv && (!causal || key <= row + off);
                    s[nt][i] = vis ? s[nt][i] * qs : -HS_INF;
                    mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
                }
            }
            float ms[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], HS_SHFL_XOR(mx[r], 1));
                mx[r] = fmaxf(mx[r], HS_SHFL_XOR(mx[r], 2));
                // as the SIMT kernel: a finite stand-in for a row with no key yet keeps exp2 at exactly 0
                ms[r] = (mx[r] == -HS_INF) ? 0.0f : mx[r];
                const float alpha = exp2f(m[r] - ms[r]);
                m[r] = mx[r];
                l[r] *= alpha;
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) { o[dt][2 * r] *= alpha; o[dt][2 * r + 1] *= alpha; }
            }
            // P as A fragments, key step j = S tiles 2j (registers 0, 1: rows g, g + 8) and 2j + 1 (2, 3)
            hs_u32 pa[NT / 2][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const hs_u32 p = hs_pack2<E>(exp2f(s[nt][2 * r] - ms[r]), exp2f(s[nt][2 * r + 1] - ms[r]));
                    pa[nt / 2][2 * (nt % 2) + r] = p;
                    l[r] += hs_unpack_lo<E>(p) + hs_unpack_hi<E>(p);
                }
            }
            // The diagonal step (the warp's rows r0..r0+15 against keys r0..r0+15, both multiples of 16),
            // if it is in this tile: does a V row there hold inf or NaN? One vote of the warp.
            const int jd = causal && kt <= rd && rd < kt + BN ? (int)((rd - kt) / 16) : -1;
            bool bad = false;
            if (jd >= 0) {
#pragma unroll
                for (int w = lane; w < 16 * D / 2; w += 32) {
                    const hs_u32 word = *reinterpret_cast<const hs_u32*>(&vs[buf][16 * jd + w / (D / 2)][(w % (D / 2)) * 2]);
                    bad |= hsm_nonfinite2<E>(word);
                }
                bad = __any_sync(0xffffffffu, bad);
            }
#pragma unroll
            for (int j = 0; j < BN / 16; ++j) {
                if (causal && kt + 16 * j > rd + 15) break;   // this step and the rest: above every row of the warp
                if (j == jd && bad) {
                    // the diagonal step without the tensor core (below): its weights to shared memory
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const hs_u32 p = pa[j][2 * h + r];
                            pw[warp][g + 8 * r][8 * h + 2 * t] = hs_unpack_lo<E>(p);
                            pw[warp][g + 8 * r][8 * h + 2 * t + 1] = hs_unpack_hi<E>(p);
                        }
                    }
                    continue;
                }
#pragma unroll
                for (int dp = 0; dp < DT / 2; ++dp) {
                    // matrices (transposed): keys +0 / +8 ((lane / 8) % 2) by dims +0 / +8 (lane / 16)
                    hs_u32 b[4];
                    hs_ldsm_x4_trans(b, &vs[buf][16 * j + ((lane / 8) % 2) * 8 + lane % 8][16 * dp + (lane / 16) * 8]);
                    hs_mma_16816<E>(o[2 * dp], pa[j], b);
                    hs_mma_16816<E>(o[2 * dp + 1], pa[j], b + 2);
                }
            }
            if (bad) {
                // each output element sums its row's visible keys of the diagonal step (key r0 + jj is
                // visible to row r0 + rr when jj <= rr); keys past Sk are zeros with weight 0
                __syncwarp();
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int rr = g + 8 * (i >> 1), dim = 8 * dt + 2 * t + (i & 1);
                        float acc = o[dt][i];
#pragma unroll 1
                        for (int jj = 0; jj <= rr; ++jj) {
                            E e; e.bits = vs[buf][16 * jd + jj][dim];
                            acc += pw[warp][rr][jj] * hs_ld(e);
                        }
                        o[dt][i] = acc;
                    }
                }
                __syncwarp();
            }
        }
        __syncthreads();   // the next iteration's copies overwrite this buffer
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float lr = l[r];
        lr += HS_SHFL_XOR(lr, 1);
        lr += HS_SHFL_XOR(lr, 2);
        const hs_i64 row = r0 + g + 8 * r;
        if (row >= sq) continue;
        const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
        E* orow = out + (bh * sq + row) * hd;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            const int d = 8 * dt + 2 * t;
            if (d < hd) orow[d] = hs_st<E>(o[dt][2 * r] * inv);
            if (d + 1 < hd) orow[d + 1] = hs_st<E>(o[dt][2 * r + 1] * inv);
        }
    }
}

#define HSM_ENTRY_T(P, E, D)                                                                              \
    HS_KERNEL void __launch_bounds__(HSM_THREADS) hs_attention_##P##mma_d##D(                             \
        const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, E* __restrict__ out,   \
        hs_i64 sq, hs_i64 sk, int hd, float scale, int causal, int group, hs_i64 heads,                   \
        const hs_i64* __restrict__ kvlen) {                                                               \
        hsm_attention<D, E>(q, k, v, out, sq, sk, hd, scale, causal, group, heads, kvlen);                   \
    }
#define HSM_ENTRY(D) HSM_ENTRY_T(f16_, hs_half, D) HSM_ENTRY_T(bf16_, hs_bf16, D)

HSM_ENTRY(32)
HSM_ENTRY(64)
HSM_ENTRY(128)
HSM_ENTRY(256)
#endif  // HS_MMA_M16N8K16

// ------------------------------------------------------------------------------------ matrix cores (AMD)
// The same FlashAttention-2 scheme and entry points (hs_attention_{f16,bf16}_mma_d<D>) on AMD's MFMA
// 16x16x16 at wavefront 64 (prelude.h's HS_MFMA_16X16X16: gfx908, gfx90a, gfx940-942). Its accumulator
// holds columns where A and B hold rows (prelude.h's layouts), so each wave computes the transposes:
// S^T = K Q^T, with K's rows as A and Q^T as B, and O^T = V^T P^T. A lane then holds, in S^T and in O^T
// alike, values of one query row (lane % 16): keys (or dims) 4q .. 4q + 3 of each 16, q = lane / 16. The
// S^T accumulator rounded to the input type is, register for register, the B fragment of P^T, and the
// online softmax keeps one running max and sum per lane, combined over the 4 lanes of a row (2 shuffles).
// Arithmetic, rounding and causal handling are the NVIDIA kernel's above (the accuracy contract is the
// same): scores scaled in float32, P rounded to the input type, l summing the rounded P, the diagonal
// 16 x 16 step done without the matrix core when one of its V rows holds inf or NaN.
//
// A block of 4 waves (256 threads) owns 64 query rows, 16 per wave. CDNA has no asynchronous copy to
// LDS, so the next K/V tile is prefetched into registers (16-byte global loads) while the waves compute
// on this one, then written to the one LDS buffer between two barriers. K stays row-major (a lane's A
// fragment is 4 consecutive dims of one key: one 8-byte LDS read); V is stored transposed, dims by keys,
// so that V^T's A fragment (4 consecutive keys of one dim) is one 8-byte read too. Rows are padded by 8
// bytes, spreading a fragment read's 16 rows over the banks.
// Launch: block 256, grid (ceil(Sq / 64) * B * H), the heaviest causal tiles first.
#if defined(HS_MFMA_16X16X16)
// HSF_WARPS, HSF_THREADS (HSF_WARPS * 64) and HSF_ROWS (HSF_WARPS * 16): kernel_constants.py.

// This thread's 16-byte chunks of the BN x D tiles of K and V at key kt, as 16-bit patterns: zeros past
// `kend` and `hd`. `vec`: hd a multiple of 8 and k, v 16-byte aligned, so a chunk is one 16-byte load.
template <int D, int BN, int N>
HS_DEV void hsf_fetch(hs_u32 (&kr)[N][4], hs_u32 (&vr)[N][4], const hs_u16* kb, const hs_u16* vb, hs_i64 kt,
                      hs_i64 kend, int hd, bool vec) {
    constexpr int CH = D / 8;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const int idx = threadIdx.x + n * HSF_THREADS;
        const int j = idx / CH, c = (idx % CH) * 8;
        const hs_i64 key = kt + j;
        if (idx >= BN * CH) break;
        if (vec && key < kend && c < hd) {
            const float4 kw = *reinterpret_cast<const float4*>(kb + key * hd + c);
            const float4 vw = *reinterpret_cast<const float4*>(vb + key * hd + c);
            kr[n][0] = __float_as_uint(kw.x); kr[n][1] = __float_as_uint(kw.y);
            kr[n][2] = __float_as_uint(kw.z); kr[n][3] = __float_as_uint(kw.w);
            vr[n][0] = __float_as_uint(vw.x); vr[n][1] = __float_as_uint(vw.y);
            vr[n][2] = __float_as_uint(vw.z); vr[n][3] = __float_as_uint(vw.w);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int d = c + 2 * e;
                const bool lo = key < kend && d < hd, hi = key < kend && d + 1 < hd;
                kr[n][e] = (lo ? (hs_u32)kb[key * hd + d] : 0u) | ((hi ? (hs_u32)kb[key * hd + d + 1] : 0u) << 16);
                vr[n][e] = (lo ? (hs_u32)vb[key * hd + d] : 0u) | ((hi ? (hs_u32)vb[key * hd + d + 1] : 0u) << 16);
            }
        }
    }
}

// The fetched chunks into LDS: K's row-major (two 8-byte stores), V's transposed (element by element).
template <int D, int BN, int N, int LDK, int LDV>
HS_DEV void hsf_store(hs_u16 (*ks)[LDK], hs_u16 (*vt)[LDV], const hs_u32 (&kr)[N][4], const hs_u32 (&vr)[N][4]) {
    constexpr int CH = D / 8;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const int idx = threadIdx.x + n * HSF_THREADS;
        const int j = idx / CH, c = (idx % CH) * 8;
        if (idx >= BN * CH) break;
        hs_u64* kd = reinterpret_cast<hs_u64*>(&ks[j][c]);
        kd[0] = (hs_u64)kr[n][0] | ((hs_u64)kr[n][1] << 32);
        kd[1] = (hs_u64)kr[n][2] | ((hs_u64)kr[n][3] << 32);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            vt[c + 2 * e][j] = (hs_u16)(vr[n][e] & 0xffffu);
            vt[c + 2 * e + 1][j] = (hs_u16)(vr[n][e] >> 16);
        }
    }
}

// The two registers of a fragment: 4 consecutive 16-bit elements (8-byte aligned) of LDS.
HS_DEV void hsf_frag(hs_u32* r, const hs_u16* p) {
    const hs_u64 w = *reinterpret_cast<const hs_u64*>(p);
    r[0] = (hs_u32)w;
    r[1] = (hs_u32)(w >> 32);
}

// P's scale before its rounding to the input type. MI200's (gfx90a) f16 MFMA reads subnormal inputs
// as zero: a numerator exp(s - m) under 2^-14, rounded to float16, would count in l but not in P V,
// and a peaky row's many such keys would move its output by their summed weight. Scaled by 2^15 (exact;
// the largest, 1, becomes 32768, within float16's 65504) only numerators under 2^-29 are subnormal, which
// is below the rounding's own underflow (2^-25) without the scale; l and O carry the same factor, which
// the final division removes. bfloat16 has float32's exponent range: no scale.
template <class E> struct HsfPScale { static constexpr float v = 1.0f; };
template <> struct HsfPScale<hs_half> { static constexpr float v = 32768.0f; };

template <int D, class E>
HS_DEV void hsf_attention(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                          E* __restrict__ out, hs_i64 sq, hs_i64 sk, int hd, float scale, int causal,
                          int group, hs_i64 heads, const hs_i64* __restrict__ kvlen) {
    // keys per tile: LDS about 17-18 KiB, 3 blocks per CU (d256: 16 keys, one S^T step; Q^T's 32 registers
    // and O^T's 64 held as below, within CDNA's 512 per lane)
    constexpr int BN = D == 256 ? 16 : D == 128 ? 32 : 64;
    constexpr int LDK = D + 4, LDV = BN + 4;
    constexpr int KS = D / 16;               // k steps of S^T = K Q^T
    constexpr int NT = BN / 16;              // 16-key steps of a tile
    constexpr int DT = D / 16;               // 16-dim tiles of O^T
    constexpr int NCH = (BN * D / 8 + HSF_THREADS - 1) / HSF_THREADS;   // 16-byte chunks per thread per tile
    alignas(16) __shared__ hs_u16 ks[BN][LDK];
    alignas(16) __shared__ hs_u16 vt[D][LDV];

    const int warp = threadIdx.x / 64, lane = threadIdx.x % 64, qi = lane % 16, qd = lane / 16;
    const hs_i64 tiles = (sq + HSF_ROWS - 1) / HSF_ROWS;
    const hs_i64 bh = (hs_i64)blockIdx.x / tiles;
    const hs_i64 q0 = (tiles - 1 - (hs_i64)blockIdx.x % tiles) * HSF_ROWS;   // causal: longest rows first
    const hs_i64 r0 = q0 + 16 * warp, row = r0 + qi;
    const hs_u16* qb = reinterpret_cast<const hs_u16*>(q) + bh * sq * hd;
    // grouped heads, kv_len and lower_right as in the SIMT kernel; the planner sends lower_right here only
    // when every row's offset off is a multiple of 16, so the diagonal steps stay aligned to 16 keys
    const hs_i64 skv = kvlen ? kvlen[bh / heads] : sk;
    const hs_i64 off = causal == 2 ? skv - sq : 0;
    const hs_i64 rd = r0 + off;   // the key on the warp's first row's diagonal (its last visible one)
    const hs_u16* kb = reinterpret_cast<const hs_u16*>(k) + (bh / group) * sk * hd;
    const hs_u16* vb = reinterpret_cast<const hs_u16*>(v) + (bh / group) * sk * hd;
    const bool vec = hd % 8 == 0 && ((hs_u64)kb % 16) == 0 && ((hs_u64)vb % 16) == 0;

    // Q^T's B fragments: this lane's row, dims 16 kk + 4 qd .. + 3
    hs_u32 qf[KS][2];
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int col = 16 * kk + 4 * qd + 2 * h;
            const hs_u32 lo = row < sq && col < hd ? qb[row * hd + col] : 0u;
            const hs_u32 hi = row < sq && col + 1 < hd ? qb[row * hd + col + 1] : 0u;
            qf[kk][h] = lo | (hi << 16);
        }
    }
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m = -HS_INF, l = 0.0f;   // this lane's row; l is this lane's part (its keys 4 qd .. of each 16)
    const float qs = scale * HSA_LOG2E;

    hs_i64 kend = skv;
    if (causal && q0 + off + HSF_ROWS < kend) kend = q0 + off + HSF_ROWS;
    const hs_i64 ntiles = (kend + BN - 1) / BN;
    hs_u32 kr[NCH][4], vr[NCH][4];
    if (ntiles > 0) hsf_fetch<D, BN, NCH>(kr, vr, kb, vb, 0, kend, hd, vec);
#pragma unroll 1
    for (hs_i64 it = 0; it < ntiles; ++it) {
        const hs_i64 kt = it * BN;
        __syncthreads();   // every wave is done with the previous tile
        hsf_store<D, BN, NCH, LDK, LDV>(ks, vt, kr, vr);
        __syncthreads();
        if (it + 1 < ntiles) hsf_fetch<D, BN, NCH>(kr, vr, kb, vb, kt + BN, kend, hd, vec);   // in flight meanwhile
        if (causal && kt > rd + 15) continue;   // wave-uniform: no key of the tile is visible to the wave
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                hs_u32 a[2];
                hsf_frag(a, &ks[16 * nt + qi][16 * kk + 4 * qd]);
                hs_mfma_16x16x16<E>(s[nt], a, qf[kk]);
            }
        }
        float mx = m;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const hs_i64 key = kt + 16 * nt + 4 * qd + r;
                const bool vis = key < skv && (!causal || key <= row + off);
                s[nt][r] = vis ? s[nt][r] * qs : -HS_INF;
                mx = fmaxf(mx, s[nt][r]);
            }
        }
        mx = fmaxf(mx, HS_SHFL_XOR(mx, 16));
        mx = fmaxf(mx, HS_SHFL_XOR(mx, 32));
        // as the other kernels: a finite stand-in for a row with no key yet keeps exp2 at exactly 0
        const float ms = (mx == -HS_INF) ? 0.0f : mx;
        const float alpha = exp2f(m - ms);
        m = mx;
        l *= alpha;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) { o[dt][0] *= alpha; o[dt][1] *= alpha; o[dt][2] *= alpha; o[dt][3] *= alpha; }
        // P^T's B fragments, key step nt: the S^T accumulator rounded, two keys per register
        hs_u32 pb[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const hs_u32 p = hs_pack2<E>(exp2f(s[nt][2 * h] - ms) * HsfPScale<E>::v,
                                             exp2f(s[nt][2 * h + 1] - ms) * HsfPScale<E>::v);
                pb[nt][h] = p;
                l += hs_unpack_lo<E>(p) + hs_unpack_hi<E>(p);
            }
        }
        // The diagonal step (rows r0..r0+15 against keys r0..r0+15), if in this tile: a V row with inf or
        // NaN there? Its 16 keys are 8 words of each of V^T's D rows; one vote of the wave.
        const int jd = causal && kt <= rd && rd < kt + BN ? (int)((rd - kt) / 16) : -1;
        bool bad = false;
        if (jd >= 0) {
#pragma unroll
            for (int w = lane; w < 8 * D; w += 64)
                bad |= hsm_nonfinite2<E>(*reinterpret_cast<const hs_u32*>(&vt[w / 8][16 * jd + 2 * (w % 8)]));
            bad = hs_warp_reduce<HsMax>(bad ? 1.0f : 0.0f) > 0.0f;
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if (causal && kt + 16 * nt > rd + 15) break;   // this step and the rest: above every row of the wave
            if (nt == jd && bad) continue;                 // below, without the matrix core
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                hs_u32 a[2];
                hsf_frag(a, &vt[16 * dt + qi][16 * nt + 4 * qd]);
                hs_mfma_16x16x16<E>(o[dt], a, pb[nt]);
            }
        }
        if (bad) {
            // Each output element sums its row's visible keys of the step (key r0 + jj is visible to row
            // r0 + qi when jj <= qi). Key jj's weight for row qi is item jj % 4 of lane qi + 16 (jj / 4):
            // a shuffle, with every lane in it (the loop is uniform, only the sum is per lane).
            hs_u32 pd[2] = {0u, 0u};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                if (nt == jd) { pd[0] = pb[nt][0]; pd[1] = pb[nt][1]; }
#pragma unroll 1
            for (int jj = 0; jj < 16; ++jj) {
                const hs_u32 reg = (jj & 2) ? pd[1] : pd[0];
                const float mine = (jj & 1) ? hs_unpack_hi<E>(reg) : hs_unpack_lo<E>(reg);
                const float wj = HS_SHFL(mine, qi + 16 * (jj / 4));
                if (jj > qi) continue;
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        E e; e.bits = vt[16 * dt + 4 * qd + r][16 * jd + jj];
                        o[dt][r] += wj * hs_ld(e);
                    }
                }
            }
        }
    }

    float lr = l;
    lr += HS_SHFL_XOR(lr, 16);
    lr += HS_SHFL_XOR(lr, 32);
    if (row >= sq) return;
    const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
    E* orow = out + (bh * sq + row) * hd;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int d = 16 * dt + 4 * qd + r;
            if (d < hd) orow[d] = hs_st<E>(o[dt][r] * inv);
        }
    }
}

#define HSF_ENTRY_T(P, E, D)                                                                              \
    HS_KERNEL void __launch_bounds__(HSF_THREADS) hs_attention_##P##mma_d##D(                             \
        const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, E* __restrict__ out,   \
        hs_i64 sq, hs_i64 sk, int hd, float scale, int causal, int group, hs_i64 heads,                   \
        const hs_i64* __restrict__ kvlen) {                                                               \
        hsf_attention<D, E>(q, k, v, out, sq, sk, hd, scale, causal, group, heads, kvlen);                   \
    }
#define HSF_ENTRY(D) HSF_ENTRY_T(f16_, hs_half, D) HSF_ENTRY_T(bf16_, hs_bf16, D)

HSF_ENTRY(32)
HSF_ENTRY(64)
HSF_ENTRY(128)
HSF_ENTRY(256)
#endif  // HS_MFMA_16X16X16
