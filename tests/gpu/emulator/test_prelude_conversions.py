"""prelude.h's conversions between float32 and the 16-bit formats, which every half kernel's loads and
stores go through: one element at a time and in the 16-byte packs of 8 (hs_ld8 / hs_st8), run on the
kernel emulator, bit for bit against NumPy (float16) and ml_dtypes (bfloat16) on every half pattern and
on the float32 values where rounding decides (every midpoint between neighbouring halves and its float32
neighbours, the overflow and underflow edges, random bit patterns)."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

import gpu_emulator
from half_formats import HALF
from hipsched.gpu.launch.context import Launch
from hipsched.gpu.memory.device_array import DeviceArray, to_device

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

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


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    rt, ctx = gpu_emulator.prelude_context(str(tmp_path_factory.mktemp("kernels")), "conv.hip", CONVERSIONS)

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
    for kernel, name in (("t_half_to_float", "float16"), ("t_bf16_to_float", "bfloat16")):
        want = bits.view(HALF[name]).astype(np.float32).view(np.uint32)
        got = conv(kernel, bits, np.float32).view(np.uint32)
        _nan_aware_equal(got, want, lambda u: (u & 0x7fffffff) > 0x7f800000)


def test_packs_of_8_widen_like_one_element_at_a_time(conv):
    """hs_ld8 (one 16-byte load of 8 halves, or two float4 of float32): every half pattern widens as
    NumPy / ml_dtypes widen it, element 2k from word k's low bits, so the packs' order is the memory's."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for kernel, name in (("t_widen8_f16", "float16"), ("t_widen8_bf16", "bfloat16")):
        want = bits.view(HALF[name]).astype(np.float32).view(np.uint32)
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


def _half_is_nan(name):
    return lambda u: (u & 0x7fff) > (0x7c00 if name == "float16" else 0x7f80)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kernel,name", [("t_float_to_half", "float16"), ("t_float_to_bf16", "bfloat16")],
                         ids=["float16", "bfloat16"])
def test_float_rounds_to_nearest_even_like_numpy_and_ml_dtypes(conv, kernel, name):
    x = _rounding_cases(HALF[name])
    want = x.astype(HALF[name]).view(np.uint16)
    got = conv(kernel, x, np.uint16)
    _nan_aware_equal(got, want, _half_is_nan(name))
    if name == "float16":   # the format's overflow: 65520 and above round to inf, below to 65504
        edge = conv(kernel, np.array([65519.996, 65520.0, -65520.0], np.float32), np.uint16)
        assert list(edge) == [0x7bff, 0x7c00, 0xfc00]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kernel,name", [("t_narrow8_f16", "float16"), ("t_narrow8_bf16", "bfloat16")],
                         ids=["float16", "bfloat16"])
def test_packs_of_8_round_like_numpy_and_ml_dtypes(conv, kernel, name):
    """hs_st8 (8 roundings packed into one 16-byte store): the same bits as the element-wise rounding."""
    x = _rounding_cases(HALF[name])
    x = x[: x.size // 8 * 8]
    want = x.astype(HALF[name]).view(np.uint16)
    got = conv(kernel, x, np.uint16)
    _nan_aware_equal(got, want, _half_is_nan(name))
