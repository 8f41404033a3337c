"""prelude.h's warp-matrix operations, which the tensor-core attention kernels (hs_attention_*_mma_*) are
built from, as the kernel emulator runs them: NVIDIA's mma.m16n8k16 (float16 and bfloat16 inputs, float32
accumulation) and ldmatrix .x4 (plain and .trans) at warp 32, against NumPy and the PTX ISA's fragment
layouts, and AMD's v_mfma_f32_16x16x16 at wavefront 64 against AMD's. CI's memcheck and racecheck steps
run this file with the tensor-core kernels (.ci/run)."""
import ctypes

import numpy as np
import pytest

import gpu_emulator
from half_formats import HALF
from hipsched.gpu.launch.context import Launch
from hipsched.gpu.memory.device_array import DeviceArray, to_device

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

# The fragments are filled and read here from the PTX ISA's tables ("Matrix Fragments for mma.m16n8k16
# with floating point type": element i of a thread's A fragment a0..a7 at row g (+8 for i in 2, 3, 6, 7),
# column 2t + (i & 1) (+8 for i >= 4); B's b0..b3 at row 2t + (i & 1) (+8 for i >= 2), column g; C's c0..c3
# at row g (+8 for i >= 2), column 2t + (i & 1); g = lane / 4, t = lane % 4; element 2j in the low half of
# register j), written element by element rather than register by register as the shim's are, so a wrong
# layout in the shim cannot pass for a right one. ldmatrix after its own section of the ISA: lane l
# receives matrix i's row l / 4, columns 2(l % 4) and 2(l % 4) + 1 (.trans: the transposed matrix's).
# AMD's v_mfma_f32_16x16x16 from AMD's matrix instruction calculator's tables for it (wavefront 64):
# A[i][k] in lane i + 16 (k / 4), B[k][j] in lane j + 16 (k / 4), item k % 4 of both (two per 32-bit
# register, the lower item in the low half); C[i][j] in lane j + 16 (i / 4), item i % 4. Each vendor's
# kernels are built where its macro is.
WARP_MATRIX = r"""
#if defined(HS_MMA_M16N8K16)
template <class T> HS_DEV void t_mma(const hs_u16* A, const hs_u16* B, const float* C, float* D) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    hs_u32 a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4];
    for (int i = 0; i < 8; ++i) {
        const int row = g + ((i % 4) >= 2 ? 8 : 0), col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        a[i / 2] |= (hs_u32)A[row * 16 + col] << (16 * (i & 1));
    }
    for (int i = 0; i < 4; ++i) {
        const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0), col = g;
        b[i / 2] |= (hs_u32)B[row * 8 + col] << (16 * (i & 1));
    }
    for (int i = 0; i < 4; ++i) d[i] = C[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)];
    hs_mma_16816<T>(d, a, b);
    for (int i = 0; i < 4; ++i) D[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = d[i];
}
HS_KERNEL void t_mma_f16(const hs_u16* A, const hs_u16* B, const float* C, float* D) { t_mma<hs_half>(A, B, C, D); }
HS_KERNEL void t_mma_bf16(const hs_u16* A, const hs_u16* B, const float* C, float* D) { t_mma<hs_bf16>(A, B, C, D); }
// M: 16 x 24 (rows padded: a row's address is not the previous row's end); matrix i = rows 8 (i % 2)..,
// columns 8 (i / 2)..; out[lane * 4 + i] = register i of the lane
HS_KERNEL void t_ldmatrix(const hs_u16* M, hs_u32* out, int trans) {
    __shared__ hs_u16 sm[16][24];
    const int lane = threadIdx.x % 32;
    for (int e = lane; e < 16 * 24; e += 32) sm[e / 24][e % 24] = M[e];
    __syncthreads();
    hs_u32 r[4];
    const void* row = &sm[8 * ((lane / 8) % 2) + lane % 8][8 * (lane / 16)];
    if (trans) hs_ldsm_x4_trans(r, row); else hs_ldsm_x4(r, row);
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}
#endif
#if defined(HS_MFMA_16X16X16)
template <class T> HS_DEV void t_mfma(const hs_u16* A, const hs_u16* B, const float* C, float* D) {
    const int lane = threadIdx.x % 64;
    hs_u32 a[2] = {0, 0}, b[2] = {0, 0};
    float d[4];
    for (int row = 0; row < 16; ++row) {
        for (int col = 0; col < 16; ++col) {
            // the calculator's tables: A[i][k] and B[k][j] in lane (i or j) + 16 (k / 4), item k % 4;
            // C[i][j] in lane j + 16 (i / 4), item i % 4
            if (lane == row + 16 * (col / 4)) a[(col % 4) / 2] |= (hs_u32)A[row * 16 + col] << (16 * (col % 2));
            if (lane == col + 16 * (row / 4)) b[(row % 4) / 2] |= (hs_u32)B[row * 16 + col] << (16 * (row % 2));
            if (lane == col + 16 * (row / 4)) d[row % 4] = C[row * 16 + col];
        }
    }
    hs_mfma_16x16x16<T>(d, a, b);
    for (int row = 0; row < 16; ++row)
        for (int col = 0; col < 16; ++col)
            if (lane == col + 16 * (row / 4)) D[row * 16 + col] = d[row % 4];
}
HS_KERNEL void t_mfma_f16(const hs_u16* A, const hs_u16* B, const float* C, float* D) { t_mfma<hs_half>(A, B, C, D); }
HS_KERNEL void t_mfma_bf16(const hs_u16* A, const hs_u16* B, const float* C, float* D) { t_mfma<hs_bf16>(A, B, C, D); }
#endif
"""


