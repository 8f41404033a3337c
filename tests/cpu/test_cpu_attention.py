"""attention on the CPU kernel against torch.nn.functional.scaled_dot_product_attention (run in float64,
so the reference carries no float32 error of its own) and a NumPy formula where torch differs on purpose
(NaN rows). Tolerance: rtol 1e-5, atol 1e-5 -- float32 dot products and sums of up to a few hundred
terms, and an exp2 accurate to ~1.2e-7 relative. Runs on whichever SIMD path the process chose;
test_simd_paths.py reruns it on the scalar path (with fewer property examples)."""
import os

import numpy as np
import pytest
from requires import need
from hypothesis import given, settings, strategies as st

import hipsched
from hipsched.cpu import _attention as A
from hipsched.ops import OPS

torch = need("torch")
F = torch.nn.functional

RTOL = ATOL = 1e-5
EXAMPLES = 10 if os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar" else 40


def _qkv(rng, b, h, sq, sk, d, scale=1.0):
    q = (rng.standard_normal((b, h, sq, d)) * scale).astype(np.float32)
    k = rng.standard_normal((b, h, sk, d)).astype(np.float32)
    v = rng.standard_normal((b, h, sk, d)).astype(np.float32)
    return q, k, v


def _torch_ref(q, k, v, causal=False, scale=None):
    t = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=causal, scale=scale).numpy()


