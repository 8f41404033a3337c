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
    """Half inputs stay half (their values and kernels: test_cpu_half.py); the Call the scheduler keys
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
