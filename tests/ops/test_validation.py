"""Bad input for add, scale, softmax, cosine_similarity, top_k and matmul: every case is rejected (or
handled) in validation, before a kernel runs, with the error type and message the issue asks for."""
import numpy as np
import pytest

import hipsched
from hipsched.ops import OPS

# CPU only: on a GPU machine a default Executor sends some calls to the device, and the bit-for-bit
# comparisons below would then compare two engines (seen on an H100: softmax along axis 0 differed in
# the last bit). The GPU's agreement with the CPU is tests/gpu's concern.
ex = hipsched.Executor(force_cpu_mode=True, persist_model=False)
T8 = np.arange(24, dtype=np.float32).reshape(6, 4)


# float16 is not here: the ops that read half precision keep it (the half-precision sections of tests/cpu/test_cpu_*.py)
def test_an_input_that_cannot_change_is_converted_once():
    """A float64 corpus that is read-only and owns its memory converts to float32 once: later calls get
    the same read-only copy (no pass over the data per call, and the GPU may keep the copy resident). A
    writable one, or a read-only view of a writable one, is converted by every call."""
    from hipsched.ops.validation import as_float
    T = np.random.default_rng(0).standard_normal((64, 8))
    a, b = as_float(T, "top_k", "corpus"), as_float(T, "top_k", "corpus")
    assert a is not b and a.flags.writeable
    view = T[:]
    view.flags.writeable = False
    assert as_float(view, "top_k", "corpus") is not as_float(view, "top_k", "corpus")
    T.flags.writeable = False
    a = as_float(T, "top_k", "corpus")
    assert a is as_float(T, "top_k", "corpus") and a.dtype == np.float32 and not a.flags.writeable
    np.testing.assert_array_equal(a, T.astype(np.float32))
    q = np.ones(8, np.float32)
    np.testing.assert_array_equal(ex.top_k(q, T, 3)[1], ex.top_k(q, T.astype(np.float32), 3)[1])
    # write access given back, the bytes rewritten, then taken away again: the copy is not served
    T.flags.writeable = True
    T *= 2
    T.flags.writeable = False
    b = as_float(T, "top_k", "corpus")
    assert b is not a
    np.testing.assert_array_equal(b, T.astype(np.float32))


def test_a_kept_copys_source_freed_by_the_collector_inside_the_lock_does_not_deadlock():
    """A source held only by a reference cycle dies when the collector runs, which can be during an
    allocation inside converted_once's own locked section: its entry's callback must not wait on the
    lock its own thread holds."""
    import gc
    import threading
    from hipsched.ops import converted_copies, validation

    def work():
        src = np.arange(16, dtype=np.float64)
        src.flags.writeable = False
        validation.as_float(src, "top_k", "corpus")
        cycle = [src]
        cycle.append(cycle)
        key = id(src)
        del src, cycle
        with converted_copies._converted_lock:
            gc.collect()      # frees the cycle, and the source with it, while the lock is held
        gone.append(not any(k[0] == key for k in converted_copies._converted))   # and its entry went with it
    gone = []
    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert gone == [True]


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint16, np.float64, np.bool_])
def test_numeric_dtypes_convert_as_numpy_does(dtype):
    a = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    want = a.astype(np.float32)
    np.testing.assert_array_equal(ex.add(a, a), want + want)
    np.testing.assert_array_equal(ex.scale(a, 2), want * np.float32(2))
    np.testing.assert_allclose(ex.softmax(a), ex.softmax(want))
    np.testing.assert_array_equal(ex.cosine_similarity(a[0], a), ex.cosine_similarity(want[0], want))
    np.testing.assert_array_equal(ex.matmul(a, a.T), want @ want.T)
    assert ex.add(a, a).dtype == np.float32
    big = np.array([2**40 + 1, 16777217], np.int64)  # rounded exactly as astype(float32)
    np.testing.assert_array_equal(ex.scale(big, 1), big.astype(np.float32))


