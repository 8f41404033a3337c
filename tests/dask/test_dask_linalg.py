"""hipsched.dask matmul, attention, dequantize and qmatmul on the session's 2-process LocalCluster (worker
"0" with the fake GPU, which runs matmul and attention through the CPU kernels, worker "1" without).

Equality with the single-machine ops:
- attention: each (batch, head) slice is computed on its own by the kernel, whole sequences in one block,
  so the distributed result is bit-identical.
- dequantize, qmatmul: the CPU kernel computes each row on its own (its blocks in order), so a chunk of
  rows gives those rows' single-machine values: bit-identical.
- matmul: BLAS picks its blocking (and so its summation order) from the operands' shapes, which a chunk
  changes; with the contraction axis in c chunks the c partial products are also summed in a tree. Every
  element is then within 2 gamma_(k+c) (|a| @ |b|) of the single-machine value, gamma_m = m u / (1 - m u),
  u = 2^-24: each of the two results is within gamma_(k+c) (|a| @ |b|) of the exact product (a sum of k
  products in any order, plus c - 1 additions of partial sums)."""
import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
import dask_support  # noqa: E402
from dask_support import FakeGpuFactory, computed, job_fixture, same_bits  # noqa: E402
from half_formats import TYPE_IDS, TYPES, UNIT  # noqa: E402
from hipsched.ops.quant import QuantizedTensor  # noqa: E402

U = 2.0 ** -24


def gamma(m):
    return m * U / (1 - m * U)


job = job_fixture("linalg", executor_factory=FakeGpuFactory(gpu_workers=("0",)))


@pytest.fixture
def no_task_runs(dask_client):
    with dask_support.no_task_runs(dask_client):
        yield


rng = np.random.default_rng(21)
A = rng.standard_normal((3, 90, 70)).astype(np.float32)
B = rng.standard_normal((3, 70, 40)).astype(np.float32)


def chunked(x, chunks):
    return da.from_array(x, chunks=chunks)


# a, b, and the chunks of each (None: a NumPy operand)
MATMUL_CASES = {
    "rows": (A[0], B[0], (25, 70), (70, 40)),
    "rows-and-columns": (A[0], B[0], (25, 70), (70, 15)),
    "contraction-chunked": (A[0], B[0], (40, 30), (20, 40)),        # unified to 4 chunks of k
    "numpy-b": (A[0], B[0], (17, 70), None),
    "batch-both": (A, B, (2, 30, 70), (1, 70, 40)),
    "batch-a-only": (A, B[0], (1, 45, 35), (35, 40)),
    "batch-b-only": (A[0], B, (50, 70), (2, 70, 40)),
    "vector-a": (A[0, 0], B[0], (70,), (70, 13)),
    "vector-b": (A[0], B[0, :, 0], (31, 70), (35,)),
    "vector-vector": (A[0, 0], B[0, :, 0], (20,), (70,)),
}


@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_matmul_within_the_float32_bound(dask_client, job, case):
    a, b, ca, cb = MATMUL_CASES[case]
    ad, bd = chunked(a, ca), (b if cb is None else chunked(b, cb))
    out = hd.matmul(ad, bd)
    ref = hs.matmul(a, b)
    assert out.shape == np.shape(ref) and out.dtype == np.float32
    got = out.compute()
    assert got.dtype == np.float32 and got.shape == np.shape(ref)
    k = a.shape[-1]
    # c: chunks of the contraction once a's and b's are unified (the union of their cuts)
    cuts = set(np.cumsum(ad.chunks[-1])) | (set() if cb is None else set(np.cumsum(bd.chunks[-2 if b.ndim > 1 else 0])))
    c = len(cuts)
    bound = 2 * gamma(k + c) * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert np.all(np.abs(got.astype(np.float64) - ref) <= bound)


def test_matmul_keeps_the_row_chunks(dask_client, job):
    out = hd.matmul(chunked(A[0], (25, 70)), B[0])
    assert out.chunks == ((25, 25, 25, 15), (40,))


