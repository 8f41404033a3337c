"""Direct callers of the CPU extensions: inputs the kernels cannot read safely are refused, never read
as raw memory (byte-swapped float32 has NumPy type number NPY_FLOAT32 too; the quant wrappers trust
shapes and dtypes with raw pointers)."""
import numpy as np
import pytest

from hipsched.cpu import _attention, _elementwise, _graph, _quant, _similarity
from hipsched.ops.quant import quantize


def _swapped(a):
    return a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder in "=<" else "<"))


def test_elementwise_refuses_byteswapped_float32():
    x = _swapped(np.arange(8, dtype=np.float32))
    assert x.dtype.num == np.dtype(np.float32).num
    for f in (lambda: _elementwise.add(x, x), lambda: _elementwise.scale(x, 2.0),
              lambda: _elementwise.softmax(x), lambda: _elementwise.exp(x)):
        with pytest.raises(TypeError):
            f()


def test_similarity_refuses_byteswapped_float32():
    T = _swapped(np.ones((3, 4), np.float32))
    with pytest.raises(TypeError):
        _similarity.cosine_similarity(np.ones(4, np.float32), T)


def test_attention_refuses_byteswapped_float32():
    q = np.ones((1, 1, 2, 4), np.float32)
    with pytest.raises(TypeError):
        _attention.attention(q, _swapped(q), q)


def test_graph_refuses_byteswapped_arrays():
    indptr, indices = np.array([0, 1, 1], np.int64), np.array([1], np.int64)
    w, seeds = np.ones(1, np.float32), np.ones(2, np.float32)
    with pytest.raises(TypeError):
        _graph.spread_activation(indptr, indices, _swapped(w), seeds)
    with pytest.raises(TypeError):
        _graph.spread_activation(_swapped(indptr), _swapped(indices), w, seeds)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_quant_direct_calls_refuse_bad_x(qtype):
    w = quantize(np.random.default_rng(0).random((4, 64), dtype=np.float32), qtype)
    for bad in (np.ones(64, np.float64), _swapped(np.ones(64, np.float32))):
        with pytest.raises(TypeError):
            _quant.qmatmul(w, bad)
    for bad in (np.ones(3, np.float32), np.ones((32, 2), np.float32), np.ones((64, 2, 1), np.float32)):
        with pytest.raises(ValueError):
            _quant.qmatmul(w, bad)
    ok = np.ones((64, 3), np.float32)
    np.testing.assert_allclose(_quant.qmatmul(w, ok), _quant.dequantize(w) @ ok, rtol=1e-5)


def test_quant_direct_quantize_refuses_bad_w():
    with pytest.raises(TypeError):
        _quant.quantize(np.ones((2, 64)), "q8_0")
    with pytest.raises(ValueError):
        _quant.quantize(np.ones((2, 40), np.float32), "q8_0")
    with pytest.raises(ValueError):
        _quant.quantize(np.ones(64, np.float32), "q8_0")


@pytest.mark.parametrize("qtype,fine,bad", [("q8_0", 8.32e6, 1e7), ("q4_0", 5.241e5, -6e5)])
def test_quantize_range_error_names_the_overflowing_row(qtype, fine, bad):
    # a row just over 127 (or 8) x 65504 still gets a finite fp16 scale (rounds down to 65504)
    W = np.zeros((3, 32), np.float32)
    W[0, 0] = fine
    quantize(W[:1], qtype)
    W[2, 0] = bad
    with pytest.raises(ValueError, match=r"\(row 2\)"):
        quantize(W, qtype)