@pytest.mark.parametrize("bad", [np.ones(3, np.complex64), np.array(["a", "b", "c"]), np.array([object(), 1, 2])])
def test_unconvertible_dtypes_are_type_errors_naming_op_and_argument(bad):
    good = np.ones(3, np.float32)
    for op, call in [("add", lambda: ex.add(good, bad)), ("scale", lambda: ex.scale(bad, 2.0)),
                     ("softmax", lambda: ex.softmax(bad)), ("cosine_similarity", lambda: ex.cosine_similarity(good, bad[None])),
                     ("top_k", lambda: ex.top_k(bad, good[None], 1)), ("matmul", lambda: ex.matmul(good, bad))]:
        with pytest.raises(TypeError) as e:
            call()
        assert op in str(e.value) and ("'b'" in str(e.value) or "'x'" in str(e.value) or "'T'" in str(e.value)
                                       or "'q'" in str(e.value))


@pytest.mark.parametrize("call,shapes", [
    (lambda: ex.add(np.ones((3, 4)), np.ones(3)), ["(3, 4)", "(3,)"]),
    (lambda: ex.add(np.ones(4), np.ones((2, 4))), ["(4,)", "(2, 4)"]),
    (lambda: ex.cosine_similarity(np.ones(5), np.ones((3, 4))), ["(5,)", "(3, 4)"]),
    (lambda: ex.top_k(np.ones((2, 5)), np.ones((3, 4)), 1), ["(2, 5)", "(3, 4)"]),
    (lambda: ex.matmul(np.ones((2, 3)), np.ones((4, 5))), ["(2, 3)", "(4, 5)"]),
    (lambda: ex.matmul(np.ones((2, 2, 3)), np.ones((4, 3, 5))), ["(2, 2, 3)", "(4, 3, 5)"]),
])
def test_shape_mismatch_names_both_shapes(call, shapes):
    with pytest.raises(ValueError) as e:
        call()
    for s in shapes:
        assert s in str(e.value)


def test_wrong_ranks_and_parameters():
    with pytest.raises(ValueError, match="cosine_similarity.*'q'"):
        ex.cosine_similarity(np.ones((2, 2, 2)), T8)
    with pytest.raises(ValueError, match="'T'"):
        ex.cosine_similarity(np.ones(4), np.ones(4))
    with pytest.raises(ValueError, match="k must be >= 1"):
        ex.top_k(T8[0], T8, 0)
    for k in (2.0, True, "3", None):
        with pytest.raises(TypeError, match="top_k: k"):
            ex.top_k(T8[0], T8, k)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        ex.softmax(T8, axis=2)
    with pytest.raises(ValueError, match="axis -3"):
        ex.softmax(T8, axis=-3)
    with pytest.raises(TypeError, match="axis"):
        ex.softmax(T8, axis=1.0)
    with pytest.raises(ValueError, match="0-d"):
        ex.softmax(np.float32(1.0))
    for alpha in ("2", 1 + 2j, None, np.ones(2)):
        with pytest.raises(TypeError, match="scale: alpha"):
            ex.scale(T8, alpha)
    with pytest.raises(ValueError, match="at least 1-d"):
        ex.matmul(np.float32(2), T8)


def test_non_contiguous_and_unaligned_inputs_give_correct_results():
    base = np.arange(200, dtype=np.float32).reshape(10, 20) / 7
    views = [base[:, ::2], base.T, base[::-1], np.asfortranarray(base)]
    raw = np.zeros(base.nbytes + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, dtype=np.float32, count=base.size, offset=1).reshape(10, 20)
    assert not unaligned.flags.aligned
    unaligned[...] = base
    views.append(unaligned)
    for v in views:
        ref = np.array(v, dtype=np.float32, order="C")
        np.testing.assert_array_equal(ex.add(v, v), ref + ref)
        np.testing.assert_array_equal(ex.scale(v, 3.0), ref * np.float32(3))
        np.testing.assert_array_equal(ex.softmax(v, axis=0), ex.softmax(ref, axis=0))
        np.testing.assert_array_equal(ex.cosine_similarity(v[0], v), ex.cosine_similarity(ref[0], ref))
        np.testing.assert_array_equal(ex.top_k(v, v, 3)[0], ex.top_k(ref, ref, 3)[0])
        # matmul is NumPy's BLAS, whose kernel (and so summation order) depends on the operands' layout:
        # compare with float64 within the float32 bound for a length-20 dot product (20 * 2**-24 relative)
        ref64 = ref.astype(np.float64)
        np.testing.assert_allclose(ex.matmul(v, v.T), ref64 @ ref64.T, rtol=20 * 2.0**-24)