def _numpy_ref(q, k, v, causal=False, scale=None):
    """The formula, in float64; a row whose scores hold NaN comes out NaN (NumPy semantics)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = (1.0 / np.sqrt(q.shape[-1]) if scale is None else scale) * (q @ np.swapaxes(k, -1, -2))
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


SHAPES = [(sq, sk, d) for d in (1, 7, 8, 33, 64) for sq, sk in ((1, 1), (7, 7), (31, 33), (33, 31), (1, 7), (7, 1))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,d", SHAPES)
def test_matches_torch_sdpa(rng, sq, sk, d, causal):
    q, k, v = _qkv(rng, 2, 3, sq, sk, d)
    out = hipsched.attention(q, k, v, causal=causal)
    assert out.shape == (2, 3, sq, d) and out.dtype == np.float32
    np.testing.assert_allclose(out, _torch_ref(q, k, v, causal), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,sq,sk,d", [(1, 2, 130, 200, 64), (2, 2, 200, 130, 17), (1, 1, 257, 257, 128),
                                         (3, 1, 65, 64, 16)])
def test_several_tiles_and_threads_match_torch(rng, b, h, sq, sk, d, causal):
    """Crosses the 64-query and 64-key tiles, the strips (16 queries at 8 lanes, 32 at AVX-512's 16) and
    the two-thread grain."""
    q, k, v = _qkv(rng, b, h, sq, sk, d)
    np.testing.assert_allclose(A.attention(q, k, v, causal=causal), _torch_ref(q, k, v, causal),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("scale", [0.3, 2.5, -1.0, 0.0])
@pytest.mark.parametrize("causal", [False, True])
def test_custom_scale(rng, scale, causal):
    """Against torch for positive scales; torch's float64 causal path turns a negative scale into NaN
    (it scales after masking with -inf), so scales <= 0 are checked against the NumPy formula."""
    q, k, v = _qkv(rng, 1, 2, 40, 70, 24)
    ref = _torch_ref(q, k, v, causal, scale) if scale > 0 else _numpy_ref(q, k, v, causal, scale)
    np.testing.assert_allclose(hipsched.attention(q, k, v, causal=causal, scale=scale), ref, rtol=RTOL, atol=ATOL)


def test_large_scores_stay_stable(rng):
    """Scores in the thousands: the online max must keep every exp in range. A float32 score of ~1e3
    carries ~1e-4 absolute rounding, which exp turns into ~1e-4 relative: hence the looser tolerance."""
    q, k, v = _qkv(rng, 1, 1, 50, 90, 32, scale=300.0)
    for causal in (False, True):
        out = hipsched.attention(q, k, v, causal=causal)
        assert np.isfinite(out).all()
        np.testing.assert_allclose(out, _torch_ref(q, k, v, causal), rtol=3e-4, atol=3e-4)


@pytest.mark.parametrize("sq,sk", [(0, 5), (5, 0), (0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_empty_sequences_match_torch(rng, sq, sk, causal):
    """No queries: an empty result; no keys: zeros, as torch gives (softmax over nothing weighs nothing)."""
    q, k, v = _qkv(rng, 2, 2, sq, sk, 8)
    out = hipsched.attention(q, k, v, causal=causal)
    assert out.shape == (2, 2, sq, 8)
    np.testing.assert_array_equal(out, _torch_ref(q, k, v, causal))


@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (2, 0, 5, 4), (1, 1, 5, 0)])
def test_empty_batch_heads_or_head_dim(shape):
    x = np.ones(shape, np.float32)
    out = hipsched.attention(x, x, x)
    assert out.shape == shape and out.dtype == np.float32


def test_nan_propagates_to_its_row_only(rng):
    q, k, v = _qkv(rng, 1, 2, 20, 30, 16)
    q[0, 1, 4, 3] = np.nan
    out = hipsched.attention(q, k, v)
    ref = _numpy_ref(q, k, v)
    assert np.isnan(out[0, 1, 4]).all()
    assert np.isnan(out).sum() == 16
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)  # NaNs compare equal to NaNs


def test_numpy_reference_agrees_with_torch(rng):
    """The NaN test's reference is itself checked on ordinary inputs, causal too."""
    q, k, v = _qkv(rng, 1, 2, 9, 12, 5)
    for causal in (False, True):
        np.testing.assert_allclose(_numpy_ref(q, k, v, causal), _torch_ref(q, k, v, causal), rtol=1e-12)


def test_inputs_are_converted_like_numpy(rng):
    """float64, non-contiguous and unaligned inputs give what their float32 contiguous copies give."""
    q, k, v = _qkv(rng, 1, 3, 12, 10, 8)
    want = A.attention(q, k, v, causal=True)
    q64 = q.astype(np.float64)
    kt = np.ascontiguousarray(np.swapaxes(k, 1, 2)).swapaxes(1, 2)  # same values, strided
    buf = np.empty(v.nbytes + 1, np.uint8)
    vu = np.frombuffer(buf[1:].data, dtype=np.float32).reshape(v.shape)  # unaligned
    vu[...] = v
    assert not kt.flags.c_contiguous and not vu.flags.aligned
    np.testing.assert_array_equal(hipsched.attention(q64, kt, vu, causal=True), want)


@pytest.mark.parametrize("q_shape,k_shape,v_shape", [
    ((1, 2, 5, 8), (1, 2, 5, 4), (1, 2, 5, 4)),     # head_dim differs
    ((1, 2, 5, 8), (1, 3, 5, 8), (1, 3, 5, 8)),     # heads differ
    ((2, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)),     # batch differs
    ((1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 6, 8)),     # k and v lengths differ
])
def test_mismatched_shapes_name_both(q_shape, k_shape, v_shape):
    with pytest.raises(ValueError, match=r"attention: shapes do not match: \w \(.*\) vs \w \(.*\)"):
        hipsched.attention(np.zeros(q_shape), np.zeros(k_shape), np.zeros(v_shape))


def test_bad_arguments():
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="'q' must be 4-d"):
        hipsched.attention(np.zeros((4, 4)), x, x)
    with pytest.raises(TypeError, match="'k' has dtype complex"):
        hipsched.attention(x, x.astype(np.complex64), x)
    with pytest.raises(ValueError, match="scale must be finite"):
        hipsched.attention(x, x, x, scale=float("inf"))
    for bad in ("yes", 2, None, "lower-right"):
        with pytest.raises(ValueError, match='causal must be one of False, True, "upper_left", "lower_right"'):
            hipsched.attention(x, x, x, causal=bad)
    with pytest.raises(TypeError, match="C-contiguous.*float32"):  # the extension guards its own inputs
        A.attention(x.astype(np.float64), x, x)
    with pytest.raises(TypeError, match="4-d"):
        A.attention(x[0], x[0], x[0])
    with pytest.raises(TypeError, match="one dtype"):
        A.attention(x, x.astype(np.float16), x)


def test_result_too_large_is_memory_error():
    """A broadcast view can stand for more memory than the machine has: MemoryError, not a crash."""
    q = np.broadcast_to(np.float32(1), (1 << 16, 1 << 16, 8, 64))
    k = np.zeros((1 << 16, 1 << 16, 0, 64), np.float32)  # empty: no memory behind it
    with pytest.raises(MemoryError):
        hipsched.attention(q, k, k)