def test_matmul_bad_input_fails_on_the_client(dask_client, job, no_task_runs):
    a = chunked(A[0], (30, 70))
    with pytest.raises(ValueError, match=r"matmul: shapes do not match: a \(90, 70\) vs b \(69, 40\) \(a's last axis "
                                         r"\(70\) must equal b's second-to-last axis \(69\)\)"):
        hd.matmul(a, np.ones((69, 40), np.float32))
    with pytest.raises(ValueError, match="batch axes must be equal or on one side only"):
        hd.matmul(chunked(A, (1, 90, 70)), chunked(B[:2], (1, 70, 40)))
    with pytest.raises(ValueError, match="operands must be at least 1-d"):
        hd.matmul(a, da.from_array(np.float32(1)))
    with pytest.raises(TypeError, match="at least one of a, b must be a dask array"):
        hd.matmul(A[0], B[0])
    with pytest.raises(TypeError, match="argument 'b' has dtype complex64"):
        hd.matmul(a, chunked(B[0].astype(np.complex64), (70, 40)))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_bit_identical(dask_client, job, causal):
    r = np.random.default_rng(3)
    q = r.standard_normal((3, 4, 37, 16)).astype(np.float32)
    k = r.standard_normal((3, 4, 53, 16)).astype(np.float32)
    v = r.standard_normal((3, 4, 53, 16)).astype(np.float32)
    qd = chunked(q, (1, 3, 37, 16))
    kd, vd = chunked(k, (2, 2, 53, 16)), chunked(v, (3, 1, 53, 16))   # rechunked to q's batch/head chunks
    out = hd.attention(qd, kd, vd, causal=causal)
    assert out.shape == q.shape and out.chunks[2:] == ((37,), (16,))
    np.testing.assert_array_equal(out.compute(), hs.attention(q, k, v, causal=causal))
    np.testing.assert_array_equal(hd.attention(qd, kd, vd, causal=causal, scale=0.3).compute(),
                                  hs.attention(q, k, v, causal=causal, scale=0.3))


@pytest.mark.parametrize("dtype", list(TYPES), ids=TYPE_IDS)
def test_matmul_and_attention_keep_each_float_type(dask_client, job, dtype):
    """A float16 or bfloat16 matmul and attention give results of that type: attention the single-machine
    bits, matmul within the float32 bound of the sums (see above) plus one rounding to the type on each
    side."""
    rng = np.random.default_rng(43)
    dt = TYPES[dtype]
    a = rng.standard_normal((50, 64)).astype(dt)
    b = rng.standard_normal((64, 30)).astype(dt)
    ref = hs.matmul(a, b)
    mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    for ca in ((10, 64), (10, 16)):   # the contraction whole, then in 4 chunks (partial sums in float32)
        got = computed(hd.matmul(da.from_array(a, chunks=ca), da.from_array(b, chunks=(ca[1], 30))))
        assert got.dtype == ref.dtype == np.dtype(dt)
        err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        assert np.all(err <= 2 * UNIT[dtype] * np.abs(ref.astype(np.float64)) + 2 * 70 * U * mag)
    q = rng.standard_normal((2, 4, 33, 16)).astype(dt)
    k = rng.standard_normal((2, 4, 40, 16)).astype(dt)
    v = rng.standard_normal((2, 4, 40, 16)).astype(dt)
    for causal in (False, True):
        got = computed(hd.attention(da.from_array(q, chunks=(1, 2, 33, 16)), da.from_array(k, chunks=(1, 2, 40, 16)),
                                    da.from_array(v, chunks=(1, 2, 40, 16)), causal=causal))
        same_bits(got, hs.attention(q, k, v, causal=causal))


