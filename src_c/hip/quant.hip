// GGUF block-quantized weights on the GPU: dequantize, matrix-vector and matrix-matrix products.
//
// Host format (ggml, what QuantizedTensor holds): blocks of 32 along each row of a (n, k) matrix,
//   Q8_0: fp16 d, then 32 int8 q             (34 bytes)  value = q * d
//   Q4_0: fp16 d, then 16 bytes of nibbles   (18 bytes)  element j = low nibble of byte j,
//                                                         element j+16 = high nibble; value = (q - 8) * d
// Those blocks are only 2-byte aligned, so a kernel reading them is stuck with 16-bit loads. The weights
// live on the device in our own layout instead, repacked once on upload (hipsched/gpu/glue/quant.py,
// `device_layout`, which also documents the inverse): each row is a run of SUPERBLOCKS, 16 Q8_0 blocks
// (512 weights) or 32 Q4_0 blocks (1024 weights), the last one padded with zero weights of scale 0.
// A superblock is 512 bytes of quants, 16 bytes for each of 32 lanes, then the blocks' fp16 scales:
//   544 bytes (Q8_0) = 16 x 34, 576 bytes (Q4_0) = 32 x 18, the same bytes as the gguf blocks, 16-aligned.
// Lane l (0..31) of a superblock holds the weights of GROUPS g of 4: weights 128 g + 4 l + c, c = 0..3:
//   Q8_0: its 16 bytes are groups g = 0..3, a 32-bit word each, the bytes q + 128 (biased unsigned);
//   Q4_0: its 16 bytes are groups g = 0..7, word w holding group 2w in its low nibbles and 2w+1 in the
//         high ones, the nibbles as gguf stores them (q, value (q - 8) d).
// So one 128-bit load gives a lane 16 or 32 weights, and for each group the 32 lanes read 128
// consecutive elements of x (one coalesced 16-byte load each: 4 L1 wavefronts where the natural order,
// a lane's 16 consecutive weights, makes every x load touch 16 cache lines). Group g of lane l lies in
// block 4 g + l / 8, so a lane needs NG scales per superblock (4 for Q8_0, 8 for Q4_0): the scales are
// stored so that a lane's are adjacent, position (l / 8) NG + g holding block 4 g + l / 8's, one 8-byte
// (Q8_0) or 16-byte (Q4_0) load, the same for 8 lanes.
// Products accumulate in fp32 against the activations as given, float32 or a half type widened on load
// (x is never re-quantized), and are rounded once to x's type.

// The layout's numbers, HSQ_SBQ (quant bytes of a superblock), HSQ_SBK(Q8) (its weights along k),
// HSQ_SBB(Q8) (its bytes), HSQ_NG(Q8) (groups of 4 weights a lane holds) and HSQ_BIAS(Q8) (what the stored
// bytes / nibbles are offset by), are hipsched/gpu/compilation/kernel_constants.py's, as are the products'
// geometry below (HSQ_NR, HSQ_NRN, HSQ_MC, HSQ_TM, HSQ_TN and the launch sizes HSQ_*_THREADS).

// Byte i (0..3) of w, which holds bytes already offset to unsigned (q + bias), as an exact float
// minus `bias`. Int->float conversion runs at a quarter rate on NVIDIA, so there the byte is placed in
// the mantissa of 2^23 (one PRMT) and the constant subtracted; AMD converts bytes at full rate.
#ifdef HS_NVIDIA
#define HSQ_BYTE_F(w, i, bias) (__uint_as_float(__byte_perm((w), 0x4B000000u, (i) | 0x7540)) - (8388608.0f + (bias)))
#else
#define HSQ_BYTE_F(w, i, bias) ((float)(((w) >> (8 * (i))) & 0xffu) - (bias))
#endif

// A lane's share of one superblock of one row: 16 bytes of quants, NG fp16 scales. Loaded through float4
// (a 128-bit load that every compiler, NVRTC, hiprtc and the emulator's g++, has as a built-in type; only
// the bits are used, moved, never computed on) and a 64-bit integer for Q8_0's 4 scales.
template <int Q8> struct HsqChunk {
    hs_u32 q[4];
    hs_u32 s[HSQ_NG(Q8) / 2];
};