def test_call_work_measures():
    q = np.zeros((2, 3, 5, 8), np.float32)
    k = np.zeros((2, 3, 7, 8), np.float32)
    call = OPS["attention"].prepare(q, k, k, causal=True)
    assert call.size == 2 * 3 * 5 * 7 * 8
    assert call.nbytes == 4 * (2 * q.size + 2 * k.size)
    assert call.params == {"causal": True, "scale": pytest.approx(1 / np.sqrt(8))}


@settings(max_examples=EXAMPLES, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), sq=st.integers(0, 40), sk=st.integers(0, 40),
       d=st.integers(1, 40), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_shapes_match_torch(b, h, sq, sk, d, causal, seed):
    q, k, v = _qkv(np.random.default_rng(seed), b, h, sq, sk, d)
    np.testing.assert_allclose(A.attention(q, k, v, causal=causal), _torch_ref(q, k, v, causal),
                               rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_cpu_attention.py): Causal attention: a key hidden from a query never reaches its output, even when that key's value row
# holds inf or NaN (its weight is 0, and 0 * inf must not turn the output NaN). Before, it depended on
# whether the key fell in the query strip's last key tile. Keys 33 and 47 fall inside AVX-512's 32-query
# strip [32, 64); at 8 lanes, in the strip [32, 48), one lane after its start and at its last lane.
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sq,bad_key,bad", [(40, 5, np.inf), (40, 17, np.nan), (200, 100, -np.inf), (70, 63, np.nan),
                                             (70, 33, np.inf), (100, 47, np.nan)])
def test_hidden_nonfinite_value_does_not_reach_earlier_queries(sq, bad_key, bad):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, sq, 9)).astype(np.float32) for _ in range(3))
    clean = hipsched.attention(q, k, v, causal=True)
    v[0, 1, bad_key, 3] = bad
    out = hipsched.attention(q, k, v, causal=True)
    np.testing.assert_array_equal(out[0, 1, :bad_key], clean[0, 1, :bad_key])
    np.testing.assert_array_equal(out[0, 0], clean[0, 0])
    assert not np.isfinite(out[0, 1, bad_key:, 3]).any()
    assert np.isfinite(np.delete(out[0, 1, bad_key:], 3, axis=-1)).all()


def test_scale_beyond_float32_is_refused():
    # finite as a Python float, inf as the kernels' float32: zero scores would become 0 * inf = NaN
    q = np.ones((1, 1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="scale"):
        hipsched.attention(q, q, q, scale=1e39)
    assert np.isfinite(hipsched.attention(q, q, q, scale=1e30)).all()


def test_spread_decay_beyond_float32_is_refused():
    g = (np.array([0, 1, 1]), np.array([1]), np.array([1.0], np.float32))
    seeds = np.array([0.5, 0.2], np.float32)
    with pytest.raises(ValueError, match="decay"):
        hipsched.spread_activation(g, seeds, decay=1e39)
    np.testing.assert_array_equal(hipsched.spread_activation(g, seeds, decay=1e38), [0.5, 1.0])


# ==================================================================================================
# Half precision (float16, bfloat16): formerly tests/cpu/test_cpu_half_attention.py
#
# attention with float16/bfloat16 q, k, v on the CPU kernel (rerun on the scalar path by
# test_simd_paths.py), against PyTorch's scaled_dot_product_attention in float64 on the same half values
# and PyTorch's in the same half dtype.
#
# Tolerances. Half values widen to float32 exactly and the kernel computes in float32 as for float32
# inputs, within 1e-5 (1 + |out|) of float64 (test_cpu_attention.py's bound: float32 dots and sums of a
# few hundred terms, an exp2 accurate to ~1.2e-7); the output is then rounded once to the half format,
# u |out| more (u = 2^-11 float16, 2^-8 bfloat16). PyTorch's half SDPA on the CPU rounds its output too
# and may round the probabilities P (each <= 1) to the format before the P V product, u sum_j p_j |v_j| <=
# u max|v|: the two differ by at most 2u |out| + u max|v| + 2e-5 (1 + |out|).


ml_dtypes = need("ml_dtypes")
BF16 = ml_dtypes.bfloat16
HALVES = [np.float16, BF16]
from half_formats import UNIT  # noqa: E402  (unit roundoff per type: 2^-11 float16, 2^-8 bfloat16)
F32 = 1e-5  # the float32 kernel's bound against float64, relative and absolute

SCALAR = os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar"


def _qkv_half(rng, dt, b, h, sq, sk, d):
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
    q, k, v = _qkv_half(rng, dt, b, h, sq, sk, d)
    out = hipsched.attention(q, k, v, causal=causal, backend="cpu")
    assert out.dtype == np.dtype(dt) and out.shape == (b, h, sq, d)
    ref = _ref64(q, k, v, causal)
    bound = UNIT[dt] * np.abs(ref) + F32 * (1 + np.abs(ref))
    assert np.all(np.abs(out.astype(np.float64) - ref) <= bound)


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("causal", [False, True])
def test_half_attention_against_torch_same_dtype(rng, dt, causal):
    q, k, v = _qkv_half(rng, dt, 1, 2, 150 if SCALAR else 300, 150 if SCALAR else 300, 64)
    ours = A.attention(q, k, v, causal).astype(np.float64)
    theirs = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=causal).float().numpy().astype(np.float64)
    ref = _ref64(q, k, v, causal)
    u = UNIT[dt]
    vmax = np.abs(v.astype(np.float64)).max()
    assert np.all(np.abs(ours - theirs) <= 2 * u * np.abs(ref) + u * vmax + 2 * F32 * (1 + np.abs(ref)))
    assert np.all(np.abs(ours - ref) <= u * np.abs(ref) + F32 * (1 + np.abs(ref)))


