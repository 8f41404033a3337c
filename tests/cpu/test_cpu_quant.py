"""Q8_0 / Q4_0: quantize and dequantize against the `gguf` package (both directions, bit-exact), qmatmul
against NumPy on the gguf-dequantized matrix, on the AVX2 path in-process and the scalar path in a
subprocess; QuantizedTensor construction; bad input.

qmatmul tolerance: our kernel dequantizes each weight exactly (q * d is exact in float32) and sums in
float32, so against the float64 product of the gguf-dequantized matrix Wd and x the error obeys the
standard dot-product bound |err| <= k * 2^-24 * (|Wd| @ |x|) (+ a little for the final reductions);
the tests assert k * 2^-23 * (|Wd| @ |x|)."""
import os

import numpy as np
import pytest
from requires import need
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

gguf = need("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402

import hipsched as hs  # noqa: E402
from hipsched import QuantizedTensor  # noqa: E402

from simd_features import run_with_features  # noqa: E402
from hipsched.cpu import _quant as Q  # noqa: E402

QTYPES = {"q8_0": GT.Q8_0, "q4_0": GT.Q4_0}
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}
ROWS = (0, 1, 7, 8, 9, 31, 33)
COLS = (32, 64, 96, 4096)

# the scalar-path rerun (test_simd_paths.py) only has to show the portable kernels agree: fewer examples
SCALAR_RERUN = os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar"
# the snippets below choose their own SIMD level in a child interpreter, so in that rerun they would only
# repeat, in a subprocess each, what the default run already checked
own_level = pytest.mark.skipif(SCALAR_RERUN, reason="sets its own SIMD level; ran in the default run")


