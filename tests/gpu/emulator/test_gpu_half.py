"""Half precision below the kernels: prelude.h's float16/bfloat16 conversions, run on the kernel emulator,
bit for bit against NumPy (float16) and ml_dtypes (bfloat16) on every half pattern and on the float32
values where rounding decides (every midpoint between neighbouring halves and its float32 neighbours,
the overflow and underflow edges, random bit patterns); DLPack's kDLFloat/kDLBfloat type codes; the
__cuda_array_interface__ rules for bfloat16 (no typestr of its own: not exported, not guessed)."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

import gpu_emulator
from hipsched.errors import GpuError
from hipsched.gpu.memory import dlpack
from hipsched.gpu.launch.context import GpuContext, Launch
from hipsched.gpu.compilation.kernels import PRELUDE, KernelCache, _source_dir
from hipsched.gpu.memory.device_array import DeviceArray, to_device

BF16 = np.dtype(ml_dtypes.bfloat16)

CONVERSIONS = r"""
HS_KERNEL void t_half_to_float(const hs_u16* h, float* f, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) f[i] = hs_half_to_float(h[i]);
}
HS_KERNEL void t_bf16_to_float(const hs_u16* h, float* f, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) f[i] = hs_bf16_to_float(h[i]);
}
HS_KERNEL void t_float_to_half(const float* f, hs_u16* h, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) h[i] = hs_float_to_half(f[i]);
}
HS_KERNEL void t_float_to_bf16(const float* f, hs_u16* h, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) h[i] = hs_float_to_bf16(f[i]);
}
// the 16-byte packs (hs_ld8 / hs_st8) over n elements (n % 8 == 0)
#define T_PACKS(S, T)                                                                                   \
    HS_KERNEL void t_widen8_##S(const T* h, float* f, hs_i64 n) {                                       \
        for (hs_i64 p = hs_gid(); p < n / 8; p += hs_gstride()) {                                       \
            float v[8];                                                                                 \
            hs_ld8(h, p, v);                                                                            \
            for (int e = 0; e < 8; ++e) f[8 * p + e] = v[e];                                            \
        }                                                                                               \
    }                                                                                                   \
    HS_KERNEL void t_narrow8_##S(const float* f, T* h, hs_i64 n) {                                      \
        for (hs_i64 p = hs_gid(); p < n / 8; p += hs_gstride()) {                                       \
            float v[8];                                                                                 \
            for (int e = 0; e < 8; ++e) v[e] = f[8 * p + e];                                            \
            hs_st8(h, p, v);                                                                            \
        }                                                                                               \
    }
