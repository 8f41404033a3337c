"""add, scale, softmax and rms_norm in float16 and bfloat16 on the CPU kernels (rerun on the scalar path by
test_simd_paths.py, like every test_cpu_*.py), against PyTorch CPU in the same dtype, ml_dtypes/NumPy
conversions and a float64 reference.

The kernels compute in float32 and round to the half type once, at the store. So:
- add and scale are one float32 operation on exactly widened inputs, then one rounding: the result must be
  (a.astype(float32) + b.astype(float32)).astype(half) bit for bit (NaNs compared as NaN: simd.h's float16
  conversion quiets NaN payloads, as F16C does), which is also what NumPy float16, ml_dtypes and PyTorch
  give (checked here too).
- softmax and rms_norm carry float32 (softmax) or float64 (rms_norm) error before that rounding. Each bound
  below is "half a unit in the last place of the half format at the value" (the rounding at the store;
  relative 2^-11 for float16, 2^-8 for bfloat16 for normal values, absolute 2^-25 in float16's subnormal
  range) plus the float32 terms stated where they are used.
"""
import os

import numpy as np
import pytest
from requires import need
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

ml_dtypes = need("ml_dtypes", reason="bfloat16 arrays come from ml_dtypes (test extra)")
torch = need("torch", reason="PyTorch CPU is the same-dtype reference (test extra)")

import hipsched  # noqa: E402
from hipsched.cpu import _elementwise as E  # noqa: E402
from hipsched.cpu import _norm as N  # noqa: E402

BF16 = ml_dtypes.bfloat16
EXAMPLES = 15 if os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar" else 50

# name: (NumPy dtype, torch dtype, precision p in bits with the implicit one, least normal exponent)
FORMATS = {"float16": (np.dtype(np.float16), torch.float16, 11, -14),
           "bfloat16": (np.dtype(BF16), torch.bfloat16, 8, -126)}
HALVES = list(FORMATS)
F32_U = 2.0 ** -24  # float32 unit roundoff

SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 300_001]  # lanes, tails, and past the two-thread grain


def npdt(name):
    return FORMATS[name][0]


def half_ulp(v, name):
    """Half a unit in the last place of format `name` at |v| (float64 array): the most the one rounding
    at the store moves a value, subnormals included (their ulp is that of the least normal binade)."""
    _, _, p, emin = FORMATS[name]
    v = np.abs(np.asarray(v, np.float64))
    _, e = np.frexp(v)  # v = m * 2^e, m in [0.5, 1): the binade's exponent is e - 1
    return 0.5 * np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))


def to_torch(x):
    if x.dtype == np.float16 or x.dtype == np.float32:
        return torch.from_numpy(np.ascontiguousarray(x))
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)


def from_torch(t, name):
    return t.view(torch.int16).numpy().view(npdt(name)) if name == "bfloat16" else t.numpy()


def bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def assert_same_halves(got, want):
    """Equal bit patterns, NaN for NaN (payloads aside); dtypes equal."""
    assert got.dtype == want.dtype and got.shape == want.shape
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(bits(got)[~gn], bits(want)[~wn])


def rounded(x32, name):
    return np.asarray(x32, np.float32).astype(npdt(name))


def all_patterns(name):
    return np.arange(1 << 16, dtype=np.uint16).view(npdt(name))


def random_half(rng, shape, name, scale=1.0):
    return np.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(npdt(name))


# ---------------------------------------------------------------- add and scale: one rounding, bit identity

@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("n", SIZES)
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


# ---------------------------------------------------------------- rms_norm

def rms64(x, w, eps):
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def rms_bound(ref, name):
    """The kernel forms each result in float64, rounds it to float32 (half a float32 ulp: 2^-24 relative)
    and then to the half type at the store: half_ulp(|ref| (1 + 2^-24)) + 2^-24 |ref|, with 1e-6 of
    relative slack for float64's own rounding of the sum of squares and the square root."""
    a = np.abs(ref)
    return (half_ulp(a * (1 + F32_U), name) + F32_U * a) * (1 + 1e-6)


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (13,), (31,), (33,), (3, 5), (4, 33), (2, 3, 64),
                                   (5, 1000), (300, 4096), (2, 70001)])
def test_rms_norm_vs_float64_and_torch(rng, name, shape):
    x, w = random_half(rng, shape, name, 3), random_half(rng, shape[-1], name)
    for eps in (1e-6, 1e-2):
        out = N.rms_norm(x, w, eps)
        assert out.dtype == npdt(name) and out.shape == x.shape
        ref = rms64(x, w, eps)
        bound = rms_bound(ref, name)
        assert (np.abs(out.astype(np.float64) - ref) <= bound).all()
        # torch.nn.functional.rms_norm computes in float32 (sum of len squares: (len + 4) u relative) and
        # rounds once to the half type: within half_ulp + (len + 4) u of ref; the two add.
        tb = half_ulp(np.abs(ref) * (1 + (shape[-1] + 4) * F32_U), name) + (shape[-1] + 4) * F32_U * np.abs(ref)
        t = from_torch(torch.nn.functional.rms_norm(to_torch(x), (shape[-1],), to_torch(w), eps=eps), name)
        assert (np.abs(out.astype(np.float64) - t.astype(np.float64)) <= bound + tb).all()


@pytest.mark.parametrize("name", HALVES)
def test_rms_norm_overflow_nan_inf(name):
    big = float(ml_dtypes.finfo(npdt(name)).max)
    # [1, 0, 0, 0] / rms 0.5 = [2, 0, 0, 0]; times the format's max, 2 * max overflows to inf
    x = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, np.inf, 2.0, 0.0], [np.nan, 1.0, 2.0, 3.0]], npdt(name))
    w = np.array([big, 1.0, 1.0, 1.0], npdt(name))
    out = N.rms_norm(x, w, 1e-6).astype(np.float64)
    ref = rms64(x, w, 1e-6)
    assert out[0, 0] == np.inf and ref[0, 0] < np.inf  # past the half format's range, not float64's
    np.testing.assert_array_equal(np.isnan(out[1:]), np.isnan(ref[1:]))
    np.testing.assert_array_equal(out[1][~np.isnan(ref[1])], ref[1][~np.isnan(ref[1])])  # finite / inf = 0
    assert np.isnan(out[2]).all()


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


@settings(max_examples=EXAMPLES, deadline=None)
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


@settings(max_examples=EXAMPLES, deadline=None)
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