def _matrix_runner(tmp_path_factory, warp):
    """Yields run(kernel, inputs, out_shape, out_dtype, *scalars) on the emulator at `warp`, then closes it."""
    rt, ctx = gpu_emulator.prelude_context(str(tmp_path_factory.mktemp("kernels")), "wm.hip", WARP_MATRIX, warp)

    def run(kernel, inputs, out_shape, out_dtype, *scalars):
        d_in = [to_device(np.ascontiguousarray(x), runtime=rt) for x in inputs]
        d_out = DeviceArray.empty(out_shape, out_dtype, runtime=rt)
        ctx.run(Launch.of("wm.hip", kernel, 1, warp), (*d_in, d_out, *scalars), 0)
        return d_out.get()
    yield run
    ctx.close()
    rt.close()


@pytest.fixture(scope="module")
def warp_matrix(tmp_path_factory):
    """NVIDIA's operations, at warp 32."""
    yield from _matrix_runner(tmp_path_factory, 32)


@pytest.fixture(scope="module")
def wave_matrix(tmp_path_factory):
    """AMD's MFMA, at wavefront 64."""
    yield from _matrix_runner(tmp_path_factory, 64)


def _check_product(run, kernel, t, m, n):
    """D = A B + C for A (m x 16), B (16 x n), C (m x n) through `kernel`, against NumPy."""
    rng = np.random.default_rng(21)
    # small integers: every product and sum is exact in float32, so D must be A B + C exactly, and an
    # element taken from the wrong row, column or lane shows
    A = rng.integers(-8, 9, (m, 16)).astype(t)
    B = rng.integers(-8, 9, (16, n)).astype(t)
    C = rng.integers(-64, 65, (m, n)).astype(np.float32)
    got = run(kernel, (A.view(np.uint16), B.view(np.uint16), C), (m, n), np.float32)
    np.testing.assert_array_equal(got, A.astype(np.float64) @ B.astype(np.float64) + C)
    # full-width values: the products of the 16-bit inputs are exact and only the float32 sums round
    # (16 additions to c), far below the 16-bit rounding a product kept in half precision would add
    A = (rng.standard_normal((m, 16)) * 3).astype(t)
    B = (rng.standard_normal((16, n)) * 3).astype(t)
    C = rng.standard_normal((m, n)).astype(np.float32)
    got = run(kernel, (A.view(np.uint16), B.view(np.uint16), C), (m, n), np.float32)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    ref = A64 @ B64 + C
    bound = 16 * 2.0 ** -24 * (np.abs(A64) @ np.abs(B64) + np.abs(C))
    np.testing.assert_array_less(np.abs(got - ref), bound)