def gguf_quantize(W, qt):
    if W.shape[0] == 0:  # gguf's Q4_0 cannot reshape an empty array; the empty answer is plain
        return np.zeros((0, W.shape[1] // 32 * BLOCK_BYTES[qt]), np.uint8)
    return gguf.quants.quantize(W, QTYPES[qt])


def gguf_dequantize(raw, qt, k):
    if raw.shape[0] == 0:
        return np.zeros((0, k), np.float32)
    return gguf.quants.dequantize(raw, QTYPES[qt])


def assert_qmatmul_close(y, Wd, x):
    ref = Wd.astype(np.float64) @ x.astype(np.float64)
    k = Wd.shape[1]
    # Relative rounding of k float32 steps, plus the absolute term of gradual underflow: a product or sum
    # in the subnormal range rounds to a multiple of 2^-149, whatever its magnitude.
    bound = k * 2.0 ** -23 * (np.abs(Wd).astype(np.float64) @ np.abs(x).astype(np.float64)) + (k + 1) * 2.0 ** -149
    assert y.dtype == np.float32 and y.shape == ref.shape
    err = np.abs(y - ref)
    assert np.all(err <= bound), f"max err {err.max()} vs bound {bound.max()}"


def weights(rng, n, k):
    # rows of very different magnitudes, so block scales cover a wide fp16 range
    return (rng.standard_normal((n, k)) * rng.uniform(1e-3, 1e2, size=(n, 1))).astype(np.float32)


# ------------------------------------------------------------------ layouts against gguf


@pytest.mark.parametrize("qt", sorted(QTYPES))
@pytest.mark.parametrize("k", COLS)
@pytest.mark.parametrize("n", ROWS)
def test_quantize_dequantize_match_gguf(rng, qt, n, k):
    W = weights(rng, n, k)
    w = hs.quantize(W, qt)
    ref = gguf_quantize(W, qt)
    assert w.data.dtype == np.uint8 and w.data.shape == ref.shape == (n, k // 32 * BLOCK_BYTES[qt])
    assert np.array_equal(w.data, ref)  # our quantize == gguf's, byte for byte
    # and our dequantize of gguf's bytes == gguf's dequantize, bit for bit
    ours = hs.dequantize(QuantizedTensor(ref, (n, k), qt), backend="cpu")
    assert ours.dtype == np.float32 and ours.shape == (n, k)
    assert np.array_equal(ours.view(np.uint32), gguf_dequantize(ref, qt, k).view(np.uint32))


@pytest.mark.parametrize("qt", sorted(QTYPES))
def test_dequantize_arbitrary_bytes_matches_gguf(rng, qt):
    # Any byte pattern is a valid block (fp16 scales of every kind: subnormal, inf, NaN); both sides
    # compute one float32 product per element, so the results agree bit for bit, NaNs included.
    n, k = 9, 96
    raw = rng.integers(0, 256, size=(n, k // 32 * BLOCK_BYTES[qt]), dtype=np.uint8)
    ours = hs.dequantize(QuantizedTensor(raw, (n, k), qt))
    with np.errstate(invalid="ignore", over="ignore"):
        ref = gguf_dequantize(raw, qt, k)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def _edge_rows():
    """Rows of 64 values drawn from the cases the rounding is most likely to get wrong."""
    finite = st.floats(min_value=-1e5, max_value=1e5, allow_nan=False, width=32)
    t = float(np.float32(1e-30))
    tiny = st.floats(min_value=-t, max_value=t, allow_nan=False, width=32)  # subnormals included
    halves = st.integers(-254, 254).map(lambda i: np.float32(i / 2.0))              # exact .5 ties
    element = st.one_of(finite, tiny, halves, st.sampled_from([0.0, -0.0, 1.0, -1.0, 65504.0, 1e-8]))
    rows = hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.just(64)), elements=element)
    same = st.tuples(st.integers(1, 3), st.one_of(finite, tiny)).map(
        lambda t: np.full((t[0], 64), t[1], np.float32))                            # all equal
    zeros = st.integers(1, 3).map(lambda n: np.zeros((n, 64), np.float32))
    return st.one_of(rows, same, zeros)


@settings(max_examples=40 if SCALAR_RERUN else 150, deadline=None)
@given(W=_edge_rows(), qt=st.sampled_from(sorted(QTYPES)))
def test_quantize_edge_values_match_gguf(W, qt):
    ref = gguf_quantize(W, qt)
    w = hs.quantize(W, qt)
    assert np.array_equal(w.data, ref)
    assert np.array_equal(hs.dequantize(w).view(np.uint32), gguf_dequantize(ref, qt, 64).view(np.uint32))


@pytest.mark.parametrize("qt", sorted(QTYPES))
def test_quantization_error_is_within_a_step(rng, qt):
    W = weights(rng, 8, 256)
    Wd = hs.dequantize(hs.quantize(W, qt))
    blocks = np.abs(W).reshape(8, -1, 32).max(axis=2, keepdims=True)
    step = blocks / (127 if qt == "q8_0" else 8)
    err = np.abs(Wd - W).reshape(8, -1, 32)
    # Half a step for q8_0; q4_0 maps [-8d, 8d] onto the 16 levels -8..7, so values of the sign opposite
    # to the block's extreme clip at 7d: up to a whole step. Plus the fp16 rounding of the scale
    # applied to up to 128 (or 9) steps.
    half = 0.5 if qt == "q8_0" else 1.0
    assert np.all(err <= step * (half + 2.0 ** -11 * (128 if qt == "q8_0" else 9)) + 1e-30)


# ------------------------------------------------------------------ qmatmul against NumPy


@pytest.mark.parametrize("qt", sorted(QTYPES))
@pytest.mark.parametrize("k", COLS)
@pytest.mark.parametrize("n", ROWS)
def test_qmatmul_matches_numpy(rng, qt, n, k):
    W = weights(rng, n, k)
    w = hs.quantize(W, qt)
    Wd = gguf_dequantize(w.data, qt, k)
    for m in (None, 1, 3, 8):
        x = rng.standard_normal(k if m is None else (k, m)).astype(np.float32)
        assert_qmatmul_close(hs.qmatmul(w, x, backend="cpu"), Wd, x)


@settings(max_examples=10 if SCALAR_RERUN else 40, deadline=None)
@given(data=st.data(), qt=st.sampled_from(sorted(QTYPES)))
def test_qmatmul_property(data, qt):
    n = data.draw(st.integers(0, 10))
    k = 32 * data.draw(st.integers(0, 5))
    m = data.draw(st.sampled_from([None, 0, 1, 2, 3, 4, 5, 9]))
    el = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    W = data.draw(hnp.arrays(np.float32, (n, k), elements=el))
    x = data.draw(hnp.arrays(np.float32, (k,) if m is None else (k, m), elements=el))
    w = hs.quantize(W, qt)
    assert_qmatmul_close(hs.qmatmul(w, x), hs.dequantize(w), x)


def test_qmatmul_converts_and_copies_x_like_numpy(rng):
    W = weights(rng, 9, 96)
    w = hs.quantize(W, "q8_0")
    Wd = hs.dequantize(w)
    X64 = rng.standard_normal((96, 6))
    strided = X64.astype(np.float32)[:, ::2]  # not contiguous
    assert_qmatmul_close(hs.qmatmul(w, strided), Wd, strided)
    assert_qmatmul_close(hs.qmatmul(w, X64), Wd, X64.astype(np.float32))
    xi = rng.integers(-5, 5, size=96)
    assert_qmatmul_close(hs.qmatmul(w, xi), Wd, xi.astype(np.float32))
    assert hs.qmatmul(w, np.zeros((96, 0), np.float32)).shape == (9, 0)


def test_qmatmul_propagates_nan_and_inf_in_x(rng):
    w = hs.quantize(weights(rng, 4, 64), "q4_0")
    x = rng.standard_normal(64).astype(np.float32)
    x[5] = np.nan
    assert np.isnan(hs.qmatmul(w, x)).all()
    Wd = hs.dequantize(w)
    x[5] = np.inf
    with np.errstate(invalid="ignore"):
        ref = Wd @ x
    assert np.array_equal(np.isnan(hs.qmatmul(w, x)), np.isnan(ref))


SCALAR_SNIPPET = """
import numpy as np, gguf, hipsched as hs
from gguf import GGMLQuantizationType as GT
assert hs.cpu_features()["simd"] == "scalar"
rng = np.random.default_rng(7)
for qt, gt in (("q8_0", GT.Q8_0), ("q4_0", GT.Q4_0)):
    for n, k in ((1, 32), (9, 96), (33, 4096)):
        W = (rng.standard_normal((n, k)) * rng.uniform(1e-3, 1e2, size=(n, 1))).astype(np.float32)
        W[0, :32] = 0.5 * rng.integers(-20, 20, 32)  # exact ties
        w = hs.quantize(W, qt)
        ref = gguf.quants.quantize(W, gt)
        assert np.array_equal(w.data, ref), (qt, n, k)
        Wd = gguf.quants.dequantize(ref, gt)
        assert np.array_equal(hs.dequantize(w), Wd), (qt, n, k)
        for m in (None, 3, 8):
            x = rng.standard_normal(k if m is None else (k, m)).astype(np.float32)
            y = hs.qmatmul(w, x)
            bound = k * 2.0 ** -23 * (np.abs(Wd).astype(np.float64) @ np.abs(x))
            assert np.all(np.abs(y - Wd.astype(np.float64) @ x) <= bound), (qt, n, k, m)
print("ok")
"""


@own_level
def test_scalar_path_matches_gguf_and_numpy():
    assert run_with_features(SCALAR_SNIPPET, "scalar").strip() == "ok"


THREADS_SNIPPET = """
import os
os.environ["HIPSCHED_NUM_THREADS"] = "1"
import numpy as np, hipsched as hs
assert hs.cpu_features()["threads"] == 1
rng = np.random.default_rng(3)
W = rng.standard_normal((67, 4096)).astype(np.float32)
X = rng.standard_normal((4096, 5)).astype(np.float32)
for qt in ("q8_0", "q4_0"):
    w = hs.quantize(W, qt)
    print(qt, w.data.tobytes().hex()[:64], hs.qmatmul(w, X).tobytes().hex(), hs.qmatmul(w, X[:, 0]).tobytes().hex())
"""


@own_level
def test_results_do_not_depend_on_the_thread_count():
    # Each row is summed by one thread in a fixed order, so any thread count gives the same bits.
    ours = run_with_features(THREADS_SNIPPET.replace('os.environ["HIPSCHED_NUM_THREADS"] = "1"', "pass")
                             .replace('assert hs.cpu_features()["threads"] == 1', ""), features="auto")
    assert run_with_features(THREADS_SNIPPET, features="auto") == ours


# ------------------------------------------------------------------ QuantizedTensor


def test_quantized_tensor_accepts_bytes_memoryview_and_gguf_tensors(rng, tmp_path):
    W = weights(rng, 7, 64)
    w = hs.quantize(W, "q4_0")
    raw = w.data.tobytes()
    for data in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, np.uint8)):
        t = QuantizedTensor(data, (7, 64), "q4_0")
        assert np.array_equal(hs.dequantize(t), hs.dequantize(w))
    assert (w.shape, w.qtype, w.dtype, w.nbytes) == ((7, 64), "q4_0", "q4_0", 7 * 2 * 18)
    # a tensor written to and read back from a real GGUF file (the reader memory-maps it)
    path = str(tmp_path / "w.gguf")
    writer = gguf.GGUFWriter(path, "test")
    writer.add_tensor("w", gguf.quants.quantize(W, GT.Q8_0), raw_dtype=GT.Q8_0)
    writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
    t = gguf.GGUFReader(path).tensors[0]
    qt = QuantizedTensor(t.data, tuple(int(s) for s in reversed(t.shape)), t.tensor_type)
    assert qt.qtype == "q8_0" and qt.shape == (7, 64)
    assert np.array_equal(hs.dequantize(qt), gguf.quants.dequantize(np.asarray(t.data), GT.Q8_0))


def test_quantized_tensor_is_read_only_and_pickles(rng):
    import pickle
    w = hs.quantize(weights(rng, 2, 32), "q8_0")
    w2 = pickle.loads(pickle.dumps(w))
    assert (w2.shape, w2.qtype) == (w.shape, w.qtype) and np.array_equal(w2.data, w.data)
    with pytest.raises(ValueError):
        w.data[0, 0] = 1
    with pytest.raises(AttributeError):
        w.qtype = "q4_0"


def test_one_block_format_for_every_layer():
    """The leaf hipsched/gguf_blocks.py is the one definition: the op specs, the GPU glue and the public
    name hold the same objects, and the C kernels' block sizes agree with it (and with GGUF's)."""
    from hipsched import gguf_blocks
    from hipsched.cpu import _quant
    from hipsched.gpu.glue import quant as quant_glue
    from hipsched.ops import quant
    assert QuantizedTensor is quant.QuantizedTensor is gguf_blocks.QuantizedTensor
    assert quant_glue.BLOCK_BYTES is gguf_blocks.BLOCK_BYTES  # the glue uses the leaf; it keeps no copy
    assert quant_glue.QK == gguf_blocks.QK == 32
    assert _quant.BLOCK_BYTES == gguf_blocks.BLOCK_BYTES == BLOCK_BYTES
    assert {qt: gguf.constants.GGML_QUANT_SIZES[QTYPES[qt]] for qt in QTYPES} == \
        {qt: (gguf_blocks.QK, b) for qt, b in gguf_blocks.BLOCK_BYTES.items()}
    assert gguf_blocks.row_bytes(96, "q4_0") == 3 * 18


def test_quantize_converts_like_numpy(rng):
    W64 = rng.standard_normal((3, 64))
    assert np.array_equal(hs.quantize(W64, "Q8_0").data, gguf.quants.quantize(W64.astype(np.float32), GT.Q8_0))
    Wi = rng.integers(-100, 100, size=(2, 32))
    assert np.array_equal(hs.quantize(Wi, GT.Q4_0).data, gguf.quants.quantize(Wi.astype(np.float32), GT.Q4_0))
    Wt = np.asfortranarray(W64.astype(np.float32))
    assert np.array_equal(hs.quantize(Wt, "q4_0").data, gguf.quants.quantize(np.ascontiguousarray(Wt), GT.Q4_0))


# ------------------------------------------------------------------ bad input


def test_quantize_rejects_bad_input(rng):
    with pytest.raises(ValueError, match="k = 48"):
        hs.quantize(np.ones((2, 48), np.float32), "q8_0")
    for bad in (np.nan, np.inf, -np.inf):
        W = np.ones((3, 64), np.float32)
        W[2, 40] = bad
        with pytest.raises(ValueError, match="NaN or inf.*row 2"):
            hs.quantize(W, "q4_0")
    with pytest.raises(ValueError, match="fp16"):
        hs.quantize(np.full((1, 32), 1e7, np.float32), "q8_0")
    with pytest.raises(ValueError, match="fp16"):
        hs.quantize(np.full((1, 32), 6e5, np.float32), "q4_0")
    with pytest.raises(TypeError, match="quantize.*'W'"):
        hs.quantize(np.ones((2, 32), np.complex64), "q8_0")
    with pytest.raises(ValueError, match="2-d"):
        hs.quantize(np.ones(64, np.float32), "q8_0")
    with pytest.raises(ValueError, match="qtype"):
        hs.quantize(np.ones((2, 32), np.float32), "q5_0")


def test_quantized_tensor_rejects_bad_data():
    with pytest.raises(ValueError, match="must be 68 bytes"):
        QuantizedTensor(np.zeros(67, np.uint8), (2, 32), "q8_0")
    with pytest.raises(TypeError, match="uint8"):
        QuantizedTensor(np.zeros(17, np.float32), (2, 32), "q8_0")
    with pytest.raises(TypeError):
        QuantizedTensor([0] * 68, (2, 32), "q8_0")
    with pytest.raises(ValueError, match="k = 33"):
        QuantizedTensor(np.zeros(68, np.uint8), (2, 33), "q8_0")
    with pytest.raises(ValueError, match="qtype"):
        QuantizedTensor(np.zeros(68, np.uint8), (2, 32), "f16")
    with pytest.raises(ValueError):
        QuantizedTensor(np.zeros(0, np.uint8), (-1, 32), "q8_0")


def test_ops_reject_bad_input(rng):
    w = hs.quantize(weights(rng, 4, 64), "q8_0")
    with pytest.raises(ValueError, match=r"\(4, 64\).*\(32,\)"):
        hs.qmatmul(w, np.ones(32, np.float32))
    with pytest.raises(ValueError, match=r"\(4, 64\).*\(63, 2\)"):
        hs.qmatmul(w, np.ones((63, 2), np.float32))
    with pytest.raises(ValueError, match="1-d or 2-d"):
        hs.qmatmul(w, np.ones((64, 2, 2), np.float32))
    with pytest.raises(TypeError, match="qmatmul.*'x'"):
        hs.qmatmul(w, np.array(["a"] * 64))
    with pytest.raises(TypeError, match="QuantizedTensor"):
        hs.qmatmul(np.ones((4, 64), np.float32), np.ones(64, np.float32))
    with pytest.raises(TypeError, match="QuantizedTensor"):
        hs.dequantize(np.ones((4, 64), np.float32))


# ==================================================================================================
# Half precision (float16, bfloat16): formerly tests/cpu/test_cpu_half_quant.py
#
# quantize with a float16/bfloat16 W and qmatmul with a float16/bfloat16 x (rerun on the scalar path by
# test_simd_paths.py), against the `gguf` package and a float64 product.
#
# quantize: the bytes must equal gguf's quantization of the same half values widened to float32 (the
# widening is exact, so there is nothing to tolerate). qmatmul: the float32 result obeys
# |y32 - exact| <= k 2^-23 (|Wd| @ |x|) (test_cpu_quant.py's dot-product bound) and is then rounded once
# to x's dtype, u |exact| more (u = 2^-11 float16, 2^-8 bfloat16), with (1 + u) on the first term.


ml_dtypes = need("ml_dtypes")
BF16 = ml_dtypes.bfloat16
HALVES = [np.float16, BF16]
from half_formats import UNIT  # noqa: E402  (unit roundoff per type: 2^-11 float16, 2^-8 bfloat16)


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