# bfloat16 scores of an even head_dim run on vdpbf16ps where cpu_features()["bf16_dot"] (the plain run on
# an AVX512_BF16 CPU; test_simd_paths.py reruns this file at HIPSCHED_CPU_FEATURES=avx512, without it)
BF16_DOT = hipsched.cpu_features()["bf16_dot"]


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("d", [24, 7])
def test_half_attention_is_the_float32_computation_rounded_once(rng, dt, d):
    """Half inputs widen exactly and take the float32 kernel's arithmetic: the output is the float32
    kernel's output on the widened values, rounded to the dtype as ml_dtypes/NumPy round it. Except
    bfloat16 on the bf16_dot path with an even head_dim: its scores are the same exact products summed
    in another order and scaled after the sum rather than before, so it is within the float32 kernel's
    bound of float64 (F32), one unit of the output's last place apart at most."""
    q, k, v = _qkv_half(rng, dt, 1, 3, 77, 140, d)
    out = A.attention(q, k, v)
    f32 = A.attention(*(x.astype(np.float32) for x in (q, k, v)))
    if dt is BF16 and BF16_DOT and d % 2 == 0:
        ref = _ref64(q, k, v)
        o64 = out.astype(np.float64)
        assert np.all(np.abs(o64 - ref) <= UNIT[dt] * np.abs(ref) + F32 * (1 + np.abs(ref)))
        assert np.all(np.abs(o64 - f32.astype(dt).astype(np.float64)) <= 2 * UNIT[dt] * np.abs(ref) + 2 * F32)
        assert not np.array_equal(out.view(np.uint16), f32.astype(dt).view(np.uint16))  # the dot path did run
    else:
        np.testing.assert_array_equal(out.view(np.uint16), f32.astype(dt).view(np.uint16))


def test_bf16_attention_scores_flush_denormals_on_avx512_bf16():
    """vdpbf16ps reads bfloat16 denormals as zero (and flushes denormal sums): a key whose only
    nonzero element is a denormal scores exactly 0 against any query on the bf16_dot path, so with two
    keys the weights are exactly 1/2 each and the output, V's two rows' mean, is 0. The widening path
    (and float64) scores it 2^-127 * 2^127 / sqrt(2): weights about 2/3 and 1/3. Two (equal) queries: a
    single one takes the decode path, which widens K (its scores are lanes along head_dim)."""
    den = np.array([0x0040], np.uint16).view(BF16)[0]   # 2^-127
    q = np.zeros((1, 1, 2, 2), BF16)
    q[..., 0] = BF16(2.0 ** 127)
    k = np.zeros((1, 1, 2, 2), BF16)
    k[0, 0, 0, 0] = den
    v = np.zeros((1, 1, 2, 2), BF16)
    v[0, 0, 0, :] = BF16(2.0 ** 40)
    v[0, 0, 1, :] = BF16(-(2.0 ** 40))
    out = A.attention(q, k, v).astype(np.float64)
    ref = _ref64(q, k, v)  # float64 keeps the denormal
    if BF16_DOT:
        np.testing.assert_array_equal(out, 0.0)   # weights 1/2, 1/2
    else:
        assert np.all(out > 0) and np.all(np.abs(out - ref) <= UNIT[BF16] * np.abs(ref) + F32 * (1 + np.abs(ref)))


