"""rms_norm on the CPU kernels against a float64 NumPy reference and torch.nn.functional.rms_norm (rerun
on the scalar path by test_simd_paths.py). Both kernel variants form the sum of squares and each product
in float64 and round once, so every result must be the float64 formula rounded to float32 (half an ulp,
with slack only for float64's own rounding); torch computes in float32, so it is matched to a few ulp."""
import os

import numpy as np
import pytest
from requires import need
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import hipsched
from hipsched.cpu import _norm as N
from hipsched.ops import OPS

from half_formats import F32_U, HALVES, from_torch, half_ulp, ml_dtypes, npdt, random_half, to_torch, torch

EXAMPLES = 15 if os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar" else 60


def reference(x, w, eps=1e-6):
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    with np.errstate(all="ignore"):
        return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w64


def assert_rounded_reference(y, ref):
    """y is ref rounded to float32: within half a float32 ulp of ref, NaN exactly where ref is NaN."""
    assert y.dtype == np.float32 and y.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    ok = ~np.isnan(ref)
    half_ulp = 0.5 * np.spacing(np.abs(ref[ok]).astype(np.float32)).astype(np.float64)
    err = np.abs(y[ok].astype(np.float64) - ref[ok])
    bad = err > half_ulp * (1 + 1e-6)
    assert not bad.any(), f"{bad.sum()} results off: y {y[ok][bad][:5]} ref {ref[ok][bad][:5]}"


def test_simd_level_is_what_the_environment_asks():
    feats = hipsched.cpu_features()
    levels = ["scalar", "avx2", "avx512"]
    asked = os.environ.get("HIPSCHED_CPU_FEATURES")
    detected = levels.index(feats["detected"])
    assert feats["simd"] == levels[min(levels.index(asked), detected) if asked in levels else detected]


# (300, 4096) crosses the two-thread grain (OpenMP over rows); the others run on one thread. Widths cover
# the 8-lane body, its 4-lane product loop and the tails.
@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (13,), (3, 5), (4, 33), (2, 3, 64), (5, 1000), (300, 4096),
                                   (2, 70001)])
def test_matches_float64_reference(rng, shape):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    for eps in (1e-6, 1e-2, 7.5):
        assert_rounded_reference(hipsched.rms_norm(x, w, eps=eps, backend="cpu"), reference(x, w, eps))


def test_matches_torch(rng):
    torch = need("torch")
    if not hasattr(torch.nn.functional, "rms_norm"):
        pytest.skip("this torch has no nn.functional.rms_norm")
    x = rng.standard_normal((6, 9, 768)).astype(np.float32)
    w = rng.standard_normal(768).astype(np.float32)
    want = torch.nn.functional.rms_norm(torch.from_numpy(x), (768,), torch.from_numpy(w), eps=1e-5).numpy()
    np.testing.assert_allclose(hipsched.rms_norm(x, w, 1e-5), want, rtol=2e-6, atol=1e-7)


def test_squares_do_not_overflow_float32(rng):
    # x**2 overflows float32 at 1.9e19: a float32 sum of squares would give inf and zeros out
    x = (rng.standard_normal((3, 40)) * 1e30).astype(np.float32)
    w = np.ones(40, np.float32)
    y = hipsched.rms_norm(x, w)
    assert np.isfinite(y).all()
    assert_rounded_reference(y, reference(x, w))


def test_nan_inf_follow_the_formula():
    x = np.array([[1, 2, np.nan, 4], [1, np.inf, 3, 4], [-np.inf, 0, 1, 2], [0, 0, 0, 0], [3, -4, 0, 1e-30]],
                 np.float32)
    w = np.array([1, -2, 0.5, 3], np.float32)
    y = hipsched.rms_norm(x, w)
    assert_rounded_reference(y, reference(x, w))
    assert np.isnan(y[0]).all() and np.isnan(y[1, 1]) and (y[1, [0, 2, 3]] == 0).all()
    assert (y[3] == 0).all()
    w_nan = np.array([1, np.nan, 1, 1], np.float32)
    y = hipsched.rms_norm(x[3:], w_nan)
    assert np.isnan(y[:, 1]).all() and not np.isnan(y[:, [0, 2, 3]]).any()


@pytest.mark.parametrize("shape", [(0,), (0, 8), (3, 0), (2, 0, 5)])
def test_empty_inputs_give_empty_results(shape):
    y = hipsched.rms_norm(np.zeros(shape, np.float32), np.ones(shape[-1], np.float32))
    assert y.shape == shape and y.dtype == np.float32


def test_other_real_dtypes_are_converted(rng):
    x = rng.standard_normal((4, 16))
    w = np.arange(16)
    y = hipsched.rms_norm(x, w)
    assert_rounded_reference(y, reference(x.astype(np.float32), w.astype(np.float32)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
                    elements=st.floats(-1e6, 1e6, width=32)),
       eps=st.floats(1e-12, 1e3))
