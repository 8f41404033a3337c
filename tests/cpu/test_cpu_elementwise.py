"""add, scale, softmax on the CPU kernels against NumPy / SciPy / torch (rerun on the scalar path by
test_simd_paths.py). Tolerances: add and scale are single float32 operations, so results must equal
NumPy's bit for bit; softmax agrees with a float64 SciPy reference to rtol 1e-5 (vector exp <= 2 ulp,
float32 sum), and the vector exp itself is checked in ulp."""
import os

import numpy as np
import pytest
from requires import need

need("scipy.special", reason="SciPy's softmax is the reference (test extra)")
import scipy.special  # noqa: E402
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import hipsched
from hipsched.cpu import _elementwise as E
from hipsched.cpu import _norm as N

from half_formats import (BF16, F32_U, HALVES, all_patterns, assert_same_halves, from_torch, half_ulp, ml_dtypes,
                          npdt, random_half, rounded, to_torch, torch)

# the scalar-path rerun (test_simd_paths.py) only has to show the portable kernels agree: fewer examples
EXAMPLES = 15 if os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar" else 60

SIZES = [0, 1, 7, 8, 9, 31, 33, 1000, 300_001]  # the last crosses the two-thread grain


LEVELS = ["scalar", "avx2", "avx512"]


def test_simd_level_is_what_the_environment_asks():
    # a level asked for runs if the CPU has it, else the highest one it has; no request: the highest
    feats = hipsched.cpu_features()
    asked = {"none": "scalar"}.get(os.environ.get("HIPSCHED_CPU_FEATURES"), os.environ.get("HIPSCHED_CPU_FEATURES"))
    assert feats["requested"] == (asked if asked in LEVELS else "auto")
    detected = LEVELS.index(feats["detected"])
    expect = min(LEVELS.index(asked), detected) if asked in LEVELS else detected
    assert feats["simd"] == LEVELS[expect]


@pytest.mark.parametrize("n", SIZES)
def test_add_and_scale_equal_numpy(rng, n):
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(E.add(a, b), a + b)
    np.testing.assert_array_equal(E.scale(a, 1.7), a * np.float32(1.7))


@pytest.mark.parametrize("shape_a,shape_b", [((5, 7), (7,)), ((3, 4, 9), (4, 9)), ((3, 4, 9), (9,)), ((4,), ()),
                                             ((2, 3), ()), ((), ()), ((1000, 33), (33,)), ((0, 8), (8,)), ((20_001, 67), (67,)), ((300_001,), ())])
def test_bias_add_equals_numpy_broadcast(rng, shape_a, shape_b):
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = np.asarray(rng.standard_normal(shape_b), dtype=np.float32)
    out = E.add(a, b)
    assert out.shape == a.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, a + b)


def test_nan_inf_propagate_like_numpy():
    a = np.array([np.nan, np.inf, -np.inf, 1.0, np.inf, 0.0, -0.0, 3e38, 1e-45], np.float32)
    b = np.array([1.0, -np.inf, -np.inf, np.nan, 1.0, -0.0, -0.0, 3e38, 1e-45], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(E.add(a, b), a + b)
    for alpha in (np.nan, np.inf, -np.inf, 0.0, -1.0, 1e40, 1e-50):
        with np.errstate(all="ignore"):
            want = a * np.float32(alpha)
        np.testing.assert_array_equal(E.scale(a, alpha), want)


def _softmax_ref(x, axis):
    return scipy.special.softmax(x.astype(np.float64), axis=axis)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 31, 33, 1000])
