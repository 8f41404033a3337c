"""attention with float16/bfloat16 q, k, v on the CPU kernel (rerun on the scalar path by
test_simd_paths.py), against PyTorch's scaled_dot_product_attention in float64 on the same half values
and PyTorch's in the same half dtype.

Tolerances. Half values widen to float32 exactly and the kernel computes in float32 as for float32
inputs, within 1e-5 (1 + |out|) of float64 (test_cpu_attention.py's bound: float32 dots and sums of a
few hundred terms, an exp2 accurate to ~1.2e-7); the output is then rounded once to the half format,
u |out| more (u = 2^-11 float16, 2^-8 bfloat16). PyTorch's half SDPA on the CPU rounds its output too
and may round the probabilities P (each <= 1) to the format before the P V product, u sum_j p_j |v_j| <=
u max|v|: the two differ by at most 2u |out| + u max|v| + 2e-5 (1 + |out|)."""
import os

import numpy as np
import pytest
from requires import need

import hipsched
from hipsched.cpu import _attention as A
from hipsched.ops import OPS

torch = need("torch")
ml_dtypes = need("ml_dtypes")
F = torch.nn.functional
BF16 = ml_dtypes.bfloat16
HALVES = [np.float16, BF16]
UNIT = {np.float16: 2.0 ** -11, BF16: 2.0 ** -8}
F32 = 1e-5  # the float32 kernel's bound against float64, relative and absolute

SCALAR = os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar"


def _qkv(rng, dt, b, h, sq, sk, d):
    return tuple(rng.standard_normal(s).astype(dt) for s in ((b, h, sq, d), (b, h, sk, d), (b, h, sk, d)))


def _t(a):
    if a.dtype == BF16:  # torch.from_numpy does not know ml_dtypes: same bits, reinterpreted
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a).copy())


def _ref64(q, k, v, causal=False, scale=None):
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=causal, scale=scale).numpy()


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,sq,sk,d", [(1, 1, 1, 1, 1), (1, 2, 5, 7, 3), (2, 2, 70, 130, 16),
                                         (1, 1, 129, 65, 64), (1, 1, 64, 200, 33)])
def test_half_attention_against_float64(rng, dt, causal, b, h, sq, sk, d):
    q, k, v = _qkv(rng, dt, b, h, sq, sk, d)
    out = hipsched.attention(q, k, v, causal=causal, backend="cpu")
    assert out.dtype == np.dtype(dt) and out.shape == (b, h, sq, d)
    ref = _ref64(q, k, v, causal)
    bound = UNIT[dt] * np.abs(ref) + F32 * (1 + np.abs(ref))
    assert np.all(np.abs(out.astype(np.float64) - ref) <= bound)


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("causal", [False, True])
def test_half_attention_against_torch_same_dtype(rng, dt, causal):
    q, k, v = _qkv(rng, dt, 1, 2, 150 if SCALAR else 300, 150 if SCALAR else 300, 64)
    ours = A.attention(q, k, v, causal).astype(np.float64)
    theirs = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=causal).float().numpy().astype(np.float64)
    ref = _ref64(q, k, v, causal)
    u = UNIT[dt]
    vmax = np.abs(v.astype(np.float64)).max()
    assert np.all(np.abs(ours - theirs) <= 2 * u * np.abs(ref) + u * vmax + 2 * F32 * (1 + np.abs(ref)))
    assert np.all(np.abs(ours - ref) <= u * np.abs(ref) + F32 * (1 + np.abs(ref)))


@pytest.mark.parametrize("dt", HALVES)
def test_half_attention_is_the_float32_computation_rounded_once(rng, dt):
    """Half inputs widen exactly and take the float32 kernel's arithmetic: the output is the float32
    kernel's output on the widened values, rounded to the dtype as ml_dtypes/NumPy round it."""
    q, k, v = _qkv(rng, dt, 1, 3, 77, 140, 24)
    out = A.attention(q, k, v)
    f32 = A.attention(*(x.astype(np.float32) for x in (q, k, v)))
    np.testing.assert_array_equal(out.view(np.uint16), f32.astype(dt).view(np.uint16))


@pytest.mark.parametrize("dt", HALVES)
def test_half_attention_nan_and_empty_keys(rng, dt):
    q, k, v = _qkv(rng, dt, 1, 1, 4, 6, 8)
    q[0, 0, 1, 2] = np.nan
    out = A.attention(q, k, v).astype(np.float32)
    assert np.isnan(out[0, 0, 1]).all() and np.isfinite(out[0, 0, [0, 2, 3]]).all()
    empty = A.attention(q, k[:, :, :0], v[:, :, :0])
    assert empty.dtype == np.dtype(dt) and np.all(empty.astype(np.float32) == 0)


def test_mixed_dtypes_promote_to_float32(rng):
    q, k, v = _qkv(rng, np.float16, 1, 1, 8, 8, 8)
    call = OPS["attention"].prepare(q, k.astype(BF16), v)
    assert call.dtype == "float32" and all(a.dtype == np.float32 for a in call.args)
    out = hipsched.attention(q, k.astype(BF16), v)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, A.attention(q.astype(np.float32), k.astype(BF16).astype(np.float32),
                                                   v.astype(np.float32)))
    call = OPS["attention"].prepare(q, k, v)
    assert call.dtype == "float16" and call.nbytes == 2 * (2 * 64 + 2 * 64)
    assert "bfloat16" in OPS["attention"].cpu_dtypes and "bfloat16" in OPS["attention"].gpu_dtypes