template <int Q8> HS_DEV void hsq_load(HsqChunk<Q8>& c, const hs_u8* __restrict__ sb, int l) {
    const float4 q = *reinterpret_cast<const float4*>(sb + 16 * l);
    c.q[0] = __float_as_uint(q.x); c.q[1] = __float_as_uint(q.y);
    c.q[2] = __float_as_uint(q.z); c.q[3] = __float_as_uint(q.w);
#if defined(__AMDGCN__)
    // all four words live here: otherwise LLVM's AMDGPU backend sinks the first one into the branch that
    // stores its group (dequantize) and splits the 16-byte load into 4 + 12 bytes
    asm volatile("" : "+v"(c.q[0]), "+v"(c.q[1]), "+v"(c.q[2]), "+v"(c.q[3]));
#endif
    const hs_u8* sp = sb + HSQ_SBQ + (l / 8) * (2 * HSQ_NG(Q8));
    if (Q8) {
        const hs_u64 s = *reinterpret_cast<const hs_u64*>(sp);
        c.s[0] = (hs_u32)s; c.s[1] = (hs_u32)(s >> 32);
    } else {
        const float4 s = *reinterpret_cast<const float4*>(sp);
        // indices written so that the Q8_0 instantiation of this (dead there) branch stays in bounds
        c.s[0] = __float_as_uint(s.x); c.s[1] = __float_as_uint(s.y);
        c.s[(HSQ_NG(Q8) / 2 - 1) & 2] = __float_as_uint(s.z); c.s[HSQ_NG(Q8) / 2 - 1] = __float_as_uint(s.w);
    }
}

template <int Q8> HS_DEV void hsq_zero(HsqChunk<Q8>& c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) c.q[i] = 0;
#pragma unroll
    for (int i = 0; i < HSQ_NG(Q8) / 2; ++i) c.s[i] = 0;
}

// Group g's scale (fp16 -> float is exact, hardware conversion on either vendor).
template <int Q8> HS_DEV float hsq_scale(const HsqChunk<Q8>& c, int g) {
    return hs_half_to_float((hs_u16)(c.s[g / 2] >> (16 * (g % 2))));
}

// Group g's 4 quants as 4 bytes holding q + bias.
template <int Q8> HS_DEV hs_u32 hsq_group(const HsqChunk<Q8>& c, int g) {
    if (Q8) return c.q[g];
    return ((g % 2) ? (c.q[g / 2] >> 4) : c.q[g / 2]) & 0x0f0f0f0fu;
}

// Sum over 32 lanes (a warp on NVIDIA, half a wavefront on AMD: xor offsets below 32 stay in the half).
HS_DEV float hsq_sum32(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += HS_SHFL_XOR(v, o);
    return v;
}

// ------------------------------------------------------------------ dequantize

// One thread per lane chunk (16 or 32 weights): a 128-bit load, and one float4 store per group, the 32
// lanes of a chunk storing 512 contiguous bytes per group. Exact: q * d is representable in fp32.
template <int Q8> HS_DEV void hsq_dequantize(const hs_u8* __restrict__ w, float4* __restrict__ dst,
                                             hs_i64 n, hs_i64 k) {
    const hs_i64 nsb = (k + HSQ_SBK(Q8) - 1) / HSQ_SBK(Q8);
    const hs_i64 total = n * nsb * 32;
    for (hs_i64 t = hs_gid(); t < total; t += hs_gstride()) {
        const int l = (int)(t % 32);
        const hs_i64 sbi = t / 32;          // superblock index over all rows: row * nsb + s
        const hs_i64 row = sbi / nsb, s = sbi - row * nsb;
        HsqChunk<Q8> c;
        hsq_load<Q8>(c, w + sbi * HSQ_SBB(Q8), l);
#pragma unroll
        for (int g = 0; g < HSQ_NG(Q8); ++g) {
            const hs_i64 kk = s * HSQ_SBK(Q8) + 128 * g + 4 * l;
            if (kk < k) {
                const hs_u32 q = hsq_group<Q8>(c, g);
                const float d = hsq_scale<Q8>(c, g);
                dst[(row * k + kk) / 4] = make_float4(HSQ_BYTE_F(q, 0, HSQ_BIAS(Q8)) * d, HSQ_BYTE_F(q, 1, HSQ_BIAS(Q8)) * d,
                                                      HSQ_BYTE_F(q, 2, HSQ_BIAS(Q8)) * d, HSQ_BYTE_F(q, 3, HSQ_BIAS(Q8)) * d);
            }
        }
    }
}