def test_softmax_rows_match_scipy(rng, n):
    x = (rng.standard_normal((5, n)) * 10).astype(np.float32)
    out = E.softmax(x, -1)
    np.testing.assert_allclose(out, _softmax_ref(x, -1), rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("shape,axis", [((300, 4097), -1), ((9, 33), 0), ((7, 5, 300), 1), ((4, 1000, 3), 1), ((3, 8, 257), 0),
                                        ((2, 3, 4, 5), -3), ((33,), 0), ((600, 70), -1)])
def test_softmax_any_axis_matches_scipy(rng, shape, axis):
    x = (rng.standard_normal(shape) * 5).astype(np.float32)
    np.testing.assert_allclose(E.softmax(x, axis), _softmax_ref(x, axis), rtol=1e-5, atol=1e-30)


def test_softmax_matches_torch(rng):
    torch = need("torch")
    x = (rng.standard_normal((64, 517)) * 4).astype(np.float32)
    np.testing.assert_allclose(hipsched.softmax(x), torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_nan_inf_follow_scipys_formula(axis):
    rows = [[1.0, np.nan, 2.0, 0.5], [1.0, np.inf, 2.0, 0.5], [-np.inf] * 4, [1.0, -np.inf, 2.0, -np.inf],
            [np.inf, np.inf, 1.0, 1.0], [3e38, -3e38, 0.0, 1.0], [-1e30, -1e30, -1e30, -1e30], [0.0, -100.0, -90.0, 0.0]]
    x = np.array(rows, np.float32)
    x = x if axis == -1 else np.ascontiguousarray(x.T)
    with np.errstate(all="ignore"):
        want = scipy.special.softmax(x.astype(np.float64), axis=axis)
    np.testing.assert_allclose(E.softmax(x, axis), want, rtol=1e-5, atol=1e-30, equal_nan=True)


def test_vector_exp_within_two_ulp():
    x = np.linspace(-87.3, 88.72, 400_003, dtype=np.float32)
    ref = np.exp(x.astype(np.float64))
    got = E.exp(x).astype(np.float64)
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - ref) / ulp) <= 2.0
    edge = np.array([np.nan, np.inf, -np.inf, -200.0, 200.0, 0.0], np.float32)
    np.testing.assert_array_equal(E.exp(edge), [np.nan, np.inf, 0.0, 0.0, np.inf, 1.0])


finite = st.floats(-1e4, 1e4, width=32)
edge_values = st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 1.0])


@settings(max_examples=EXAMPLES, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=40),
                  elements=st.one_of(finite, edge_values)), st.integers(-3, 2))
def test_add_scale_properties(x, shift):
    tail = x.shape[max(0, len(x.shape) + min(shift, 0)):] if shift < 0 else x.shape
    b = np.linspace(-2, 2, int(np.prod(tail)), dtype=np.float32).reshape(tail)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(hipsched.add(x, b), x + b)
        np.testing.assert_array_equal(hipsched.scale(x, -0.3), x * np.float32(-0.3))


@settings(max_examples=EXAMPLES, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=40), elements=finite),
       st.data())