def test_attention_bad_input_fails_on_the_client(dask_client, job, no_task_runs):
    q = chunked(np.zeros((2, 2, 8, 4), np.float32), (1, 1, 8, 4))
    k = chunked(np.zeros((2, 2, 6, 4), np.float32), (1, 1, 6, 4))
    with pytest.raises(ValueError, match=r"q \(2, 2, 8, 4\) is chunked along seq or head_dim .*"
                                         r"q.rechunk\(\{2: -1, 3: -1\}\)"):
        hd.attention(q.rechunk((1, 1, 4, 4)), k, k)
    with pytest.raises(ValueError, match=r"k \(2, 2, 6, 4\) is chunked along seq or head_dim"):
        hd.attention(q, k.rechunk((1, 1, 6, 2)), k)
    with pytest.raises(ValueError, match=r"attention: shapes do not match: k \(2, 2, 6, 4\) vs v \(2, 2, 5, 4\)"):
        hd.attention(q, k, k[:, :, :5])
    with pytest.raises(ValueError, match="batch, heads and head_dim must agree"):
        hd.attention(q, k[:, :1], k[:, :1])
    with pytest.raises(ValueError, match="argument 'q' must be 4-d"):
        hd.attention(q[0], k, k)
    with pytest.raises(TypeError, match="causal must be a bool"):
        hd.attention(q, k, k, causal=1)
    with pytest.raises(ValueError, match="scale must be finite"):
        hd.attention(q, k, k, scale=float("inf"))
    with pytest.raises(TypeError, match="argument 'v' must be a dask array"):
        hd.attention(q, k, np.zeros((2, 2, 6, 4), np.float32))


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def quantized(request):
    W = np.random.default_rng(8).standard_normal((203, 96)).astype(np.float32)
    return hs.quantize(W, request.param)


def test_dequantize_and_qmatmul_are_bit_identical(dask_client, job, quantized):
    w = quantized
    r = np.random.default_rng(9)
    x1 = r.standard_normal(96).astype(np.float32)
    x2 = r.standard_normal((96, 5)).astype(np.float32)
    whole_deq, whole_1, whole_2 = hs.dequantize(w), hs.qmatmul(w, x1), hs.qmatmul(w, x2)
    blocks = [QuantizedTensor(w.data[a:b], (b - a, 96), w.qtype) for a, b in ((0, 64), (64, 65), (65, 203))]
    for wr in (hd.shard_rows(w, 50), hd.shard_rows(blocks)):
        assert wr.shape == w.shape and wr.qtype == w.qtype
        deq = hd.dequantize(wr)
        assert deq.chunks == (wr.chunks, (96,))
        np.testing.assert_array_equal(deq.compute(), whole_deq)
        out1 = hd.qmatmul(wr, x1)
        assert out1.chunks == (wr.chunks,)
        np.testing.assert_array_equal(out1.compute(), whole_1)
        # x as a chunked Dask array: sent to every task as one block
        out2 = hd.qmatmul(wr, chunked(x2, (40, 2)))
        assert out2.chunks == (wr.chunks, (5,))
        np.testing.assert_array_equal(out2.compute(), whole_2)
    assert hd.shard_rows(w, 50).chunks == (50, 50, 50, 50, 3)
    assert hd.shard_rows(blocks).chunks == (64, 1, 138)


def test_quantized_bad_input_fails_on_the_client(dask_client, job, quantized, no_task_runs):
    w = quantized
    wr = hd.shard_rows(w, 64)
    with pytest.raises(TypeError, match=r"w is a whole QuantizedTensor; shard it by rows first: .*shard_rows"):
        hd.qmatmul(w, np.ones(96, np.float32))
    with pytest.raises(TypeError, match="must be a QuantizedRows"):
        hd.dequantize(w.data)
    with pytest.raises(ValueError, match=r"qmatmul: shapes do not match: w \(203, 96\) vs x \(95,\)"):
        hd.qmatmul(wr, np.ones(95, np.float32))
    with pytest.raises(ValueError, match="argument 'x' must be 1-d or 2-d"):
        hd.qmatmul(wr, np.ones((96, 2, 2), np.float32))
    for bad in (0, 2.5, None, True):
        with pytest.raises(ValueError, match="rows_per_chunk must be an integer >= 1"):
            hd.shard_rows(w, bad)
    other = hs.quantize(np.ones((4, 96), np.float32), "q8_0" if w.qtype == "q4_0" else "q4_0")
    with pytest.raises(ValueError, match="block 1 is .* row blocks must share qtype and k"):
        hd.shard_rows([w, other])
    with pytest.raises(ValueError, match=r"a row's blocks must stay together: blocks.rechunk\(\{1: -1\}\)"):
        hd.QuantizedRows(da.from_array(np.array(w.data), chunks=(64, 7)), w.shape, w.qtype)
    with pytest.raises(ValueError, match=r"must be \(203, \d+\) bytes"):
        hd.QuantizedRows(da.from_array(np.array(w.data)[:, 1:]), w.shape, w.qtype)