@pytest.mark.parametrize("dt", HALVES)
def test_half_attention_nan_and_empty_keys(rng, dt):
    q, k, v = _qkv_half(rng, dt, 1, 1, 4, 6, 8)
    q[0, 0, 1, 2] = np.nan
    out = A.attention(q, k, v).astype(np.float32)
    assert np.isnan(out[0, 0, 1]).all() and np.isfinite(out[0, 0, [0, 2, 3]]).all()
    empty = A.attention(q, k[:, :, :0], v[:, :, :0])
    assert empty.dtype == np.dtype(dt) and np.all(empty.astype(np.float32) == 0)


def test_mixed_dtypes_promote_to_float32(rng):
    q, k, v = _qkv_half(rng, np.float16, 1, 1, 8, 8, 8)
    call = OPS["attention"].prepare(q, k.astype(BF16), v)
    assert call.dtype == "float32" and all(a.dtype == np.float32 for a in call.args)
    out = hipsched.attention(q, k.astype(BF16), v)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, A.attention(q.astype(np.float32), k.astype(BF16).astype(np.float32),
                                                   v.astype(np.float32)))
    call = OPS["attention"].prepare(q, k, v)
    assert call.dtype == "float16" and call.nbytes == 2 * (2 * 64 + 2 * 64)
    assert "bfloat16" in OPS["attention"].cpu_dtypes and "bfloat16" in OPS["attention"].gpu_dtypes


# ------------------------------------------------- grouped-query heads, causal alignment and kv_len
def _sdpa_masked(q, k, v, causal, kv_len):
    """torch SDPA in float64 with K and V repeated to q's heads (repeat_interleave) and the explicit boolean
    mask of causal and kv_len; a row that sees no key (NaN in torch) is zeros, hipsched's rule."""
    g = q.shape[1] // k.shape[1]
    Q = torch.from_numpy(q.astype(np.float64))
    K, V = (torch.from_numpy(a.astype(np.float64)).repeat_interleave(g, dim=1) for a in (k, v))
    b, _, sq, _ = q.shape
    sk = k.shape[2]
    lens = np.full(b, sk) if kv_len is None else np.asarray(kv_len)
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    vis = np.stack([(j < n) & ((j <= i) if causal in (True, "upper_left") else
                               (j <= i + n - sq) if causal == "lower_right" else True) for n in lens])[:, None]
    vis = np.broadcast_to(vis, (b, 1, sq, sk))
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=torch.from_numpy(np.array(vis))).numpy()
    return np.where(vis.any(-1)[..., None], out, 0.0)


GQA_SHAPES = [(2, 8, 2, 1, 3000, 64), (1, 4, 4, 1, 70, 20), (2, 6, 3, 5, 40, 33), (1, 4, 1, 70, 130, 16),
              (2, 4, 2, 50, 20, 8), (1, 64, 8, 1, 300, 128)]