def test_softmax_properties(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    out = hipsched.softmax(x, axis=axis)
    np.testing.assert_allclose(out, _softmax_ref(x, axis), rtol=1e-5, atol=1e-30)
    assert np.all(out >= 0)


def test_public_api_routes_to_the_cpu_kernels(rng):
    a = rng.standard_normal((6, 10)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    ex = hipsched.Executor()
    for api in (ex, hipsched):
        np.testing.assert_array_equal(api.add(a, b, backend="cpu"), a + b)
        np.testing.assert_array_equal(api.scale(a, 3, backend="cpu"), a * np.float32(3))
        np.testing.assert_allclose(api.softmax(a, axis=0, backend="cpu"), _softmax_ref(a, 0), rtol=1e-5)


def test_extension_refuses_arrays_its_kernels_cannot_read_safely():
    with pytest.raises(TypeError):
        E.add(np.ones(4), np.ones(4))  # float64
    with pytest.raises(TypeError):
        E.scale([1.0, 2.0], 2.0)  # not an array
    with pytest.raises(TypeError):
        E.softmax(np.ones((4, 4), np.float32)[:, ::2])  # not C-contiguous
    with pytest.raises(ValueError):
        E.add(np.ones(4, np.float32), np.ones(3, np.float32))
    with pytest.raises(ValueError):
        E.softmax(np.ones(4, np.float32), 1)


def test_half_calls_carry_their_dtype_and_bytes():
    """Half inputs stay half (values and kernels: the half section below); the Call the scheduler keys
    and costs by names the dtype and counts 2-byte elements. The GPU side takes float32 only."""
    ml_dtypes = need("ml_dtypes")
    from hipsched.ops import OPS
    for dt in (np.float16, ml_dtypes.bfloat16):
        x = np.ones((4, 8), dt)
        name = np.dtype(dt).name
        for op, args, nbytes in (("add", (x, x), 2 * 3 * 32), ("add", (x, x[0]), 2 * (2 * 32 + 8)),
                                 ("scale", (x, 2.0), 2 * 2 * 32), ("softmax", (x,), 2 * 2 * 32)):
            call = OPS[op].prepare(*args)
            assert (call.dtype, call.nbytes, call.size) == (name, nbytes, 32)
            assert call.args[0].dtype == dt
            assert name in OPS[op].cpu_dtypes and name in OPS[op].gpu_dtypes
    assert OPS["add"].prepare(np.ones(3, np.float16), np.ones(3, np.float32)).dtype == "float32"


# ==================================================================================================
# Half precision (float16, bfloat16): formerly tests/cpu/test_cpu_half.py, less its rms_norm tests (now in
# test_cpu_norm.py's half section); the format helpers are tests/support/half_formats.py
#
# add, scale, softmax and rms_norm in float16 and bfloat16 on the CPU kernels (rerun on the scalar path by
# test_simd_paths.py, like every test_cpu_*.py), against PyTorch CPU in the same dtype, ml_dtypes/NumPy
# conversions and a float64 reference.
#
# The kernels compute in float32 and round to the half type once, at the store. So:
# - add and scale are one float32 operation on exactly widened inputs, then one rounding: the result must be
#   (a.astype(float32) + b.astype(float32)).astype(half) bit for bit (NaNs compared as NaN: simd.h's float16
#   conversion quiets NaN payloads, as F16C does), which is also what NumPy float16, ml_dtypes and PyTorch
#   give (checked here too).
# - softmax and rms_norm carry float32 (softmax) or float64 (rms_norm) error before that rounding. Each bound
#   below is "half a unit in the last place of the half format at the value" (the rounding at the store;
#   relative 2^-11 for float16, 2^-8 for bfloat16 for normal values, absolute 2^-25 in float16's subnormal
#   range) plus the float32 terms stated where they are used.


HALF_EXAMPLES = 15 if os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar" else 50

HALF_SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 300_001]  # lanes, tails, and past the two-thread grain


# ---------------------------------------------------------------- add and scale: one rounding, bit identity

@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("n", HALF_SIZES)
def test_add_and_scale_round_once_from_float32(rng, name, n):
    a, b = random_half(rng, n, name, 50), random_half(rng, n, name, 3)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    assert_same_halves(E.add(a, b), rounded(a32 + b32, name))
    assert_same_halves(E.scale(a, 0.3), rounded(a32 * np.float32(0.3), name))
    # the same values NumPy (float16) / ml_dtypes (bfloat16) and PyTorch compute in the same dtype
    assert_same_halves(E.add(a, b), a + b)
    assert_same_halves(E.add(a, b), from_torch(to_torch(a) + to_torch(b), name))
    assert_same_halves(E.scale(a, 0.3), from_torch(to_torch(a) * 0.3, name))


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("offset", [0, 3])  # 3: every 8-lane block shifts and the last 5 take the scalar tail
def test_scale_and_add_over_all_half_patterns(name, offset):
    x = all_patterns(name)[offset:].copy()
    x32 = x.astype(np.float32)
    with np.errstate(all="ignore"):
        for alpha in (0.3, -1.7, 3.0, 1e4, 1e-3, 0.0, np.inf, np.nan):
            assert_same_halves(E.scale(x, alpha), rounded(x32 * np.float32(alpha), name))
        y = np.roll(x, 12345)  # every pattern meets an unrelated one, NaN/inf/subnormals included
        assert_same_halves(E.add(x, y), rounded(x32 + y.astype(np.float32), name))


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("shape_a,shape_b", [((5, 7), (7,)), ((3, 4, 9), (4, 9)), ((2, 3), ()), ((), ()),
                                             ((1000, 33), (33,)), ((0, 8), (8,)), ((20_001, 17), (17,)),
                                             ((300_001,), ())])
def test_bias_and_scalar_add(rng, name, shape_a, shape_b):
    a, b = random_half(rng, shape_a, name, 10), random_half(rng, shape_b, name)
    out = E.add(a, b)
    assert out.shape == a.shape
    assert_same_halves(out, rounded(a.astype(np.float32) + b.astype(np.float32), name))


@pytest.mark.parametrize("name", HALVES)
def test_overflow_nan_and_inf_follow_the_format(name):
    big = float(ml_dtypes.finfo(npdt(name)).max)  # 65504 for float16, ~3.39e38 for bfloat16
    x = np.array([big, -big, np.inf, -np.inf, np.nan, 1.0, 0.0, -0.0, big / 2], npdt(name))
    with np.errstate(all="ignore"):
        s = E.scale(x, 2.0)
        a = E.add(x, x)
    want = np.array([np.inf, -np.inf, np.inf, -np.inf, np.nan, 2.0, 0.0, -0.0, big], np.float64)
    for got in (s, a):
        assert got.dtype == npdt(name)
        np.testing.assert_array_equal(got.astype(np.float64), want)
        assert np.signbit(got[7].astype(np.float32))
    # inf - inf is NaN; a result rounding past the format's max (not only past float32's) becomes inf
    assert np.isnan(E.add(x[2:3], x[3:4]).astype(np.float32)).all()
    if name == "float16":
        assert E.scale(np.array([60000.0], np.float16), 1.1)[0] == np.inf  # 66000 > 65504
        assert E.scale(np.array([65504.0], np.float16), 1.0004)[0] == np.inf  # 65530 rounds up past 65504
        assert E.scale(np.array([65504.0], np.float16), 1.0002)[0] == 65504  # 65517 rounds down


# ---------------------------------------------------------------- softmax

def softmax64(x, axis):
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def softmax_bound(x, axis, ref, name):
    """|ours - float64| <= half_ulp(|ref| (1 + r)) + r |ref|, r the relative float32 error before the
    store: the vector exp's 2 ulp, the sum of `len` positive terms ((len - 1) u at most), 1/sum and the
    product (1 u each), and x - max rounded in float32 (|x - max| u absolute in the exponent); plus
    2^-126 absolute: the vector exp gives 0 below float32's least normal (x - max < -87.3), and the sum
    it is divided by is >= 1 (it holds exp(0))."""
    x32 = x.astype(np.float32)
    length = x.shape[axis]
    with np.errstate(all="ignore"):
        spread = np.abs(x32 - x32.max(axis=axis, keepdims=True)).astype(np.float64)
    # an infinite x - max is exp(-inf) = 0 exactly (NaN slices are checked apart)
    spread = np.where(np.isfinite(spread), spread, 0.0)
    r = F32_U * (length + 3 + spread)
    return half_ulp(ref * (1 + r), name) + r * ref + 2.0 ** -126


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4096, 4097, 9000])  # 4097+: heap buffer
def test_softmax_rows_vs_float64_and_torch(rng, name, n):
    x = random_half(rng, (6, n), name, 4)
    out = E.softmax(x, -1)
    assert out.dtype == npdt(name)
    ref = softmax64(x, -1)
    bound = softmax_bound(x, -1, ref, name)
    err = np.abs(out.astype(np.float64) - ref)
    assert (err <= bound).all(), f"worst excess {np.max(err - bound)}"
    # torch rounds its float32 result once too: each is within `bound` of ref, so within 2 bound of each other
    t = from_torch(torch.softmax(to_torch(x), -1), name).astype(np.float64)
    assert (np.abs(out.astype(np.float64) - t) <= 2 * bound).all()


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("shape,axis", [((9, 33), 0), ((7, 5, 300), 1), ((4, 100, 3), 1), ((3, 8, 257), 0),
                                        ((2, 3, 4, 5), -3), ((33,), 0), ((1, 1), 0), ((600, 70), 0)])