def test_unaligned_buffers_are_copied_byte_for_byte():
    """contiguous_aligned (ops/validation.py) copies an unaligned buffer's bytes: NaN payloads, -0.0 and half
    types come through unchanged, the copy is aligned and C-contiguous, and an aligned array is kept."""
    from hipsched.ops.validation import contiguous_aligned
    rng = np.random.default_rng(5)
    vals = rng.standard_normal(40).astype(np.float32)
    vals[3] = -0.0
    vals[7:9] = np.frombuffer(np.array([0x7FC12345, 0xFF800001], np.uint32).tobytes(), np.float32)
    for dt in (np.float32, np.float16, np.int32, np.int64):
        src = vals.astype(dt) if np.issubdtype(dt, np.floating) else rng.integers(-2**30, 2**30, 40).astype(dt)
        for off in (1, 2, 3, 6):
            raw = np.zeros(src.nbytes + off, np.uint8)
            u = np.frombuffer(raw.data, dtype=dt, count=src.size, offset=off).reshape(8, 5)
            if u.flags.aligned:
                continue
            u[...] = src.reshape(8, 5)
            out = contiguous_aligned(u)
            assert out.flags.aligned and out.flags.c_contiguous and out.dtype == dt and out.shape == (8, 5)
            assert out.tobytes() == u.tobytes()
            strided = contiguous_aligned(u[:, ::2])
            assert strided.flags.aligned and strided.tobytes() == np.ascontiguousarray(u[:, ::2]).tobytes()
    a = np.ones((3, 4), np.float32)
    assert contiguous_aligned(a) is a
    # an unaligned int32 CSR index (the graph op keeps int32 pairs) gives the aligned one's result
    indptr, indices = np.array([0, 2, 3, 3], np.int32), np.array([1, 2, 0], np.int32)
    raw = np.zeros(indices.nbytes + 1, np.uint8)
    iu = np.frombuffer(raw.data, np.int32, count=3, offset=1)
    iu[...] = indices
    assert not iu.flags.aligned
    w, seeds = np.array([0.5, 0.25, 1.0], np.float32), np.array([1.0, 0.0, 0.0], np.float32)
    np.testing.assert_array_equal(ex.spread_activation((indptr, iu, w), seeds, steps=2),
                                  ex.spread_activation((indptr, indices, w), seeds, steps=2))


def test_empty_inputs_give_empty_results():
    assert ex.add(np.ones((0, 5)), np.ones(5)).shape == (0, 5)
    assert ex.scale(np.ones((3, 0)), 2).shape == (3, 0)
    assert ex.softmax(np.ones((0, 4))).shape == (0, 4)
    assert ex.softmax(np.ones((4, 0)), axis=-1).shape == (4, 0)
    assert ex.cosine_similarity(np.ones(4), np.ones((0, 4))).shape == (0,)
    assert ex.cosine_similarity(np.ones((0, 4)), np.ones((3, 4))).shape == (0, 3)
    np.testing.assert_array_equal(ex.cosine_similarity(np.ones((2, 0)), np.ones((3, 0))), np.zeros((2, 3)))
    idx, val = ex.top_k(np.ones(4), np.ones((0, 4)), 5)
    assert idx.shape == (0,) and val.shape == (0,) and idx.dtype == np.int64 and val.dtype == np.float32
    idx, val = ex.top_k(np.ones((0, 4)), np.ones((3, 4)), 2)
    assert idx.shape == (0, 2)
    assert ex.matmul(np.ones((0, 3)), np.ones((3, 4))).shape == (0, 4)
    np.testing.assert_array_equal(ex.matmul(np.ones((2, 0)), np.ones((0, 3))), np.zeros((2, 3)))


def test_results_that_cannot_fit_are_memory_errors():
    # zero-width inputs take no memory, but the results would need terabytes
    q, T = np.ones((1 << 20, 0), np.float32), np.ones((1 << 20, 0), np.float32)
    with pytest.raises(MemoryError, match="cosine_similarity"):
        ex.cosine_similarity(q, T)
    with pytest.raises(MemoryError, match="top_k"):
        ex.top_k(np.ones((1 << 30, 0), np.float32), np.ones((1 << 20, 0), np.float32), 1 << 20)
    with pytest.raises(MemoryError, match="matmul"):
        ex.matmul(q, T.T)