HS_KERNEL void hs_dequantize_q8_0(const hs_u8* __restrict__ w, float4* __restrict__ dst, hs_i64 n, hs_i64 k) {
    hsq_dequantize<1>(w, dst, n, k);
}

HS_KERNEL void hs_dequantize_q4_0(const hs_u8* __restrict__ w, float4* __restrict__ dst, hs_i64 n, hs_i64 k) {
    hsq_dequantize<0>(w, dst, n, k);
}

// ------------------------------------------------------------------ matrix-vector

// Y = W x for a vector x, bandwidth bound. A TEAM is 32 lanes (a warp on NVIDIA, half a wavefront on
// AMD: the geometry is the same on both) and owns HSQ_NR consecutive rows; it walks their superblocks,
// each lane reading its 16 bytes of each row and the x groups they multiply (every x load serves the
// NR rows). x is read 4 elements at a time (hs_ld4: 16 bytes of float, 8 of a half type, aligned).
//
// Bytes in flight: HBM3 on an H100 (3.35 TB/s, ~600-800 ns under load) needs ~2.3 MB in flight, about
// 18 KB per SM, and more to absorb the latency's spread (~40 KB per SM is the usual target). A team
// issues the weight loads of HSQ_U superblocks of its NR rows before using any: NR x U x 16 = 64 bytes
// per lane; over the grid that is n x 512 x U bytes (NR cancels: more rows per team, fewer teams), 8 MB
// for n = 8192 and 14 MB for n = 14336, i.e. 64 KB per SM when every team is resident (4096 teams of
// 32 lanes at ~70 registers: 28 warps of an SM's 64, so the 8192-row case is one wave). NR = 2 keeps
// the L1 traffic of x (4 bytes a weight for float32, shared by NR rows) at 2 bytes per weight, with the
// coalesced groups ~26 L1 wavefronts per 1024 weights (Q8_0), 42 per 2048 (Q4_0): 39 / 49 weights per
// clock per SM where HBM needs 14 / 26, so L1 is not the bound; the conversions (PRMT + FADD + FMA per
// weight, a 32-bit add per 4 for the scale) are far below the FP32 and integer rates. U = 2 rather
// than more: each further superblock costs ~24 (Q8_0) / 32 (Q4_0) registers.
#define HSQ_U 2