def test_softmax_any_axis_vs_float64_and_torch(rng, name, shape, axis):
    x = random_half(rng, shape, name, 4)
    out = E.softmax(x, axis)
    ref = softmax64(x, axis)
    bound = softmax_bound(x, axis, ref, name)
    assert (np.abs(out.astype(np.float64) - ref) <= bound).all()
    t = from_torch(torch.softmax(to_torch(x), axis), name).astype(np.float64)
    assert (np.abs(out.astype(np.float64) - t) <= 2 * bound).all()


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_nan_inf_in_half(name, axis):
    big = float(ml_dtypes.finfo(npdt(name)).max)
    rows = [[1.0, np.nan, 2.0, 0.5], [1.0, np.inf, 2.0, 0.5], [-np.inf] * 4, [1.0, -np.inf, 2.0, -np.inf],
            [big, -big, 0.0, 1.0], [0.0, -100.0, -90.0, 0.0], [big, big, big, big]]
    x = np.array(rows, npdt(name))
    x = x if axis == -1 else np.ascontiguousarray(x.T)
    out = E.softmax(x, axis)
    ref = softmax64(x, axis)  # NaN where the formula gives NaN
    np.testing.assert_array_equal(np.isnan(out.astype(np.float64)), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert (np.abs(out.astype(np.float64)[ok] - ref[ok]) <= softmax_bound(x, axis, ref, name)[ok]).all()


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("shape", [(0,), (0, 8), (3, 0), (2, 0, 5)])
def test_empty_inputs_give_empty_results_in_their_dtype(name, shape):
    x = np.ones(shape, npdt(name))
    for out in (E.add(x, x), E.scale(x, 2.0), E.softmax(x, -1), E.softmax(x, 0),
                N.rms_norm(x, np.ones(shape[-1], npdt(name)), 1e-6)):
        assert out.shape == shape and out.dtype == npdt(name)


# ---------------------------------------------------------------- through the ops layer

@pytest.mark.parametrize("name", HALVES)
def test_public_api_keeps_the_input_dtype(rng, name):
    x, w = random_half(rng, (6, 40), name), random_half(rng, 40, name)
    dt = npdt(name)
    for api in (hipsched, hipsched.Executor()):
        assert api.add(x, x).dtype == dt
        assert api.add(x, w).dtype == dt
        assert api.add(x, 1.5).dtype == dt  # a Python scalar takes x's dtype, as in NumPy
        assert api.scale(x, 0.5).dtype == dt
        assert api.softmax(x, axis=0).dtype == dt
        assert api.rms_norm(x, w).dtype == dt
    assert_same_halves(hipsched.add(x, 1.5), rounded(x.astype(np.float32) + np.float32(1.5), name))
    assert_same_halves(hipsched.scale(x, 0.1), rounded(x.astype(np.float32) * np.float32(0.1), name))
    assert_same_halves(hipsched.softmax(x), E.softmax(x))
    assert_same_halves(hipsched.rms_norm(x, w), N.rms_norm(x, w, 1e-6))


def test_mixed_dtypes_promote_to_float32(rng):
    """NumPy and PyTorch promote every mix of float16, bfloat16 and float32 to float32."""
    h = random_half(rng, (4, 24), "float16")
    b = random_half(rng, (4, 24), "bfloat16")
    f = rng.standard_normal((4, 24)).astype(np.float32)
    for p, q in ((h, b), (h, f), (b, f), (b, h)):
        got = hipsched.add(p, q)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, p.astype(np.float32) + q.astype(np.float32))
        assert (to_torch(p) + to_torch(q)).dtype == torch.float32  # the rule followed
    got = hipsched.rms_norm(h, b[0])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, hipsched.rms_norm(h.astype(np.float32), b[0].astype(np.float32)))
    # float64 and integers still convert to float32 whatever they meet
    assert hipsched.add(h, h.astype(np.float64)).dtype == np.float32
    assert hipsched.scale(np.arange(5), 2.0).dtype == np.float32


