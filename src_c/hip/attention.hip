// Flash-attention style scaled dot-product attention, fp32 on SIMT cores (no tensor cores: results must
// match the CPU engine to ~1e-5), for q (B, H, Sq, hd), k and v (B, H, Sk, hd), all contiguous.
//
// Tiling: a block of 128 threads owns ROWS query rows of one (batch, head). G = D/16 threads share a
// row, each holding 16 of its (padded) dims as 4 float4 chunks interleaved across the group (chunk t
// of thread g covers dims 4*(t*G+g) .. +3, so the G lanes of a row read consecutive 16-byte words of
// a shared key: no bank conflicts, and every row group of the warp reads the same words: broadcast).
// Each thread carries R rows (rows tid/G + i*128/G), so every K or V value read from shared memory
// feeds R FMAs: shared-memory traffic, not the FMA pipes, would otherwise bound the kernel.
// K and V stream through shared memory in tiles of BK keys (32 KiB for both); an online softmax in base
// 2 (q pre-scaled by scale*log2(e)) keeps the state per row at (m, l, o): no Sq x Sk matrix.
// Causal is top-left aligned like torch SDPA(is_causal=True): row i sees keys j <= i, and key tiles
// entirely above a block's last row are skipped. A row that sees no key (Sk == 0) gets zeros.
//
// Entry points per head-dim class (hd <= D, the rest zero-padded): hs_attention_d32/_d64/_d128/_d256 for
// float32, hs_attention_f16_d* and hs_attention_bf16_d* for float16 and bfloat16 q, k, v and out: those
// are widened on load (K and V tiles are float in shared memory), the running max, sum and output
// accumulate in float32, and each output is rounded once to the element type.
// Launch: block 128, grid (ceil(Sq / ROWS) * B * H), ROWS = HSA_R * 128 / (D / 16).

// Launch bounds matter on AMD: without them hipcc budgets registers for 1024-thread blocks (64 VGPRs)
// and this kernel would spill most of its state to scratch.
#define HSA_THREADS 128
#define HSA_R 2               // query rows per thread
#define HSA_CHUNK 8           // keys scored together before one online-softmax rescale
#define HSA_LOG2E 1.4426950408889634f

HS_DEV float hsa_dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

template <int D, class E>
HS_DEV void hsa_attention(const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                          E* __restrict__ out, hs_i64 sq, hs_i64 sk, int hd, float scale, int causal) {
    constexpr int G = D / 16;                        // threads per query row
    constexpr int STRIDE = HSA_THREADS / G;          // distance between a thread's rows
    constexpr int ROWS = STRIDE * HSA_R;             // query rows per block
    constexpr int BK = 4096 / D;                     // keys per shared tile: 2 * BK * D * 4 bytes = 32 KiB
    constexpr int D4 = D / 4;
    __shared__ float4 ks[BK][D4];
    __shared__ float4 vs[BK][D4];

    const int tid = threadIdx.x;
    const int g = tid % G;
    const hs_i64 tiles = (sq + ROWS - 1) / ROWS;
    const hs_i64 bh = (hs_i64)blockIdx.x / tiles;
    const hs_i64 q0 = ((hs_i64)blockIdx.x % tiles) * ROWS;
    const hs_i64 row0 = q0 + tid / G;                // rows row0 + i * STRIDE
    const E* kb = k + bh * sk * hd;
    const E* vb = v + bh * sk * hd;

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
    hs_i64 kend = sk;
    if (causal && q0 + ROWS < kend) kend = q0 + ROWS;

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
            float s[HSA_R][HSA_CHUNK];
#pragma unroll
            for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                float4 kv[4];
#pragma unroll
                for (int t = 0; t < 4; ++t) kv[t] = ks[c0 + jj][t * G + g];
                const hs_i64 key = kt + c0 + jj;
#pragma unroll
                for (int i = 0; i < HSA_R; ++i) {
                    float p = hsa_dot4(qr[i][0], kv[0]) + hsa_dot4(qr[i][1], kv[1]) +
                              hsa_dot4(qr[i][2], kv[2]) + hsa_dot4(qr[i][3], kv[3]);
#pragma unroll
                    for (int msk = 1; msk < G; msk <<= 1) p += HS_SHFL_XOR(p, msk);
                    const bool vis = key < kend && (!causal || key <= row0 + i * STRIDE);
                    s[i][jj] = vis ? p : -HS_INF;
                }
            }
            float ms[HSA_R];
#pragma unroll
            for (int i = 0; i < HSA_R; ++i) {
                float mnew = m[i];
#pragma unroll
                for (int jj = 0; jj < HSA_CHUNK; ++jj) mnew = fmaxf(mnew, s[i][jj]);
                // Until a row has seen a key its max is -inf; a finite stand-in keeps exp2 at exactly 0
                // instead of NaN, without a branch that would split the lanes of a shuffle group.
                ms[i] = (mnew == -HS_INF) ? 0.0f : mnew;
                const float alpha = exp2f(m[i] - ms[i]);
                m[i] = mnew;
                l[i] *= alpha;
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    o[i][t].x *= alpha; o[i][t].y *= alpha; o[i][t].z *= alpha; o[i][t].w *= alpha;
                }
#pragma unroll
                for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                    s[i][jj] = exp2f(s[i][jj] - ms[i]);
                    l[i] += s[i][jj];
                }
            }
#pragma unroll
            for (int jj = 0; jj < HSA_CHUNK; ++jj) {
                float4 vv[4];
#pragma unroll
                for (int t = 0; t < 4; ++t) vv[t] = vs[c0 + jj][t * G + g];
                const hs_i64 key = kt + c0 + jj;
#pragma unroll
                for (int i = 0; i < HSA_R; ++i) {
                    // A key hidden from this row must not reach it at all: weight 0 times an inf or NaN
                    // value would still be NaN (the CPU engine skips hidden keys the same way).
                    if (!(key < kend && (!causal || key <= row0 + i * STRIDE))) continue;
                    const float p = s[i][jj];
#pragma unroll
                    for (int t = 0; t < 4; ++t) {
                        o[i][t].x += p * vv[t].x; o[i][t].y += p * vv[t].y;
                        o[i][t].z += p * vv[t].z; o[i][t].w += p * vv[t].w;
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
        hs_i64 sq, hs_i64 sk, int hd, float scale, int causal) {                                          \
        hsa_attention<D, E>(q, k, v, out, sq, sk, hd, scale, causal);                                     \
    }
#define HSA_ENTRY(D) HSA_ENTRY_T(, float, D) HSA_ENTRY_T(f16_, hs_half, D) HSA_ENTRY_T(bf16_, hs_bf16, D)

HSA_ENTRY(32)
HSA_ENTRY(64)
HSA_ENTRY(128)
HSA_ENTRY(256)
