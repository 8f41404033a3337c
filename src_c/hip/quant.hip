// GGUF block-quantized weights on the GPU: dequantize, matrix-vector and matrix-matrix products.
//
// Layouts (ggml, blocks of 32 along each row of a (n, k) matrix, rows of k/32 blocks, no padding):
//   Q8_0: fp16 d, then 32 int8 q             (34 bytes)  value = q * d
//   Q4_0: fp16 d, then 16 bytes of nibbles   (18 bytes)  element j = low nibble of byte j,
//                                                         element j+16 = high nibble; value = (q - 8) * d
// Blocks are 34/18 bytes, so a block (and its fp16 scale) is only 2-byte aligned: everything below
// reads 16-bit words and converts the scale by hand, which is exact and identical on both vendors.
// Products accumulate in fp32 against the activations as given, float32 or a half type widened on load
// (x is never re-quantized), and are rounded once to x's type.

#define HSQ_Q8_BYTES 34
#define HSQ_Q4_BYTES 18

// IEEE half -> float, exact for every input (subnormals, inf, NaN included).
HS_DEV float hsq_half(hs_u32 h) {
    const hs_u32 sign = (h & 0x8000u) << 16;
    const hs_u32 e = (h >> 10) & 0x1fu;
    const hs_u32 m = h & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float f = (float)m * 5.9604644775390625e-8f;  // m * 2^-24
        return sign ? -f : f;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

// Byte i (0..3) of w, which holds bytes already offset to unsigned (q + bias), as an exact float
// minus `bias`. Int->float conversion runs at a quarter rate on NVIDIA, so there the byte is placed in
// the mantissa of 2^23 (one PRMT) and the constant subtracted; AMD converts bytes at full rate.
#ifdef HS_NVIDIA
#define HSQ_BYTE_F(w, i, bias) (__uint_as_float(__byte_perm((w), 0x4B000000u, (i) | 0x7540)) - (8388608.0f + (bias)))
#else
#define HSQ_BYTE_F(w, i, bias) ((float)(((w) >> (8 * (i))) & 0xffu) - (bias))
#endif

// The 4 quants 4*part .. 4*part+3 (part 0..7) of a block as 4 bytes holding q + bias (bias 128 for
// Q8_0, 8 for Q4_0), read as two 16-bit words. Q4_0 parts 4..7 are the high nibbles of parts 0..3's bytes.
template <int Q8> HS_DEV hs_u32 hsq_quad(const hs_u16* blk, int part) {
    if (Q8) return ((hs_u32)blk[1 + 2 * part] | ((hs_u32)blk[2 + 2 * part] << 16)) ^ 0x80808080u;
    const int word = 1 + 2 * (part & 3);
    const hs_u32 w = (hs_u32)blk[word] | ((hs_u32)blk[word + 1] << 16);
    return (part < 4 ? w : (w >> 4)) & 0x0f0f0f0fu;
}

#define HSQ_BIAS(Q8) ((Q8) ? 128.0f : 8.0f)
#define HSQ_BS(Q8) ((Q8) ? HSQ_Q8_BYTES : HSQ_Q4_BYTES)

// ------------------------------------------------------------------ dequantize

// One thread per 4 outputs (a float4 store); 8 threads per block of 32.
template <int Q8> HS_DEV void hsq_dequantize(const hs_u16* __restrict__ src, float4* __restrict__ dst, hs_i64 nblocks) {
    const hs_i64 total = nblocks * 8;
    for (hs_i64 t = hs_gid(); t < total; t += hs_gstride()) {
        const hs_u16* blk = src + (t >> 3) * (HSQ_BS(Q8) / 2);
        const float d = hsq_half(blk[0]);
        const hs_u32 w = hsq_quad<Q8>(blk, (int)(t & 7));
        dst[t] = make_float4(HSQ_BYTE_F(w, 0, HSQ_BIAS(Q8)) * d, HSQ_BYTE_F(w, 1, HSQ_BIAS(Q8)) * d,
                             HSQ_BYTE_F(w, 2, HSQ_BIAS(Q8)) * d, HSQ_BYTE_F(w, 3, HSQ_BIAS(Q8)) * d);
    }
}

HS_KERNEL void hs_dequantize_q8_0(const hs_u16* __restrict__ src, float4* __restrict__ dst, hs_i64 nblocks) {
    hsq_dequantize<1>(src, dst, nblocks);
}

HS_KERNEL void hs_dequantize_q4_0(const hs_u16* __restrict__ src, float4* __restrict__ dst, hs_i64 nblocks) {
    hsq_dequantize<0>(src, dst, nblocks);
}

// ------------------------------------------------------------------ matrix-vector

// Y = W X, bandwidth bound, for X (k,) or (k, m) with m <= MC. Each warp owns HSQ_NR consecutive rows
// (every x load serves all of them). Lanes go 8 to a block, 4 quants each, so one load instruction of
// the warp reads contiguous memory: HS_WARP/8 consecutive blocks of W, or the X rows of those quants
// (a lane-per-block mapping would make every instruction touch the warp's whole strided footprint,
// and the L1 would be the bottleneck). MC == 1: x is a vector read four elements at a time (hs_ld4:
// 16 bytes of float, 8 of a half type, aligned to that); MC == 8: any 1 <= m <= 8 columns, Y (n, m)
// row-major, each quant's conversion reused by m columns.
// X and Y are of one element type T (float, hs_half, hs_bf16): x is widened on load, the sums are
// float32 whatever T, and each output is rounded once to T on the store (the CPU engine's rule), so a
// half product is the float32 kernel's result on the widened x, rounded.
#define HSQ_NR 2
// Launch sizes, declared so AMD compilers budget registers for them (not for 1024-thread blocks).
#define HSQ_MV_THREADS 128
#define HSQ_MM_THREADS 256

template <int Q8, int MC, class T>
HS_DEV void hsq_matvec(const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y,
                       hs_i64 n, hs_i64 k, int m) {
    constexpr int BPI = HS_WARP / 8;               // blocks per row per load step
    const int lane = threadIdx.x % HS_WARP;
    const int part = lane % 8;
    const hs_i64 row0 = ((hs_i64)blockIdx.x * (blockDim.x / HS_WARP) + threadIdx.x / HS_WARP) * HSQ_NR;
    if (row0 >= n) return;
    const hs_i64 nb = k / 32;
    const hs_i64 nrows = n - row0 < HSQ_NR ? n - row0 : HSQ_NR;
    const hs_u8* rows = w + row0 * nb * HSQ_BS(Q8);
    float acc[HSQ_NR][MC];
#pragma unroll
    for (int r = 0; r < HSQ_NR; ++r)
#pragma unroll
        for (int c = 0; c < MC; ++c) acc[r][c] = 0.0f;
    for (hs_i64 b = lane / 8; b < nb; b += BPI) {
        float xv[4][MC];                           // X rows 32b + 4part + i, columns c
        if (MC == 1) {
            const float4 t = hs_ld4(x, b * 8 + part);
            xv[0][0] = t.x; xv[1][0] = t.y; xv[2][0] = t.z; xv[3][0] = t.w;
        } else {
            const T* xr = x + (b * 32 + 4 * part) * m;
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int c = 0; c < MC; ++c) xv[i][c] = c < m ? hs_ld(xr[i * m + c]) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < HSQ_NR; ++r) {
            if (r < nrows) {
                const hs_u16* blk = reinterpret_cast<const hs_u16*>(rows + (r * nb + b) * HSQ_BS(Q8));
                const hs_u32 q = hsq_quad<Q8>(blk, part);
                const float d = hsq_half(blk[0]);
                const float f0 = HSQ_BYTE_F(q, 0, HSQ_BIAS(Q8)), f1 = HSQ_BYTE_F(q, 1, HSQ_BIAS(Q8));
                const float f2 = HSQ_BYTE_F(q, 2, HSQ_BIAS(Q8)), f3 = HSQ_BYTE_F(q, 3, HSQ_BIAS(Q8));
#pragma unroll
                for (int c = 0; c < MC; ++c)
                    acc[r][c] += (f0 * xv[0][c] + f1 * xv[1][c] + f2 * xv[2][c] + f3 * xv[3][c]) * d;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < HSQ_NR; ++r)
#pragma unroll
        for (int c = 0; c < MC; ++c) {
            const float s = hs_warp_reduce<HsSum>(acc[r][c]);
            if (lane == 0 && r < nrows && c < m) y[(row0 + r) * m + c] = hs_st<T>(s);
        }
}

// ------------------------------------------------------------------ matrix-matrix

// Y (n, m) = W (n, k) X (k, m) for m > 8, all row-major. A 64x64 output tile per block of 256 threads, k in steps
// of one quant block: the W tile is dequantized into shared memory once and reused by 64 columns, and
// the X tile is widened to float32 there, so the inner loop is the same whatever T.
// Thread (tr, tc) computes rows 4*tr..4*tr+3 and columns tc, tc+16, tc+32, tc+48 (strided so the
// shared X reads of a warp hit 16 consecutive banks). Launch: grid (ceil(n/64), ceil(m/64)), block 256.
#define HSQ_TM 64
#define HSQ_TN 64

template <int Q8, class T>
HS_DEV void hsq_matmat(const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y,
                       hs_i64 n, hs_i64 k, hs_i64 m) {
    __shared__ float ws[32][HSQ_TM + 1];
    __shared__ float xs[32][HSQ_TN];
    const int tid = threadIdx.x;
    const int tr = tid / 16, tc = tid % 16;
    const hs_i64 r0 = (hs_i64)blockIdx.x * HSQ_TM, c0 = (hs_i64)blockIdx.y * HSQ_TN;
    const hs_i64 nb = k / 32;
    const hs_i64 bs = HSQ_BS(Q8);
    // W loader: thread -> (row lr, eighth le of the block: elements 8*le .. 8*le+7)
    const int lr = tid / 4, le = tid % 4;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (hs_i64 b = 0; b < nb; ++b) {
        if (r0 + lr < n) {
            const hs_u16* blk = reinterpret_cast<const hs_u16*>(w + ((r0 + lr) * nb + b) * bs);
            const float d = hsq_half(blk[0]);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const hs_u32 v = hsq_quad<Q8>(blk, 2 * le + h);
                const float bias = HSQ_BIAS(Q8);
                ws[8 * le + 4 * h + 0][lr] = HSQ_BYTE_F(v, 0, bias) * d;
                ws[8 * le + 4 * h + 1][lr] = HSQ_BYTE_F(v, 1, bias) * d;
                ws[8 * le + 4 * h + 2][lr] = HSQ_BYTE_F(v, 2, bias) * d;
                ws[8 * le + 4 * h + 3][lr] = HSQ_BYTE_F(v, 3, bias) * d;
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) ws[8 * le + e][lr] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int idx = tid + 256 * e;           // 2048 = 32 x 64 values, coalesced along columns
            const int kk = idx / HSQ_TN, cc = idx % HSQ_TN;
            xs[kk][cc] = (c0 + cc < m) ? hs_ld(x[(b * 32 + kk) * m + c0 + cc]) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < 32; ++kk) {
            float a[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = ws[kk][4 * tr + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = xs[kk][tc + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const hs_i64 r = r0 + 4 * tr + i;
        if (r >= n) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const hs_i64 c = c0 + tc + 16 * j;
            if (c < m) y[r * m + c] = hs_st<T>(acc[i][j]);
        }
    }
}

// The products per element type S/T of x and y and per quant type (kernel names hs_<kind>_<S>_<qtype>):
// hs_qmatvec (a vector), hs_qmatvec8 (2..8 columns), hs_qmatmat (more).
#define HSQ_PRODUCTS(S, T)                                                                                     \
    HS_KERNEL void __launch_bounds__(HSQ_MV_THREADS) hs_qmatvec_##S##_q8_0(                                   \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k) {    \
        hsq_matvec<1, 1, T>(w, x, y, n, k, 1);                                                                 \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MV_THREADS) hs_qmatvec_##S##_q4_0(                                   \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k) {    \
        hsq_matvec<0, 1, T>(w, x, y, n, k, 1);                                                                 \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MV_THREADS) hs_qmatvec8_##S##_q8_0(                                  \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k,      \
            int m) {                                                                                           \
        hsq_matvec<1, 8, T>(w, x, y, n, k, m);                                                                 \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MV_THREADS) hs_qmatvec8_##S##_q4_0(                                  \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k,      \
            int m) {                                                                                           \
        hsq_matvec<0, 8, T>(w, x, y, n, k, m);                                                                 \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MM_THREADS) hs_qmatmat_##S##_q8_0(                                   \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k,      \
            hs_i64 m) {                                                                                        \
        hsq_matmat<1, T>(w, x, y, n, k, m);                                                                    \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MM_THREADS) hs_qmatmat_##S##_q4_0(                                   \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k,      \
            hs_i64 m) {                                                                                        \
        hsq_matmat<0, T>(w, x, y, n, k, m);                                                                    \
    }
HS_FOR_EACH_FLOAT(HSQ_PRODUCTS)