@pytest.mark.parametrize("bad", [np.ones((2, 3), np.complex64), np.array([[object(), 1, 2]] * 2)])
def test_unsupported_dtypes_name_op_argument_and_dtypes(rng, bad):
    h = random_half(rng, (2, 3), "float16")
    for op, arg, call in [("add", "'b'", lambda: hipsched.add(h, bad)), ("add", "'a'", lambda: hipsched.add(bad, h)),
                          ("scale", "'x'", lambda: hipsched.scale(bad, 2.0)),
                          ("softmax", "'x'", lambda: hipsched.softmax(bad)),
                          ("rms_norm", "'weight'", lambda: hipsched.rms_norm(h, bad[0])),
                          ("rms_norm", "'x'", lambda: hipsched.rms_norm(bad, h[0]))]:
        with pytest.raises(TypeError) as e:
            call()
        msg = str(e.value)
        assert op in msg and arg in msg and "float16" in msg and "bfloat16" in msg, msg


def test_extension_refuses_mixed_or_unreadable_halves():
    h = np.ones(8, np.float16)
    with pytest.raises(TypeError, match="one dtype"):
        E.add(h, h.astype(BF16))
    with pytest.raises(TypeError, match="one dtype"):
        N.rms_norm(h.reshape(2, 4), np.ones(4, np.float32))
    with pytest.raises(TypeError):
        E.scale(h.astype(">f2"), 2.0)  # byte-swapped: not native halves
    with pytest.raises(TypeError):
        E.softmax(np.ones((4, 4), BF16)[:, ::2])  # not C-contiguous