@pytest.mark.parametrize("dt", [np.float32, np.float16, "bfloat16"], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", GQA_SHAPES, ids=[f"b{s[0]}h{s[1]}kv{s[2]}q{s[3]}k{s[4]}d{s[5]}" for s in GQA_SHAPES])
def test_grouped_heads_causal_modes_and_kv_len_against_torch(rng, dt, shape):
    """Every causal mode with and without kv_len (entries 0 .. seq_k: an empty row, rows shorter than
    the queries under lower_right) on grouped heads, the decode path (seq_q 1, over one and several
    1024-key chunks) and the tiled one, through the Executor on the CPU."""
    if dt == "bfloat16":
        dt = need("ml_dtypes", reason="bfloat16 arrays come from ml_dtypes (test extra)").bfloat16
    b, hq, hkv, sq, sk, d = shape
    q = rng.standard_normal((b, hq, sq, d)).astype(dt)
    k, v = (rng.standard_normal((b, hkv, sk, d)).astype(dt) for _ in range(2))
    for causal in (False, True, "upper_left", "lower_right"):
        for kv_len in (None, rng.integers(0, sk + 1, b)):
            out = hipsched.attention(q, k, v, causal=causal, kv_len=kv_len, backend="cpu")
            assert out.dtype == q.dtype and out.shape == q.shape
            ref = _sdpa_masked(q, k, v, causal, kv_len)
            u = 0.0 if dt == np.float32 else (2.0 ** -11 if dt == np.float16 else 2.0 ** -8)
            bound = u * np.abs(ref) + 2e-5 * (1 + np.abs(ref))
            assert np.all(np.abs(out.astype(np.float64) - ref) <= bound), (shape, causal, kv_len)


def test_true_is_upper_left_and_lower_right_is_a_cache():
    """True and "upper_left" are one mode; lower_right with seq_q == seq_k is top-left too; a single query
    under lower_right sees the whole cache (upper_left: key 0 only, torch's is_causal)."""
    r = np.random.default_rng(5)
    q, k, v = (r.standard_normal((1, 2, n, 16)).astype(np.float32) for n in (9, 9, 9))
    a = hipsched.attention(q, k, v, causal=True)
    np.testing.assert_array_equal(a, hipsched.attention(q, k, v, causal="upper_left"))
    np.testing.assert_array_equal(a, hipsched.attention(q, k, v, causal="lower_right"))
    one = q[:, :, -1:]
    np.testing.assert_allclose(hipsched.attention(one, k, v, causal="lower_right"), hipsched.attention(one, k, v),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hipsched.attention(one, k, v, causal=True)[0, :, 0], v[0, :, 0], rtol=1e-6)


def test_kv_len_ignores_keys_past_it_and_zero_gives_zeros():
    """Keys at or past kv_len[b] never matter (NaN there included); a row with kv_len 0 is zeros."""
    r = np.random.default_rng(6)
    q = r.standard_normal((2, 4, 3, 32)).astype(np.float32)
    k, v = (r.standard_normal((2, 2, 50, 32)).astype(np.float32) for _ in range(2))
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 20:] = np.nan
    v2[0, :, 20:] = np.inf
    lens = np.array([20, 0])
    for causal in (False, "lower_right"):
        got = hipsched.attention(q, k2, v2, causal=causal, kv_len=lens)
        np.testing.assert_array_equal(got[1], 0.0)
        np.testing.assert_allclose(got[0], hipsched.attention(q[:1], k[:1, :, :20], v[:1, :, :20], causal=causal)[0],
                                   rtol=1e-6, atol=1e-7)


def test_grouped_heads_kv_len_and_causal_are_validated():
    x = np.zeros((2, 4, 3, 8), np.float32)
    kv = np.zeros((2, 3, 5, 8), np.float32)
    with pytest.raises(ValueError, match=r"q's heads \(4\) must be a multiple of k's and v's \(3\)"):
        hipsched.attention(x, kv, kv)
    kv = np.zeros((2, 2, 5, 8), np.float32)
    with pytest.raises(ValueError, match=r"kv_len entries must be within \[0, seq_k\] = \[0, 5\]"):
        hipsched.attention(x, kv, kv, kv_len=[6, 1])
    with pytest.raises(ValueError, match=r"kv_len entries must be within"):
        hipsched.attention(x, kv, kv, kv_len=[-1, 1])
    with pytest.raises(ValueError, match=r"kv_len must have shape \(batch,\) = \(2,\)"):
        hipsched.attention(x, kv, kv, kv_len=[1, 2, 3])
    with pytest.raises(TypeError, match="kv_len must be an integer array"):
        hipsched.attention(x, kv, kv, kv_len=np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="kv_len must be an integer array"):
        hipsched.attention(x, kv, kv, kv_len=np.array([True, False]))
    with pytest.raises(ValueError, match='causal must be one of False, True, "upper_left", "lower_right"'):
        hipsched.attention(x, kv, kv, causal="bottom_right")


def test_split_parts_are_whole_groups_and_rejoin_bit_for_bit():
    """The spec's split (what the Executor hands to CPU and GPU parts) cuts at (batch, KV head) slabs,
    each with its whole group of query heads and its kv_len: the parts rejoin to the whole call's bits."""
    from hipsched.cpu._attention import attention_call
    r = np.random.default_rng(7)
    q = r.standard_normal((3, 8, 5, 16)).astype(np.float32)
    k = r.standard_normal((3, 2, 29, 16)).astype(np.float32)
    for kv_len in (None, np.array([29, 7, 0])):
        call = OPS["attention"].prepare(q, k, k, causal="lower_right", kv_len=kv_len)
        n, part, join = OPS["attention"].split(call)
        assert n == 6
        whole = attention_call(*call.args, **call.params)
        parts = [attention_call(*part(lo, min(lo + 4, n)), **call.params) for lo in range(0, n, 4)]
        np.testing.assert_array_equal(join(parts), whole)