HS_FOR_EACH_FLOAT(T_PACKS)
"""


def _prelude_context(tmp_path_factory, name, source, warp=32):
    """(runtime, context) whose only kernel source is `name`: the prelude, then `source` (test kernels of
    the prelude's own functions), on the emulator at `warp`."""
    if not gpu_emulator.available():
        pytest.skip("needs g++ (C++20) for the kernel emulator")
    rt = gpu_emulator.EmuRuntime(warp)
    ctx = GpuContext(rt, cache_dir=str(tmp_path_factory.mktemp("kernels")))
    prelude = (_source_dir() / PRELUDE).read_text()
    ctx.cache = KernelCache(rt.compiler, ctx.cache.cache_dir,
                            sources={name: prelude + f'\n#line 1 "{name}"\n' + source})
    return rt, ctx


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    rt, ctx = _prelude_context(tmp_path_factory, "conv.hip", CONVERSIONS)

    def run(kernel, x, out_dtype):
        d_in = to_device(x, runtime=rt)
        d_out = DeviceArray.empty(x.shape, out_dtype, runtime=rt)
        ctx.run(Launch.of("conv.hip", kernel, 16, 256), (d_in, d_out, ctypes.c_int64(x.size)), 0)
        return d_out.get()
    yield run
    ctx.close()
    rt.close()


def _nan_aware_equal(got_bits, want_bits, is_nan):
    """Equal bit patterns; NaN stays NaN (its payload is not promised)."""
    np.testing.assert_array_equal(is_nan(got_bits), is_nan(want_bits))
    keep = ~is_nan(want_bits)
    np.testing.assert_array_equal(got_bits[keep], want_bits[keep])


def test_every_half_pattern_widens_exactly(conv):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for kernel, t in (("t_half_to_float", np.float16), ("t_bf16_to_float", BF16)):
        want = bits.view(t).astype(np.float32).view(np.uint32)
        got = conv(kernel, bits, np.float32).view(np.uint32)
        _nan_aware_equal(got, want, lambda u: (u & 0x7fffffff) > 0x7f800000)


def test_packs_of_8_widen_like_one_element_at_a_time(conv):
    """hs_ld8 (one 16-byte load of 8 halves, or two float4 of float32): every half pattern widens as
    NumPy / ml_dtypes widen it, element 2k from word k's low bits, so the packs' order is the memory's."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for kernel, t in (("t_widen8_f16", np.float16), ("t_widen8_bf16", BF16)):
        want = bits.view(t).astype(np.float32).view(np.uint32)
        got = conv(kernel, bits, np.float32).view(np.uint32)
        _nan_aware_equal(got, want, lambda u: (u & 0x7fffffff) > 0x7f800000)
    x = np.random.default_rng(5).integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(conv("t_widen8_f32", x, np.float32).view(np.uint32), x.view(np.uint32))


def _rounding_cases(t):
    """float32 values where rounding to t decides: every half value, every midpoint between neighbours
    (a float32, since both formats fit in float32 with bits to spare) and the float32 values either side
    of it, both signs; the overflow edge; specials; and random float32 bit patterns."""
    finite = np.arange(1 << 15, dtype=np.uint32).astype(np.uint16).view(t).astype(np.float64)
    finite = finite[np.isfinite(finite)]
    mids = (finite[:-1] + finite[1:]) / 2
    big = float(ml_dtypes.finfo(t).max)
    top = big + (big - float(finite[-2])) / 2            # the midpoint above max: rounds to inf (even)
    vals = np.concatenate([finite, mids, [top, 2 * big, 1e-45, 3e38]]).astype(np.float32)
    vals = np.concatenate([vals, np.nextafter(vals, np.float32(np.inf)), np.nextafter(vals, np.float32(-np.inf))])
    vals = np.concatenate([vals, -vals, np.array([np.inf, -np.inf, np.nan, 0.0], np.float32)])
    rand = np.random.default_rng(7).integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([vals, rand])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kernel,t", [("t_float_to_half", np.float16), ("t_float_to_bf16", BF16)],
                         ids=["float16", "bfloat16"])
def test_float_rounds_to_nearest_even_like_numpy_and_ml_dtypes(conv, kernel, t):
    x = _rounding_cases(np.dtype(t))
    want = x.astype(t).view(np.uint16)
    got = conv(kernel, x, np.uint16)
    _nan_aware_equal(got, want, lambda u: (u & 0x7fff) > (0x7c00 if t is np.float16 else 0x7f80))
    if t is np.float16:   # the format's overflow: 65520 and above round to inf, below to 65504
        edge = conv(kernel, np.array([65519.996, 65520.0, -65520.0], np.float32), np.uint16)
        assert list(edge) == [0x7bff, 0x7c00, 0xfc00]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kernel,t", [("t_narrow8_f16", np.float16), ("t_narrow8_bf16", BF16)],
                         ids=["float16", "bfloat16"])
def test_packs_of_8_round_like_numpy_and_ml_dtypes(conv, kernel, t):
    """hs_st8 (8 roundings packed into one 16-byte store): the same bits as the element-wise rounding."""
    x = _rounding_cases(np.dtype(t))
    x = x[: x.size // 8 * 8]
    want = x.astype(t).view(np.uint16)
    got = conv(kernel, x, np.uint16)
    _nan_aware_equal(got, want, lambda u: (u & 0x7fff) > (0x7c00 if t is np.float16 else 0x7f80))


# prelude.h's warp-matrix operations as the emulator runs them, against NumPy. NVIDIA's fragments are filled
# and read here from the PTX ISA's tables ("Matrix Fragments for mma.m16n8k16 with floating point type":
# element i of a thread's A fragment a0..a7 at row g (+8 for i in 2, 3, 6, 7), column 2t + (i & 1) (+8 for
# i >= 4); B's b0..b3 at row 2t + (i & 1) (+8 for i >= 2), column g; C's c0..c3 at row g (+8 for i >= 2),
# column 2t + (i & 1); g = lane / 4, t = lane % 4; element 2j in the low half of register j), written
# element by element rather than register by register as the shim's are, so a wrong layout in the shim
# cannot pass for a right one. ldmatrix after its own section of the ISA: lane l receives matrix i's row
# l / 4, columns 2(l % 4) and 2(l % 4) + 1 (.trans: the transposed matrix's). AMD's v_mfma_f32_16x16x16
# from AMD's matrix instruction calculator's tables for it (wavefront 64): A[i][k] in lane i + 16 (k / 4),
# B[k][j] in lane j + 16 (k / 4), item k % 4 of both (two per 32-bit register, the lower item in the low
# half); C[i][j] in lane j + 16 (i / 4), item i % 4. Each vendor's kernels are built where its macro is.
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


def _warp_matrix(tmp_path_factory, warp):
    rt, ctx = _prelude_context(tmp_path_factory, "wm.hip", WARP_MATRIX, warp)

    def run(kernel, inputs, out_shape, out_dtype, *scalars):
        d_in = [to_device(np.ascontiguousarray(x), runtime=rt) for x in inputs]
        d_out = DeviceArray.empty(out_shape, out_dtype, runtime=rt)
        ctx.run(Launch.of("wm.hip", kernel, 1, warp), (*d_in, d_out, *scalars), 0)
        return d_out.get()
    return rt, ctx, run


@pytest.fixture(scope="module")
def warp_matrix(tmp_path_factory):
    """NVIDIA's operations, at warp 32."""
    rt, ctx, run = _warp_matrix(tmp_path_factory, 32)
    yield run
    ctx.close()
    rt.close()


@pytest.fixture(scope="module")
def wave_matrix(tmp_path_factory):
    """AMD's MFMA, at wavefront 64."""
    rt, ctx, run = _warp_matrix(tmp_path_factory, 64)
    yield run
    ctx.close()
    rt.close()


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


@pytest.mark.parametrize("t,kernel", [(np.float16, "t_mma_f16"), (BF16, "t_mma_bf16")], ids=["float16", "bfloat16"])
def test_emulated_mma_m16n8k16_against_numpy(warp_matrix, t, kernel):
    _check_product(warp_matrix, kernel, t, 16, 8)


@pytest.mark.parametrize("t,kernel", [(np.float16, "t_mfma_f16"), (BF16, "t_mfma_bf16")], ids=["float16", "bfloat16"])
def test_emulated_mma_mfma_16x16x16_against_numpy(wave_matrix, t, kernel):
    """The MFMA's fragments filled and read from AMD's tables, written here element by element (the
    shim gathers by register): a transposed or lane-shifted layout in either shows as a wrong product."""
    _check_product(wave_matrix, kernel, t, 16, 16)


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


def test_dlpack_type_codes():
    assert (dlpack.dl_dtype(np.float16).code, dlpack.dl_dtype(np.float16).bits) == (2, 16)
    t = dlpack.dl_dtype(BF16)
    assert (t.code, t.bits, t.lanes) == (dlpack.kDLBfloat, 16, 1)
    assert dlpack.np_dtype(t) == BF16
    assert dlpack.np_dtype(dlpack.DLDataType(2, 16, 1)) == np.float16


def test_dlpack_bfloat16_without_ml_dtypes_is_a_clear_error(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)   # import fails as if not installed
    with pytest.raises(GpuError, match="ml_dtypes"):
        dlpack.np_dtype(dlpack.DLDataType(dlpack.kDLBfloat, 16, 1))


@pytest.fixture
def emu_rt():
    if not gpu_emulator.available():
        pytest.skip("needs g++ (C++20) for the kernel emulator")
    rt = gpu_emulator.EmuRuntime(32)
    yield rt
    rt.close()


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_dlpack_round_trip_keeps_half_dtype(emu_rt, dtype):
    x = np.arange(12, dtype=np.float32).reshape(3, 4).astype(dtype)
    dev = to_device(x, runtime=emu_rt)
    back = DeviceArray.from_external(_DlpackOnly(dev), runtime=emu_rt)
    assert back.dtype == np.dtype(dtype) and back.shape == (3, 4)
    np.testing.assert_array_equal(back.get().view(np.uint16), x.view(np.uint16))


class _DlpackOnly:
    """A foreign producer offering only DLPack (as a PyTorch bfloat16 tensor does: torch gives bf16 no
    __cuda_array_interface__)."""

    def __init__(self, dev):
        self._dev = dev

    def __dlpack__(self, stream=None):
        return self._dev.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._dev.__dlpack_device__()


def test_cuda_array_interface_half_rules(emu_rt):
    f16 = to_device(np.ones(4, np.float16), runtime=emu_rt)
    assert f16.__cuda_array_interface__["typestr"] == "<f2"
    bf = to_device(np.ones(4, BF16), runtime=emu_rt)
    assert not hasattr(bf, "__cuda_array_interface__")   # consumers take DLPack instead

    class _Opaque:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<V2", "data": (bf.ptr, False), "version": 3,
                                    "strides": None, "stream": None}
    with pytest.raises(GpuError, match="DLPack"):
        DeviceArray.from_external(_Opaque(), runtime=emu_rt)