template <int Q8, class T>
HS_DEV void hsq_matvec(const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k) {
    const int l = threadIdx.x % 32;
    const hs_i64 row0 = ((hs_i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * HSQ_NR;
    // a team past n does not return: on AMD it is half a wavefront, whose other half still shuffles
    const hs_i64 nsb = row0 < n ? (k + HSQ_SBK(Q8) - 1) / HSQ_SBK(Q8) : 0;
    const hs_i64 rowb = (k + HSQ_SBK(Q8) - 1) / HSQ_SBK(Q8) * HSQ_SBB(Q8);
    const int nrows = row0 >= n ? 0 : (n - row0 < HSQ_NR ? (int)(n - row0) : HSQ_NR);
    const hs_u8* rows = w + (nrows ? row0 : 0) * rowb;
    float acc[HSQ_NR];
#pragma unroll
    for (int r = 0; r < HSQ_NR; ++r) acc[r] = 0.0f;
    for (hs_i64 s0 = 0; s0 < nsb; s0 += HSQ_U) {
        HsqChunk<Q8> c[HSQ_U][HSQ_NR];
#pragma unroll
        for (int u = 0; u < HSQ_U; ++u)
#pragma unroll
            for (int r = 0; r < HSQ_NR; ++r) {
                if (s0 + u < nsb && r < nrows) hsq_load<Q8>(c[u][r], rows + r * rowb + (s0 + u) * HSQ_SBB(Q8), l);
                else hsq_zero<Q8>(c[u][r]);
            }
#pragma unroll
        for (int u = 0; u < HSQ_U; ++u) {
#pragma unroll
            for (int g = 0; g < HSQ_NG(Q8); ++g) {
                const hs_i64 kk = (s0 + u) * HSQ_SBK(Q8) + 128 * g + 4 * l;
                if (kk >= k) continue;   // past the row's end (a padded group, or a superblock past nsb)
                const float4 xv = hs_ld4(x, kk / 4);
#pragma unroll
                for (int r = 0; r < HSQ_NR; ++r) {
                    const hs_u32 q = hsq_group<Q8>(c[u][r], g);
                    const float t = HSQ_BYTE_F(q, 0, HSQ_BIAS(Q8)) * xv.x + HSQ_BYTE_F(q, 1, HSQ_BIAS(Q8)) * xv.y +
                                    HSQ_BYTE_F(q, 2, HSQ_BIAS(Q8)) * xv.z + HSQ_BYTE_F(q, 3, HSQ_BIAS(Q8)) * xv.w;
                    acc[r] += t * hsq_scale<Q8>(c[u][r], g);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < HSQ_NR; ++r) {
        const float s = hsq_sum32(acc[r]);
        if (l == 0 && r < nrows) y[row0 + r] = hs_st<T>(s);
    }
}

// Y (n, m) = W X (k, m), m columns of x at a time up to HSQ_MC (grid y: column chunks of HSQ_MC), each
// dequantized weight reused for every column in registers. A block of 4 teams, HSQ_NRN rows each, walks
// the superblocks together: per 512 weights of a superblock (4 groups of every lane: all of Q8_0's, half
// of Q4_0's) it stages the x tile (512 k's x MC columns, widened to float32) in shared memory, transposed
// so that a lane reads a group of 4 k's of one column as one conflict-free 16-byte LDS (row stride 516
// floats: the staging stores hit 32 distinct banks). The weight loads of the superblock are issued
// before the staging, so they are in flight while it runs. Bandwidth bound up to about 16 columns (9 to
// 16 take two passes over W); more go to hsq_matmat.
// NVIDIA: at least 4 blocks an SM (at most 128 registers), which ptxas otherwise undercuts with a spill
// (80 registers and 16 bytes of local memory for Q4_0); AMD's second argument means waves per EU and
// would cap the VGPRs at 128 for 4 (51 spilled on gfx90a): 1 there
#ifdef HS_NVIDIA
#define HSQ_MN_MIN 4
#else
#define HSQ_MN_MIN 1
#endif
#define HSQ_XT 512                           // k's of an x tile: 4 groups of 32 lanes
#define HSQ_XS (HSQ_XT + 4)                  // its row stride in shared memory

// One x tile's pass: groups 4 H .. 4 H + 3 of the chunks (H a template argument, so every index into
// a chunk is a constant: a loop over H left to the compiler put the chunks in local memory).
template <int Q8, int H, class T>
HS_DEV void hsq_matvecn_pass(const HsqChunk<Q8> (&ch)[HSQ_NRN(Q8)], float (&acc)[HSQ_NRN(Q8)][HSQ_MC],
                             float* xs, const T* __restrict__ x, hs_i64 s, hs_i64 k, int m, int c0, int mc) {
    const int tid = threadIdx.x, l = tid % 32;
    // x tile: element (kk, c); consecutive threads take consecutive columns, then k
    const hs_i64 kbase = s * HSQ_SBK(Q8) + H * HSQ_XT;
    for (int t = tid; t < HSQ_XT * HSQ_MC; t += HSQ_MN_THREADS) {
        const int kk = t / HSQ_MC, c = t % HSQ_MC;
        xs[c * HSQ_XS + kk] = (c < mc && kbase + kk < k) ? hs_ld(x[(kbase + kk) * m + c0 + c]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int gl = 0; gl < 4; ++gl) {
        const int g = (4 * H + gl) % HSQ_NG(Q8), kk = 128 * gl + 4 * l;
        float f[HSQ_NRN(Q8)][4], d[HSQ_NRN(Q8)];
#pragma unroll
        for (int r = 0; r < HSQ_NRN(Q8); ++r) {
            const hs_u32 q = hsq_group<Q8>(ch[r], g);
            f[r][0] = HSQ_BYTE_F(q, 0, HSQ_BIAS(Q8)); f[r][1] = HSQ_BYTE_F(q, 1, HSQ_BIAS(Q8));
            f[r][2] = HSQ_BYTE_F(q, 2, HSQ_BIAS(Q8)); f[r][3] = HSQ_BYTE_F(q, 3, HSQ_BIAS(Q8));
            d[r] = hsq_scale<Q8>(ch[r], g);
        }
#pragma unroll
        for (int c = 0; c < HSQ_MC; ++c) {
            const float4 xv = *reinterpret_cast<const float4*>(&xs[c * HSQ_XS + kk]);
#pragma unroll
            for (int r = 0; r < HSQ_NRN(Q8); ++r)
                acc[r][c] += (f[r][0] * xv.x + f[r][1] * xv.y + f[r][2] * xv.z + f[r][3] * xv.w) * d[r];
        }
    }
    __syncthreads();
}

template <int Q8, class T>
HS_DEV void hsq_matvecn(const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y,
                        hs_i64 n, hs_i64 k, int m) {
    __shared__ float xs[HSQ_MC * HSQ_XS];
    const int tid = threadIdx.x, l = tid % 32;
    const hs_i64 row0 = ((hs_i64)blockIdx.x * (HSQ_MN_THREADS / 32) + tid / 32) * HSQ_NRN(Q8);
    const int c0 = blockIdx.y * HSQ_MC;
    const int mc = m - c0 < HSQ_MC ? m - c0 : HSQ_MC;
    const hs_i64 nsb = (k + HSQ_SBK(Q8) - 1) / HSQ_SBK(Q8);
    const hs_i64 rowb = nsb * HSQ_SBB(Q8);
    // no early return: every team takes part in the block's barriers; a team past n loads nothing
    const int nrows = row0 >= n ? 0 : (n - row0 < HSQ_NRN(Q8) ? (int)(n - row0) : HSQ_NRN(Q8));
    const hs_u8* rows = w + (nrows ? row0 : 0) * rowb;
    float acc[HSQ_NRN(Q8)][HSQ_MC];
#pragma unroll
    for (int r = 0; r < HSQ_NRN(Q8); ++r)
#pragma unroll
        for (int c = 0; c < HSQ_MC; ++c) acc[r][c] = 0.0f;
    for (hs_i64 s = 0; s < nsb; ++s) {
        HsqChunk<Q8> ch[HSQ_NRN(Q8)];
#pragma unroll
        for (int r = 0; r < HSQ_NRN(Q8); ++r) {
            if (r < nrows) hsq_load<Q8>(ch[r], rows + r * rowb + s * HSQ_SBB(Q8), l);
            else hsq_zero<Q8>(ch[r]);
        }
        hsq_matvecn_pass<Q8, 0>(ch, acc, xs, x, s, k, m, c0, mc);
        if (HSQ_NG(Q8) > 4) hsq_matvecn_pass<Q8, 1>(ch, acc, xs, x, s, k, m, c0, mc);
    }
#pragma unroll
    for (int r = 0; r < HSQ_NRN(Q8); ++r)
#pragma unroll
        for (int c = 0; c < HSQ_MC; ++c) {
            const float v = hsq_sum32(acc[r][c]);
            if (l == 0 && r < nrows && c < mc) y[(row0 + r) * m + c0 + c] = hs_st<T>(v);
        }
}

// ------------------------------------------------------------------ matrix-matrix

// Y (n, m) = W (n, k) X (k, m) for m > 16, all row-major. A 64x64 output tile per block of 256 threads, k in
// steps of 32: the W tile is dequantized into shared memory
// once and reused by 64 columns, and the X tile is widened to float32 there, so the inner loop is the
// same whatever T. Thread (tr, tc) computes rows 4*tr..4*tr+3 and columns tc, tc+16, tc+32, tc+48
// (strided so the shared X reads of a warp hit 16 consecutive banks). Launch: grid (ceil(n/64),
// ceil(m/64)), block 256. A float32 x always takes this kernel, a half x on targets without matrix cores
// (a half x with them: hsq_matmat_mma below).

// The 8 weights kk .. kk+7 (kk a multiple of 8, < k) of a row of the repacked layout: they lie in one
// group of two adjacent lanes (4 each) of one block, so two aligned 32-bit loads and one scale; stored
// dequantized to out[0], out[stride], ... (a column of the shared W tile).
template <int Q8> HS_DEV void hsq_weights8(const hs_u8* __restrict__ row, hs_i64 kk, float* out, int stride) {
    const hs_i64 s = kk / HSQ_SBK(Q8);
    const int r = (int)(kk - s * HSQ_SBK(Q8));
    const int g = r / 128, l = (r % 128) / 4;
    const hs_u8* sb = row + s * HSQ_SBB(Q8);
    const int word = Q8 ? g : g / 2, shift = Q8 ? 0 : 4 * (g % 2);
    const hs_u32 mask = Q8 ? 0xffffffffu : 0x0f0f0f0fu;
    const hs_u32 w0 = (*reinterpret_cast<const hs_u32*>(sb + 16 * l + 4 * word) >> shift) & mask;
    const hs_u32 w1 = (*reinterpret_cast<const hs_u32*>(sb + 16 * (l + 1) + 4 * word) >> shift) & mask;
    const float d = hs_half_to_float(*reinterpret_cast<const hs_u16*>(sb + HSQ_SBQ + 2 * ((l / 8) * HSQ_NG(Q8) + g)));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        out[e * stride] = HSQ_BYTE_F(w0, e, HSQ_BIAS(Q8)) * d;
        out[(e + 4) * stride] = HSQ_BYTE_F(w1, e, HSQ_BIAS(Q8)) * d;
    }
}

template <int Q8, class T>
HS_DEV void hsq_matmat(const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y,
                       hs_i64 n, hs_i64 k, hs_i64 m) {
    __shared__ float ws[32][HSQ_TM + 1];
    __shared__ float xs[32][HSQ_TN];
    const int tid = threadIdx.x;
    const int tr = tid / 16, tc = tid % 16;
    const hs_i64 r0 = (hs_i64)blockIdx.x * HSQ_TM, c0 = (hs_i64)blockIdx.y * HSQ_TN;
    const hs_i64 rowb = (k + HSQ_SBK(Q8) - 1) / HSQ_SBK(Q8) * HSQ_SBB(Q8);
    // W loader: thread -> (row lr, eighth le of the 32 k's: kk = 8*le .. 8*le+7)
    const int lr = tid / 4, le = tid % 4;
    // X loader: thread -> column xc, rows xk, xk + 4, ..., xk + 28 of the 32 k's (256 threads = 4 rows of 64)
    static_assert(HSQ_MM_THREADS == 4 * HSQ_TN, "the X loader covers 4 rows of the tile per pass");
    const int xc = tid % HSQ_TN, xk = tid / HSQ_TN;
    const bool xin = c0 + xc < m;
    const hs_i64 m4 = 4 * m;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (hs_i64 kb = 0; kb < k; kb += 32) {
        if (r0 + lr < n) {
            hsq_weights8<Q8>(w + (r0 + lr) * rowb, kb + 8 * le, &ws[8 * le][lr], HSQ_TM + 1);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) ws[8 * le + e][lr] = 0.0f;
        }
        // 2048 = 32 x 64 values, coalesced along columns: thread tid loads column xc of rows xk + 4e. One
        // pointer stepped by 4 rows (not 8 addresses of 64-bit arithmetic each): with a half x those
        // addresses pushed sm_90's register allocation at 80 registers into a stack slot (issue 34)
        const T* xp = x + (kb + xk) * m + c0 + xc;
#pragma unroll
        for (int e = 0; e < 8; ++e, xp += m4) xs[xk + 4 * e][xc] = xin ? hs_ld(*xp) : 0.0f;
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

// ------------------------------------------------------------------ matrix-matrix on matrix cores

// Y = W X for m > 16 and a half x (float16, bfloat16) on targets with matrix cores (prelude.h's HS_MM16:
// mma.sync m16n8k16 on NVIDIA sm_80+, MFMA 16x16x16 on CDNA), one body for both through prelude.h's
// 16 x 16 tile product. Exact to float32 accumulation, as the SIMT kernels: a weight's quant (an int8
// for Q8_0, nibble - 8 for Q4_0) is an integer of at most 8 bits, exact in float16 and in bfloat16, and x
// is already half, so the matrix core multiplies the quants, not q * d (which would round to 16 bits),
// by x exactly and sums the 32 products of one quant block in float32; that block sum is then scaled by
// the block's d in float32 and added to the row's float32 total. A float32 x is never sent here: the
// matrix cores would round it to 16 bits (or TF32).
//
// A block of 4 warps (waves) owns a 64 x 64 output tile, each warp a 32 x 32 quarter (2 x 2 tiles of
// 16 x 16), and walks k in steps of 64 (two quant blocks): the W tile's quants, converted to T, and the
// X tile, transposed so that k is contiguous for both operands, go through shared memory (rows padded by
// 16 bytes: ldmatrix's 8 rows of 16 bytes fall in distinct bank groups), with the two blocks' scales of
// the 64 rows. The 64 k's of a step lie in one group of 16 lanes of one superblock (lanes 0-15 or 16-31
// of group g): one 32-bit word of 4 quants per lane and row. A step past k reads the last superblock's
// padding (quants 0, scale 0) and zeros of x. Launch: grid (ceil(n/64), ceil(m/64)), block 4 warps.
#if defined(HS_MM16)
#define HSQ_KT 64             // k's of a step: two quant blocks
#define HSQ_LDT (HSQ_KT + 8)  // row stride of the shared tiles, in elements

template <int Q8, class T>
HS_DEV void hsq_matmat_mma(const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y,
                           hs_i64 n, hs_i64 k, hs_i64 m) {
    alignas(16) __shared__ hs_u16 ws[HSQ_TM][HSQ_LDT];   // quants of 64 rows as T
    alignas(16) __shared__ hs_u16 xs[HSQ_TN][HSQ_LDT];   // x transposed: 64 columns, k contiguous
    __shared__ float ds[2][HSQ_TM];                       // the step's two block scales per row
    const int tid = threadIdx.x, warp = tid / HS_WARP;
    const int wr = 32 * (warp / 2), wc = 32 * (warp % 2);
    const hs_i64 r0 = (hs_i64)blockIdx.x * HSQ_TM, c0 = (hs_i64)blockIdx.y * HSQ_TN;
    const hs_i64 rowb = (k + HSQ_SBK(Q8) - 1) / HSQ_SBK(Q8) * HSQ_SBB(Q8);
    const hs_u16* xb = reinterpret_cast<const hs_u16*>(x);
    float acc[2][2][HS_MM16_ACC];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < HS_MM16_ACC; ++e) acc[i][j][e] = 0.0f;

    for (hs_i64 kb = 0; kb < k; kb += HSQ_KT) {
        const hs_i64 s = kb / HSQ_SBK(Q8);
        const int off = (int)(kb - s * HSQ_SBK(Q8)), g = off / 128, l0 = (off % 128) / 4;
        // W: row, lane l0 + j of the group: weights kb + 4 j .. + 3
        for (int i = tid; i < HSQ_TM * 16; i += HSQ_MMA_THREADS) {
            const int row = i / 16, j = i % 16;
            hs_u64 v = 0;
            if (r0 + row < n) {
                const hs_u8* sb = w + (r0 + row) * rowb + s * HSQ_SBB(Q8);
                const hs_u32 word = *reinterpret_cast<const hs_u32*>(sb + 16 * (l0 + j) + 4 * (Q8 ? g : g / 2));
                const hs_u32 q = Q8 ? word : (word >> (4 * (g % 2))) & 0x0f0f0f0fu;
                v = (hs_u64)hs_pack2<T>(HSQ_BYTE_F(q, 0, HSQ_BIAS(Q8)), HSQ_BYTE_F(q, 1, HSQ_BIAS(Q8))) |
                    ((hs_u64)hs_pack2<T>(HSQ_BYTE_F(q, 2, HSQ_BIAS(Q8)), HSQ_BYTE_F(q, 3, HSQ_BIAS(Q8))) << 32);
            }
            *reinterpret_cast<hs_u64*>(&ws[row][4 * j]) = v;
        }
        // lanes l0 .. l0 + 7 and l0 + 8 .. l0 + 15 of group g: blocks 4 g + l0 / 8 and the next
        for (int i = tid; i < 2 * HSQ_TM; i += HSQ_MMA_THREADS) {
            const int row = i % HSQ_TM, b = i / HSQ_TM;
            float d = 0.0f;
            if (r0 + row < n) {
                const hs_u8* sb = w + (r0 + row) * rowb + s * HSQ_SBB(Q8);
                d = hs_half_to_float(*reinterpret_cast<const hs_u16*>(sb + HSQ_SBQ + 2 * ((l0 / 8 + b) * HSQ_NG(Q8) + g)));
            }
            ds[b][row] = d;
        }
        // X: 4 k's of one column per item, consecutive items consecutive columns (coalesced reads)
        for (int i = tid; i < HSQ_TN * (HSQ_KT / 4); i += HSQ_MMA_THREADS) {
            const int c = i % HSQ_TN, kq = i / HSQ_TN;
            hs_u64 v = 0;
            if (c0 + c < m) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const hs_i64 kk = kb + 4 * kq + e;
                    if (kk < k) v |= (hs_u64)xb[kk * m + c0 + c] << (16 * e);
                }
            }
            *reinterpret_cast<hs_u64*>(&xs[c][4 * kq]) = v;
        }
        __syncthreads();
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            // one quant block: its 32 exact products summed in float32 by the matrix core, then scaled
            float p[2][2][HS_MM16_ACC];
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < HS_MM16_ACC; ++e) p[i][j][e] = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int kk = 32 * b + 16 * h;
                hs_u32 a[2][HS_MM16_REGS], bx[2][HS_MM16_REGS];
#pragma unroll
                for (int i = 0; i < 2; ++i) hs_mm16_frag(a[i], &ws[wr + 16 * i][kk], HSQ_LDT);
#pragma unroll
                for (int j = 0; j < 2; ++j) hs_mm16_frag(bx[j], &xs[wc + 16 * j][kk], HSQ_LDT);
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 2; ++j) hs_mm16<T>(p[i][j], a[i], bx[j]);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int e = 0; e < HS_MM16_ACC; ++e) {
                    const float d = ds[b][wr + 16 * i + hs_mm16_row(e)];
#pragma unroll
                    for (int j = 0; j < 2; ++j) acc[i][j][e] += p[i][j][e] * d;
                }
        }
        __syncthreads();   // the next step's staging overwrites the tiles
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < HS_MM16_ACC; ++e) {
                const hs_i64 r = r0 + wr + 16 * i + hs_mm16_row(e), c = c0 + wc + 16 * j + hs_mm16_col(e);
                if (r < n && c < m) y[r * m + c] = hs_st<T>(acc[i][j][e]);
            }
}

