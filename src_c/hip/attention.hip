// Flash-attention style scaled dot-product attention, fp32 on SIMT cores (no tensor cores: results must
// match the CPU engine to ~1e-5), for q (B, H, Sq, hd), k and v (B, H, Sk, hd), all contiguous.
//
// Tiling: a block of 128 threads owns ROWS query rows of one (batch, head); G = D/32 threads share a row
// and each holds 32 of its (padded) dims in registers, as 8 float4 chunks interleaved across the group:
// chunk t of thread g covers dims 4*(t*G+g) .. +3, so the G lanes of a row read consecutive 16-byte
// words of a shared key (no bank conflicts) and every row of the warp reads the same key (broadcast).
// K and V stream through shared memory in tiles of BK keys (32 KiB for both); an online softmax in base
// 2 (q pre-scaled by scale*log2(e)) keeps the state per row at (m, l, o[32]): no Sq x Sk matrix.
// Causal is top-left aligned like torch SDPA(is_causal=True): row i sees keys j <= i, and key tiles
// entirely above a block's last row are skipped. A row that sees no key (Sk == 0) gets zeros.
//
// Entry points per head-dim class (hd <= D, the rest zero-padded): hs_attention_d32/_d64/_d128/_d256.
// Launch: block 128, grid (ceil(Sq / ROWS) * B * H), ROWS = 128 / (D / 32).

#define HSA_THREADS 128
#define HSA_CHUNK 16          // keys scored together before one online-softmax rescale
#define HSA_LOG2E 1.4426950408889634f

HS_DEV float hsa_dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

template <int D>
HS_DEV void hsa_attention(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                          float* __restrict__ out, hs_i64 sq, hs_i64 sk, int hd, float scale, int causal) {
    constexpr int G = D / 32;                 // threads per query row
    constexpr int ROWS = HSA_THREADS / G;     // query rows per block
    constexpr int BK = 4096 / D;              // keys per shared tile: 2 * BK * D * 4 bytes = 32 KiB
    constexpr int D4 = D / 4;
    __shared__ float4 ks[BK][D4];
    __shared__ float4 vs[BK][D4];

    const int tid = threadIdx.x;
    const int g = tid % G;
    const hs_i64 tiles = (sq + ROWS - 1) / ROWS;
    const hs_i64 bh = (hs_i64)blockIdx.x / tiles;
    const hs_i64 q0 = ((hs_i64)blockIdx.x % tiles) * ROWS;
    const hs_i64 row = q0 + tid / G;
    const bool live = row < sq;
    const float* kb = k + bh * sk * hd;
    const float* vb = v + bh * sk * hd;

    const float qs = scale * HSA_LOG2E;
    float4 qr[8], o[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        float e[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int d = 4 * (t * G + g) + c;
            e[c] = (live && d < hd) ? q[(bh * sq + row) * hd + d] * qs : 0.0f;
        }
        qr[t] = make_float4(e[0], e[1], e[2], e[3]);
        o[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float m = -HS_INF, l = 0.0f;

    // Causal: keys past the block's last row are masked for every row of the block.
    hs_i64 kend = sk;
    if (causal && q0 + ROWS < kend) kend = q0 + ROWS;

    float* ksf = reinterpret_cast<float*>(ks);
    float* vsf = reinterpret_cast<float*>(vs);
    for (hs_i64 kt = 0; kt < kend; kt += BK) {
        for (int idx = tid; idx < BK * D; idx += HSA_THREADS) {
            const int j = idx / D, d = idx % D;
            const hs_i64 key = kt + j;
            const bool in = key < kend && d < hd;
            ksf[idx] = in ? kb[key * hd + d] : 0.0f;
            vsf[idx] = in ? vb[key * hd + d] : 0.0f;
        }
        __syncthreads();
#pragma unroll 1
        for (int c0 = 0; c0 < BK; c0 += HSA_CHUNK) {
            float s[HSA_CHUNK];
            float mnew = m;
#pragma unroll
            for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                float p = 0.0f;
#pragma unroll
                for (int t = 0; t < 8; ++t) p += hsa_dot4(qr[t], ks[c0 + jj][t * G + g]);
#pragma unroll
                for (int msk = 1; msk < G; msk <<= 1) p += HS_SHFL_XOR(p, msk);
                const hs_i64 key = kt + c0 + jj;
                const bool vis = key < kend && (!causal || key <= row);
                s[jj] = vis ? p : -HS_INF;
                mnew = fmaxf(mnew, s[jj]);
            }
            // Until a row has seen a key its max is -inf; a finite stand-in keeps exp2 at exactly 0
            // instead of NaN, without a branch that would split the lanes of a shuffle group.
            const float ms = (mnew == -HS_INF) ? 0.0f : mnew;
            const float alpha = exp2f(m - ms);
            l *= alpha;
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                o[t].x *= alpha; o[t].y *= alpha; o[t].z *= alpha; o[t].w *= alpha;
            }
#pragma unroll
            for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                const float p = exp2f(s[jj] - ms);
                l += p;
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const float4 vv = vs[c0 + jj][t * G + g];
                    o[t].x += p * vv.x; o[t].y += p * vv.y; o[t].z += p * vv.z; o[t].w += p * vv.w;
                }
            }
            m = mnew;
        }
        __syncthreads();
    }

    if (!live) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* orow = out + (bh * sq + row) * hd;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        const int d = 4 * (t * G + g);
        if (d + 0 < hd) orow[d + 0] = o[t].x * inv;
        if (d + 1 < hd) orow[d + 1] = o[t].y * inv;
        if (d + 2 < hd) orow[d + 2] = o[t].z * inv;
        if (d + 3 < hd) orow[d + 3] = o[t].w * inv;
    }
}

#define HSA_ENTRY(D)                                                                                      \
    HS_KERNEL void hs_attention_d##D(const float* __restrict__ q, const float* __restrict__ k,            \
                                     const float* __restrict__ v, float* __restrict__ out, hs_i64 sq,     \
                                     hs_i64 sk, int hd, float scale, int causal) {                        \
        hsa_attention<D>(q, k, v, out, sq, sk, hd, scale, causal);                                        \
    }

HSA_ENTRY(32)
HSA_ENTRY(64)
HSA_ENTRY(128)
HSA_ENTRY(256)