def test_properties(x, eps):
    w = np.linspace(-2, 2, x.shape[-1]).astype(np.float32)
    assert_rounded_reference(hipsched.rms_norm(x, w, eps=eps), reference(x, w, eps))


@pytest.mark.parametrize("x,w,exc,words", [
    (np.ones(4, np.complex64), np.ones(4, np.float32), TypeError, ["rms_norm", "'x'", "complex64"]),
    (np.ones(4, np.float32), np.array(["a"] * 4), TypeError, ["rms_norm", "'weight'"]),
    (np.ones((2, 4), np.float32), np.ones(3, np.float32), ValueError, ["rms_norm", "(2, 4)", "(3,)"]),
    (np.ones((2, 4), np.float32), np.ones((1, 4), np.float32), ValueError, ["rms_norm", "(2, 4)", "(1, 4)"]),
    (np.float32(3), np.ones(1, np.float32), ValueError, ["rms_norm", "'x'", "0-d"]),
])
def test_bad_arguments(x, w, exc, words):
    with pytest.raises(exc) as e:
        hipsched.rms_norm(x, w)
    for word in words:
        assert word in str(e.value)


@pytest.mark.parametrize("eps,exc", [(0.0, ValueError), (-1e-6, ValueError), (float("nan"), ValueError),
                                     (float("inf"), ValueError), ("1e-6", TypeError), (None, TypeError)])
def test_bad_eps(eps, exc):
    with pytest.raises(exc, match="rms_norm: eps"):
        hipsched.rms_norm(np.ones(4, np.float32), np.ones(4, np.float32), eps=eps)


def test_extension_refuses_what_its_kernel_cannot_read_safely():
    with pytest.raises(ValueError):        # a short weight would be read past its end
        N.rms_norm(np.ones((2, 8), np.float32), np.ones(4, np.float32))
    with pytest.raises(TypeError):
        N.rms_norm(np.ones(8), np.ones(8, np.float32))
    with pytest.raises(ValueError):
        N.rms_norm(np.ones(8, np.float32), np.ones(8, np.float32), 0.0)


def test_spec_splits_rows_and_its_sweep_prepares(rng):
    spec = OPS["rms_norm"]
    x = rng.standard_normal((9, 4, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32)
    call = spec.prepare(x, w, 1e-3)
    pieces, split, combine = spec.chunks(call)
    assert pieces == 9
    parts = [N.rms_norm(*split(lo, hi), **call.params) for lo, hi in ((0, 4), (4, 5), (5, 9))]
    np.testing.assert_array_equal(combine(parts), N.rms_norm(x, w, 1e-3))
    assert spec.chunks(spec.prepare(x[0, 0], w)) is None      # a single row cannot be split
    for size, args, kwargs in spec.sweep(np.random.default_rng(0)):
        assert spec.prepare(*args, **kwargs).size == size


def test_half_calls_carry_their_dtype_and_bytes():
    """Half inputs stay half (values: the half section below); the Call names the dtype and counts 2-byte
    elements; a mix of dtypes promotes to float32. The GPU side takes float32 only."""
    ml_dtypes = need("ml_dtypes")
    for dt in (np.float16, ml_dtypes.bfloat16):
        call = OPS["rms_norm"].prepare(np.ones((4, 8), dt), np.ones(8, dt))
        assert (call.dtype, call.nbytes, call.size) == (np.dtype(dt).name, 2 * (2 * 32 + 8), 32)
        assert all(a.dtype == dt for a in call.args)
    mixed = OPS["rms_norm"].prepare(np.ones((4, 8), np.float16), np.ones(8, ml_dtypes.bfloat16))
    assert mixed.dtype == "float32" and all(a.dtype == np.float32 for a in mixed.args)
    assert "bfloat16" in OPS["rms_norm"].gpu_dtypes and "bfloat16" in OPS["rms_norm"].cpu_dtypes


# ==================================================================================================
# Half precision (float16, bfloat16): formerly in tests/cpu/test_cpu_half.py
#
# rms_norm in float16 and bfloat16 on the CPU kernel (rerun on the scalar path by test_simd_paths.py),
# against PyTorch CPU in the same dtype and a float64 reference. The kernel forms each result in float64,
# rounds it to float32 and then to the half type once, at the store: the bound is half a unit in the last
# place of the half format at the value (relative 2^-11 for float16, 2^-8 for bfloat16 for normal values,
# absolute 2^-25 in float16's subnormal range) plus the float32 rounding (helpers: tests/support/half_formats.py;
# add, scale, softmax and the ops layer's half tests: test_cpu_elementwise.py).


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

