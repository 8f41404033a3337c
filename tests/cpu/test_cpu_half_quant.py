"""quantize with a float16/bfloat16 W and qmatmul with a float16/bfloat16 x (rerun on the scalar path by
test_simd_paths.py), against the `gguf` package and a float64 product.

quantize: the bytes must equal gguf's quantization of the same half values widened to float32 (the
widening is exact, so there is nothing to tolerate). qmatmul: the float32 result obeys
|y32 - exact| <= k 2^-23 (|Wd| @ |x|) (test_cpu_quant.py's dot-product bound) and is then rounded once
to x's dtype, u |exact| more (u = 2^-11 float16, 2^-8 bfloat16), with (1 + u) on the first term."""
import numpy as np
import pytest
from requires import need

gguf = need("gguf")
ml_dtypes = need("ml_dtypes")
from gguf import GGMLQuantizationType as GT  # noqa: E402

import hipsched as hs  # noqa: E402
from hipsched.cpu import _quant as Q  # noqa: E402

BF16 = ml_dtypes.bfloat16
HALVES = [np.float16, BF16]
UNIT = {np.float16: 2.0 ** -11, BF16: 2.0 ** -8}
QTYPES = {"q8_0": GT.Q8_0, "q4_0": GT.Q4_0}
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}


def _weights(rng, n, k, dt):
    # rows of very different magnitudes (within float16's range), so block scales cover a wide range
    return (rng.standard_normal((n, k)) * rng.uniform(1e-3, 1e2, size=(n, 1))).astype(dt)


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("qt", sorted(QTYPES))
@pytest.mark.parametrize("n,k", [(0, 32), (1, 32), (7, 64), (33, 96), (300, 4096)])
def test_half_quantize_is_gguf_of_the_widened_values(rng, monkeypatch, dt, qt, n, k):
    monkeypatch.setattr(Q, "QUANTIZE_CHUNK_BYTES", 4 * 4096 * 7)  # several row chunks on the last shape
    W = _weights(rng, n, k, dt)
    w = hs.quantize(W, qt)
    W32 = W.astype(np.float32)
    ref = gguf.quants.quantize(W32, QTYPES[qt]) if n else np.zeros((0, k // 32 * BLOCK_BYTES[qt]), np.uint8)
    assert w.shape == (n, k) and np.array_equal(w.data, ref)


def test_half_quantize_errors_name_the_row():
    W = np.ones((3, 32), np.float16)
    W[2, 3] = np.inf
    with pytest.raises(ValueError, match="row 2"):
        hs.quantize(W, "q8_0")
    Wb = np.full((2, 32), 1e7, BF16)  # bfloat16 reaches past q4_0's fp16 scale range
    with pytest.raises(ValueError, match="fp16"):
        hs.quantize(Wb, "q4_0")


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("qt", sorted(QTYPES))
@pytest.mark.parametrize("m", [None, 1, 3, 8])
def test_half_qmatmul_against_float64(rng, dt, qt, m):
    n, k = 33, 256
    w = hs.quantize(_weights(rng, n, k, np.float32), qt)
    Wd = gguf.quants.dequantize(w.data, QTYPES[qt]).astype(np.float64)
    x = rng.standard_normal(k if m is None else (k, m)).astype(dt)
    y = hs.qmatmul(w, x, backend="cpu")
    assert y.dtype == np.dtype(dt) and y.shape == ((n,) if m is None else (n, m))
    x64 = x.astype(np.float64)
    exact = Wd @ x64
    bound = (1 + UNIT[dt]) * k * 2.0 ** -23 * (np.abs(Wd) @ np.abs(x64)) + UNIT[dt] * np.abs(exact)
    assert np.all(np.abs(y.astype(np.float64) - exact) <= bound)
    # the float32 product on the same values, rounded once as NumPy/ml_dtypes round
    np.testing.assert_array_equal(y.view(np.uint16), hs.qmatmul(w, x.astype(np.float32)).astype(dt).view(np.uint16))


def test_half_qmatmul_float16_overflow_is_inf(rng):
    w = hs.quantize(np.full((2, 64), 1000.0, np.float32), "q8_0")
    x = np.full(64, 1000.0, np.float16)
    assert np.all(np.isposinf(hs.qmatmul(w, x).astype(np.float32)))  # 6.4e7 > 65504
    assert np.all(np.isfinite(hs.qmatmul(w, x.astype(BF16)).astype(np.float32)))


def test_half_qmatmul_call_measures_half_bytes(rng):
    from hipsched.ops import OPS
    w = hs.quantize(_weights(rng, 4, 64, np.float32), "q4_0")
    call = OPS["qmatmul"].prepare(w, np.ones((64, 2), BF16))
    assert call.args[1].dtype == BF16 and call.nbytes == w.nbytes + 2 * (64 * 2 + 4 * 2)
    with pytest.raises(TypeError, match="qmatmul.*'x'"):
        hs.qmatmul(w, np.ones(64, np.complex64))