def test_nan_inf_propagate_through_public_api():
    x = np.array([[np.nan, 1, 2], [np.inf, 0, 1], [-np.inf, 0, 1]], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ex.add(x, x), x + x)
        np.testing.assert_array_equal(ex.scale(x, np.nan), x * np.float32(np.nan))
    sm = ex.softmax(x)
    assert np.isnan(sm[:2]).all() and sm[2, 0] == 0 and np.isfinite(sm[2]).all()


def test_call_work_measures_follow_the_interface():
    assert OPS["add"].prepare(np.ones((4, 5)), np.ones(5)).size == 20
    assert OPS["softmax"].prepare(np.ones((4, 5)), axis=0).params == {"axis": 0}
    c = OPS["cosine_similarity"].prepare(np.ones((3, 8)), np.ones((10, 8)))
    assert (c.size, c.nbytes, c.dtype, c.on_device) == (3 * 8 * 10, 4 * (24 + 80 + 30), "float32", False)
    assert OPS["top_k"].prepare(np.ones(8), np.ones((10, 8)), 4).params == {"k": 4}
    assert OPS["matmul"].prepare(np.ones((2, 3, 4)), np.ones((4, 5))).size == 2 * 3 * 5 * 4
    assert OPS["scale"].prepare(np.ones(3), 2).params == {"alpha": 2.0}


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_cpu_guards.py): Direct callers of the CPU extensions: inputs the kernels cannot read safely are refused, never read
# as raw memory (byte-swapped float32 has NumPy type number NPY_FLOAT32 too; the quant wrappers trust
# shapes and dtypes with raw pointers).
# ----------------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("op", ["attention", "softmax", "add"])
def test_an_input_whose_copy_cannot_fit_is_memory_error_before_any_copy(op, monkeypatch):
    """A broadcast view of 2^41 elements costs nothing until copied. The check comes before the copy:
    where Linux overcommits (seen on a lent GPU VM), the copy itself would get the process killed."""
    from hipsched.ops import validation
    big = np.broadcast_to(np.float32(1), (1 << 16, 1 << 16, 8, 64))[..., ::2]   # not contiguous
    monkeypatch.setattr(np, "ascontiguousarray", lambda *a, **k: pytest.fail("copied before the check"))
    with pytest.raises(MemoryError, match=r"argument 'q'|argument 'x'|argument 'a'"):
        if op == "attention":
            k = np.zeros((1 << 16, 1 << 16, 0, 32), np.float32)
            ex.attention(big, k, k)
        elif op == "softmax":
            ex.softmax(big)
        else:
            ex.add(big, big)
    assert validation.PHYSICAL_MEMORY < big.size * 4