@pytest.mark.parametrize("flavour", ["cublas", "rocblas"])
def test_gemm_ex_arguments_follow_the_library_signature(flavour):
    """The mixed-precision GEMM's argument lists, against the declared argtypes and the vendors'
    documented order (no library needed: the calls are captured). Row-major C = A @ B is the column-major
    C^T = B^T A^T, as for sgemm: B first, then A, with m = N and n = M. A batch goes to the
    strided-batched call; a single product to the plain Ex call (cublasGemmEx / rocblas_gemm_ex), as
    PyTorch's gemm<at::Half> makes it: float32 compute, CUBLAS_GEMM_DEFAULT_TENSOR_OP on cuBLAS."""
    import threading

    from hipsched.gpu.launch.blas import FLAVOURS, GEMM_EX, Blas
    blas = Blas.__new__(Blas)
    blas.flavour, blas._op_n = flavour, FLAVOURS[flavour][6]
    blas._handle, blas._lock = ctypes.c_void_p(7), threading.Lock()
    blas._alpha, blas._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    _, blas._ex_types, blas._ex_compute, blas._ex_algo, _ = GEMM_EX[flavour]
    batched, single = [], []
    blas._gemm_ex = lambda *args: batched.append(args) or 0
    blas._gemm_ex1 = lambda *args: single.append(args) or 0
    blas._set_stream = lambda handle, stream: 0
    assert blas.supports_dtype("float16") and blas.supports_dtype("bfloat16") and not blas.supports_dtype("int8")
    M, N, K = 3, 5, 4
    blas.gemm_ex_rowmajor(1000, 2000, 3000, M, N, K, 2, M * K, 0, M * N, 0, "bfloat16")
    (args,) = batched
    assert len(args) == len(Blas._ex_argtypes(flavour)) and not single
    t = GEMM_EX[flavour][1]["bfloat16"]
    assert args[3:6] == (N, M, K)
    assert (args[7].value, args[8], args[9], args[10]) == (2000, t, N, 0)        # B^T: ld N, broadcast
    assert (args[11].value, args[12], args[13], args[14]) == (1000, t, K, M * K)  # A^T: ld K
    assert (args[16].value, args[17], args[18], args[19]) == (3000, t, N, M * N)  # C^T: ld N
    if flavour == "rocblas":   # D = C, then batch, f32_r compute, standard algorithm, solution 0, flags 0
        assert (args[20].value, args[21], args[22], args[23]) == (3000, t, N, M * N)
        assert args[24:] == (2, 151, 0, 0, 0)
    else:                      # batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP
        assert args[20:] == (2, 68, 99)
    blas.gemm_ex_rowmajor(1000, 2000, 3000, M, N, K, 1, 0, 0, M * N, 0, "float16")
    (args,) = single
    assert len(args) == len(Blas._ex_argtypes(flavour, batched=False)) and len(batched) == 1
    t = GEMM_EX[flavour][1]["float16"]
    assert args[3:6] == (N, M, K)
    assert (args[7].value, args[8], args[9]) == (2000, t, N)     # B^T
    assert (args[10].value, args[11], args[12]) == (1000, t, K)  # A^T
    assert (args[14].value, args[15], args[16]) == (3000, t, N)  # C^T
    if flavour == "rocblas":   # D = C, f32_r compute, standard algorithm, solution 0, flags 0
        assert (args[17].value, args[18], args[19]) == (3000, t, N)
        assert args[20:] == (151, 0, 0, 0)
    else:
        assert args[17:] == (68, 99)
    with pytest.raises(GpuError):
        blas.gemm_ex_rowmajor(1000, 2000, 3000, M, N, K, 1, 0, 0, 0, 0, "float32")