@pytest.mark.parametrize("name,kernel", [("float16", "t_mma_f16"), ("bfloat16", "t_mma_bf16")],
                         ids=["float16", "bfloat16"])
def test_emulated_mma_m16n8k16_against_numpy(warp_matrix, name, kernel):
    _check_product(warp_matrix, kernel, HALF[name], 16, 8)


@pytest.mark.parametrize("name,kernel", [("float16", "t_mfma_f16"), ("bfloat16", "t_mfma_bf16")],
                         ids=["float16", "bfloat16"])
def test_emulated_mma_mfma_16x16x16_against_numpy(wave_matrix, name, kernel):
    """The MFMA's fragments filled and read from AMD's tables, written here element by element (the
    shim gathers by register): a transposed or lane-shifted layout in either shows as a wrong product."""
    _check_product(wave_matrix, kernel, HALF[name], 16, 16)


@pytest.mark.parametrize("trans", [0, 1], ids=["ldmatrix", "ldmatrix_trans"])
def test_emulated_ldmatrix_x4_against_the_isa(warp_matrix, trans):
    M = np.arange(16 * 24, dtype=np.uint16).reshape(16, 24)
    got = warp_matrix("t_ldmatrix", (M,), (32, 4), np.uint32, ctypes.c_int32(trans))
    for lane in range(32):
        for i in range(4):
            mat = M[8 * (i % 2):8 * (i % 2) + 8, 8 * (i // 2):8 * (i // 2) + 8]
            if trans:
                mat = mat.T
            r, c = lane // 4, 2 * (lane % 4)
            assert got[lane, i] == int(mat[r, c]) | (int(mat[r, c + 1]) << 16), (lane, i)


def _subnormal_operands(t):
    """A, B, C whose first 8 columns of A B + C are subnormal inputs' products alone: A's column 0 holds
    subnormals of the 16-bit type t (its least normal is 2^-14 for float16, 2^-126 for bfloat16) and B's
    row 0 ones there, C's row 1 a float32 subnormal; columns 8-15 are 2 (A's column 1 times B's row 1)."""
    tiny = 2.0 ** (-21 if t == HALF["float16"] else -131)   # 16 tiny: still below the least normal
    A = np.zeros((16, 16), np.float64)
    A[:, 1] = 1
    A[:, 0] = tiny * np.arange(1, 17)                # every one a subnormal of t, exact
    B = np.zeros((16, 16), np.float64)
    B[0, :8] = 1
    B[1, 8:] = 2
    C = np.zeros((16, 16), np.float32)
    C[1, :8] = np.float32(2.0 ** -140)                # a float32 subnormal
    return A.astype(t), B.astype(t), C


@pytest.mark.parametrize("name,kernel", [("float16", "t_mfma_f16"), ("bfloat16", "t_mfma_bf16")],
                         ids=["float16", "bfloat16"])
def test_emulated_mfma_flushes_subnormals_as_mi200_does(wave_matrix, name, kernel):
    """gfx90a's MFMA reads subnormal 16-bit inputs and float32 C as zeros and writes no subnormal: the
    columns made of them are zeros, the others 2."""
    A, B, C = _subnormal_operands(HALF[name])
    got = wave_matrix(kernel, (A.view(np.uint16), B.view(np.uint16), C), (16, 16), np.float32)
    np.testing.assert_array_equal(got[:, :8], 0)
    np.testing.assert_array_equal(got[:, 8:], 2)


@pytest.mark.parametrize("name,kernel", [("float16", "t_mma_f16"), ("bfloat16", "t_mma_bf16")],
                         ids=["float16", "bfloat16"])
def test_emulated_mma_keeps_subnormals(warp_matrix, name, kernel):
    """mma.sync keeps subnormal inputs (the PTX ISA): the same operands give A B + C exactly."""
    A, B, C = _subnormal_operands(HALF[name])
    got = warp_matrix(kernel, (A.view(np.uint16), B[:, :8].view(np.uint16), C[:, :8]), (16, 8), np.float32)
    ref = (A.astype(np.float64) @ B[:, :8].astype(np.float64) + C[:, :8]).astype(np.float32)
    assert (ref != 0).all()
    np.testing.assert_array_equal(got, ref)
