"""matmul with float16/bfloat16 operands on the CPU (rerun on the scalar path by test_simd_paths.py),
against a float64 product of the same half values and PyTorch CPU in the same dtype.

Tolerance. The operands widen to float32 exactly; a float32 dot over k terms is within
k 2^-24 (|a| @ |b|) of the exact one (the standard gamma_k bound), and the result is rounded once to
the half format, relative error u (2^-11 float16, 2^-8 bfloat16): |ours - exact| <= u |exact| +
(1 + u) k 2^-24 (|a| @ |b|). PyTorch's CPU product accumulates in float32 and rounds once too, so the
same bound holds for it, and twice the bound between the two."""
import numpy as np
import pytest
from requires import need

import hipsched
from hipsched.cpu import _similarity as S

ml_dtypes = need("ml_dtypes")
BF16 = ml_dtypes.bfloat16
HALVES = [np.float16, BF16]
UNIT = {np.float16: 2.0 ** -11, BF16: 2.0 ** -8}


def _bound(a, b, dt):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = np.matmul(a64, b64)
    k = a.shape[-1]
    return exact, UNIT[dt] * np.abs(exact) + (1 + UNIT[dt]) * k * 2.0 ** -24 * np.matmul(np.abs(a64), np.abs(b64))


def _torch(a):
    torch = need("torch")
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("sa,sb", [((7, 9), (9, 33)), ((9,), (9, 8)), ((7, 9), (9,)), ((9,), (9,)),
                                   ((3, 4, 5), (5, 6)), ((4, 5), (3, 5, 6)), ((2, 4, 5), (2, 5, 1)),
                                   ((0, 3), (3, 4)), ((4, 0), (0, 5)), ((300, 70), (70, 50))])
def test_half_matmul_against_float64(rng, monkeypatch, dt, sa, sb):
    monkeypatch.setattr(S, "MATMUL_PANEL_BYTES", 4 * 70 * 16)  # several row panels on the last shape
    a = rng.standard_normal(sa).astype(dt)
    b = rng.standard_normal(sb).astype(dt)
    out = hipsched.matmul(a, b, backend="cpu")
    assert out.dtype == np.dtype(dt) and out.shape == np.matmul(a.astype(np.float32), b.astype(np.float32)).shape
    exact, bound = _bound(a, b, dt)
    assert np.all(np.abs(out.astype(np.float64) - exact) <= bound)


@pytest.mark.parametrize("dt", HALVES)
def test_half_matmul_against_torch_same_dtype(rng, dt):
    a = rng.standard_normal((64, 256)).astype(dt)
    b = rng.standard_normal((256, 48)).astype(dt)
    ours = S.matmul(a, b).astype(np.float64)
    theirs = (_torch(a) @ _torch(b)).float().numpy().astype(np.float64)
    exact, bound = _bound(a, b, dt)
    assert np.all(np.abs(ours - exact) <= bound) and np.all(np.abs(ours - theirs) <= 2 * bound)


def test_float16_overflow_and_nan_follow_the_format():
    """A float32 sum past 65504 becomes inf in float16 (as PyTorch's conversion does); NaN propagates;
    bfloat16 has float32's range and stays finite."""
    a = np.full((2, 1024), 300, np.float16)
    a[1, 5] = np.nan
    b = np.full((1024, 3), 300, np.float16)
    out = S.matmul(a, b)
    assert np.all(np.isposinf(out[0])) and np.all(np.isnan(out[1]))
    torch = need("torch")
    np.testing.assert_array_equal(out.astype(np.float32), (_torch(a) @ _torch(b)).float().numpy())
    ob = S.matmul(a.astype(BF16), b.astype(BF16))
    assert np.all(np.isfinite(ob[0].astype(np.float32)))


def test_mixed_dtypes_promote_to_float32(rng):
    a = rng.standard_normal((5, 6)).astype(np.float16)
    b = rng.standard_normal((6, 4)).astype(BF16)
    out = hipsched.matmul(a, b)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.matmul(a.astype(np.float32), b.astype(np.float32)))
    from hipsched.ops import OPS
    call = OPS["matmul"].prepare(a, a.T)
    assert call.dtype == "float16" and call.nbytes == 2 * (30 + 30 + 25)
    with pytest.raises(TypeError, match="matmul"):
        S.matmul(a, b)  # the extension itself takes one dtype