// hs_qmatmat_<P>_mma_<qtype>: the half types only (a float32 x stays on hs_qmatmat_f32_*)
#define HSQ_MMA_ENTRY(P, T, Q, Q8)                                                                             \
    HS_KERNEL void __launch_bounds__(HSQ_MMA_THREADS) hs_qmatmat_##P##_mma_##Q(                               \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k,      \
            hs_i64 m) {                                                                                        \
        hsq_matmat_mma<Q8, T>(w, x, y, n, k, m);                                                               \
    }
HSQ_MMA_ENTRY(f16, hs_half, q8_0, 1)
HSQ_MMA_ENTRY(f16, hs_half, q4_0, 0)
HSQ_MMA_ENTRY(bf16, hs_bf16, q8_0, 1)
HSQ_MMA_ENTRY(bf16, hs_bf16, q4_0, 0)
#endif  // HS_MM16

// The products per element type S/T of x and y and per quant type (kernel names hs_<kind>_<S>_<qtype>):
// hs_qmatvec (a vector), hs_qmatvecn (2..16 columns, HSQ_MC per block column), hs_qmatmat (more).
#define HSQ_PRODUCTS(S, T)                                                                                     \
    HS_KERNEL void __launch_bounds__(HSQ_MV_THREADS) hs_qmatvec_##S##_q8_0(                                   \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k) {    \
        hsq_matvec<1, T>(w, x, y, n, k);                                                                       \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MV_THREADS) hs_qmatvec_##S##_q4_0(                                   \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k) {    \
        hsq_matvec<0, T>(w, x, y, n, k);                                                                       \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MN_THREADS, HSQ_MN_MIN) hs_qmatvecn_##S##_q8_0(                                  \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k,      \
            int m) {                                                                                           \
        hsq_matvecn<1, T>(w, x, y, n, k, m);                                                                   \
    }                                                                                                          \
    HS_KERNEL void __launch_bounds__(HSQ_MN_THREADS, HSQ_MN_MIN) hs_qmatvecn_##S##_q4_0(                                \
            const hs_u8* __restrict__ w, const T* __restrict__ x, T* __restrict__ y, hs_i64 n, hs_i64 k,      \
            int m) {                                                                                           \
        hsq_matvecn<0, T>(w, x, y, n, k, m);                                                                   \
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