def test_silu_mul_gelu_rope_bad_input_is_named():
    """Wrong dtype, shape and parameters of the transformer element-wise ops: rejected before a kernel
    runs, naming the op, the argument and what it takes."""
    x = np.ones((2, 3, 4, 8), np.float32)
    pos = np.arange(4)
    with pytest.raises(ValueError, match=r"silu_mul: shapes do not match: gate \(2, 3\) vs up \(3,\)"):
        ex.silu_mul(np.ones((2, 3)), np.ones(3))
    with pytest.raises(TypeError, match="silu_mul: argument 'up' has dtype complex64"):
        ex.silu_mul(np.ones(3), np.ones(3, np.complex64))
    with pytest.raises(TypeError, match="gelu: argument 'x' has dtype <U1"):
        ex.gelu(np.array(["a"]))
    for bad in ("erf", "TANH", None, True):
        with pytest.raises(ValueError, match="gelu: approximate must be one of 'none', 'tanh'"):
            ex.gelu(np.ones(3), approximate=bad)
    with pytest.raises(ValueError, match=r"rope: x must be 4-d .* or 3-d .*got shape \(4, 8\)"):
        ex.rope(np.ones((4, 8)), pos)
    with pytest.raises(ValueError, match="head_dim .* must be even, got 7"):
        ex.rope(np.ones((1, 2, 4, 7)), pos)
    with pytest.raises(ValueError, match=r"rope: shapes do not match: x \(2, 3, 4, 8\) vs positions \(5,\)"):
        ex.rope(x, np.arange(5))
    with pytest.raises(ValueError, match=r"positions must be \(seq,\)\)"):
        ex.rope(np.ones((3, 4, 8)), np.zeros((1, 4), np.int64))   # per-batch positions need a batch axis
    with pytest.raises(TypeError, match="rope: positions must be an integer array, got dtype float64"):
        ex.rope(x, np.arange(4.0))
    with pytest.raises(TypeError, match="rope: argument 'x' has dtype complex128"):
        ex.rope(x.astype(np.complex128), pos)
    with pytest.raises(ValueError, match="rope: style must be one of 'neox', 'gptj', got 'norm'"):
        ex.rope(x, pos, style="norm")
    for kw, msg in (({"base": 0.0}, "base must be > 0"), ({"scale": -1.0}, "scale must be > 0"),
                    ({"base": np.inf}, "base must be finite"), ({"scale": np.nan}, "scale must be finite"),
                    ({"scale": "2"}, "scale must be a real scalar"), ({"base": None}, "base must be a real scalar")):
        with pytest.raises((ValueError, TypeError), match="rope: " + msg):
            ex.rope(x, pos, **kw)
    with pytest.raises(TypeError):
        ex.rope(x, pos, 10000.0)   # base, scale and style are keywords only (the documented signature)
    # the results of empty inputs are empty, in their dtype
    assert ex.silu_mul(np.ones((0, 3), np.float16), np.ones((0, 3), np.float16)).dtype == np.float16
    assert ex.gelu(np.ones((3, 0))).shape == (3, 0)
    assert ex.rope(np.ones((2, 0, 4, 8), np.float32), pos).shape == (2, 0, 4, 8)


def test_out_must_be_exactly_the_results_array():
    """out= of silu_mul, gelu and rope: refused, naming the op, unless a writable host array of the
    result's shape and dtype that is an input itself or shares no memory with one; then returned holding
    the result (in place included), and an empty out stays empty."""
    x = np.linspace(-3, 3, 2 * 3 * 4 * 8, dtype=np.float32).reshape(2, 3, 4, 8)
    pos = np.arange(4)
    calls = {"rope": lambda a, **kw: ex.rope(a, pos, **kw), "gelu": lambda a, **kw: ex.gelu(a, **kw),
             "silu_mul": lambda a, **kw: ex.silu_mul(a, x[::-1].copy(), **kw)}
    for op, call in calls.items():
        want = call(x)
        with pytest.raises(ValueError, match=rf"{op}: shapes do not match: out \(2, 3, 4, 4\) vs the result"):
            call(x, out=np.empty((2, 3, 4, 4), np.float32))
        with pytest.raises(TypeError, match=f"{op}: out has dtype float64, the result's is float32"):
            call(x, out=np.empty(x.shape))
        with pytest.raises(TypeError, match=f"{op}: out must be a host NumPy array.*got list"):
            call(x, out=x.tolist())
        with pytest.raises(ValueError, match=f"{op}: out must be C-contiguous"):
            call(x, out=np.empty(x.shape[::-1], np.float32).T)
        ro = np.empty_like(x)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match=f"{op}: out is read-only"):
            call(x, out=ro)
        # x and out one row of 8 apart in one buffer: writing out would overwrite x's next row before it is read
        buf = np.zeros(x.size + 8, np.float32)
        shifted = buf[8:].reshape(x.shape)
        shifted[...] = x
        with pytest.raises(ValueError, match=f"{op}: out overlaps (x|gate) without being it"):
            call(shifted, out=buf[:-8].reshape(x.shape))
        out = np.empty_like(x)
        assert call(x, out=out) is out
        np.testing.assert_array_equal(out, want)
        mine = x.copy()
        assert call(mine, out=mine) is mine
        np.testing.assert_array_equal(mine, want)
    buf = np.zeros(x.size + 8, np.float32)
    up = buf[8:].reshape(x.shape)
    with pytest.raises(ValueError, match="silu_mul: out overlaps up without being it"):
        ex.silu_mul(x, up, out=buf[:-8].reshape(x.shape))
    empty = np.ones((2, 0, 4, 8), np.float32)
    assert ex.rope(empty, pos, out=empty) is empty
