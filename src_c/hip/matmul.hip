// Our own tiled SGEMM, used when no vendor BLAS (hipBLAS/rocBLAS/cuBLAS) can be loaded.
// Row-major C (M, N) = A (M, K) @ B (K, N), batched over blockIdx.z with element strides (a stride of 0
// broadcasts that operand). 64x64 tile per block of 256 threads, 4x4 outputs per thread, K in steps of 16
// through shared memory; A's tile is stored transposed so the inner loop reads both tiles row-wise.
// float32, float16 and bfloat16 (suffix f32/f16/bf16; A, B and C of one type): tiles are widened to
// float in shared memory, products accumulate in float32, and C is rounded once to the element type.

// HS_MM_TILE and HS_MM_THREADS: hipsched/gpu/compilation/kernel_constants.py.
#define HS_MM_BK 16

template <class T>
HS_DEV void hs_matmul_body(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K,
                           hs_i64 stride_a, hs_i64 stride_b, hs_i64 stride_c, float (*As)[HS_MM_TILE + 4],
                           float (*Bs)[HS_MM_TILE + 4]) {
    A += blockIdx.z * stride_a;
    B += blockIdx.z * stride_b;
    C += blockIdx.z * stride_c;
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;          // thread's 4x4 patch: rows ty*4.., cols tx*4..
    const int row0 = blockIdx.y * HS_MM_TILE, col0 = blockIdx.x * HS_MM_TILE;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += HS_MM_BK) {
        // 64x16 of A and 16x64 of B: 1024 floats each, 4 per thread; zeros outside the matrices
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int e = tid + l * 256;
            const int ar = e / HS_MM_BK, ak = e % HS_MM_BK;       // A: consecutive threads walk k
            const int gr = row0 + ar, gk = k0 + ak;
            As[ak][ar] = (gr < M && gk < K) ? hs_ld(A[(hs_i64)gr * K + gk]) : 0.0f;
            const int bk = e / HS_MM_TILE, bc = e % HS_MM_TILE;   // B: consecutive threads walk columns
            const int hk = k0 + bk, gc = col0 + bc;
            Bs[bk][bc] = (hk < K && gc < N) ? hs_ld(B[(hs_i64)hk * N + gc]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < HS_MM_BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + ty * 4 + i;
        if (r >= M) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = col0 + tx * 4 + j;
            if (c < N) C[(hs_i64)r * N + c] = hs_st<T>(acc[i][j]);
        }
    }
}

#define HS_MATMUL(S, T)                                                                                       \
    HS_KERNEL __launch_bounds__(HS_MM_THREADS) void hs_matmul_##S(const T* __restrict__ A, const T* __restrict__ B, \
                                                        T* __restrict__ C, int M, int N, int K,              \
                                                        hs_i64 stride_a, hs_i64 stride_b, hs_i64 stride_c) { \
        __shared__ float As[HS_MM_BK][HS_MM_TILE + 4];                                                        \
        __shared__ float Bs[HS_MM_BK][HS_MM_TILE + 4];                                                        \
        hs_matmul_body<T>(A, B, C, M, N, K, stride_a, stride_b, stride_c, As, Bs);                            \
    }
HS_FOR_EACH_FLOAT(HS_MATMUL)