# ---------------------------------------------------------------- properties

half_names = st.sampled_from(HALVES)


@settings(max_examples=HALF_EXAMPLES, deadline=None)
@given(half_names, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=40), st.data())
def test_add_scale_bit_identity_on_any_patterns(name, shape, data):
    """Any 16-bit patterns (NaN, inf, subnormals included), any shape: one float32 op, one rounding."""
    pa = data.draw(hnp.arrays(np.uint16, shape))
    pb = data.draw(hnp.arrays(np.uint16, shape))
    alpha = data.draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
    a, b = pa.view(npdt(name)), pb.view(npdt(name))
    with np.errstate(all="ignore"):
        assert_same_halves(E.add(a, b), rounded(a.astype(np.float32) + b.astype(np.float32), name))
        assert_same_halves(E.scale(a, alpha), rounded(a.astype(np.float32) * np.float32(alpha), name))


@settings(max_examples=HALF_EXAMPLES, deadline=None)
@given(half_names, hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=40),
                              elements=st.floats(-60, 60, width=32)), st.data())
def test_softmax_properties_in_half(name, x32, data):
    """Within the stated float64 bound, in [0, 1], and each slice sums to 1 within len half_ulp(1) + the
    float32 terms (every element carries its own rounding)."""
    x = x32.astype(npdt(name))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    out = hipsched.softmax(x, axis=axis)
    assert out.dtype == npdt(name)
    o = out.astype(np.float64)
    ref = softmax64(x, axis)
    bound = softmax_bound(x, axis, ref, name)
    assert (np.abs(o - ref) <= bound).all()
    assert (o >= 0).all() and (o <= 1).all()
    np.testing.assert_array_less(np.abs(o.sum(axis=axis) - 1), bound.sum(axis=axis) + 1e-12)
