"""GPU quant / attention / spread_activation ops against independent references and the CPU engine.

Every test needs a real GPU (marked `gpu`, skipped elsewhere). Tolerances:
- dequantize: bit-exact vs the gguf package (and the CPU engine): both only scale int8s by an fp16.
- qmatmul: |gpu - ref| <= 2e-6 * k^0.5 * (|W| @ |x|) + 1e-30, ref = float64 product of the gguf-dequantized
  matrix and x (fp32 accumulation in a different order than the CPU; both are within this bound).
- attention: |gpu - ref| <= 2e-5 * (1 + |ref|), ref = float64 softmax(scale q k^T) v with the causal mask
  top-left aligned as torch SDPA(is_causal=True); the CPU engine the same.
- spread_activation: float atomics reorder sums, so random graphs compare at 1e-5 relative with
  threshold 0 (the rule is continuous there); dyadic weights and seeds make every partial sum exact, so
  the threshold cases compare bit-exactly.
"""
import math

import numpy as np
import pytest
from requires import need

from hipsched.ops import OPS

pytestmark = pytest.mark.gpu


def run_both(gpu, op, *args, **kwargs):
    """(gpu result, cpu result) for one prepared call."""
    from hipsched.backends.cpu import CpuBackend
    call = OPS[op].prepare(*args, **kwargs)
    return gpu.run(call), CpuBackend().run(OPS[op].prepare(*args, **kwargs))


# ------------------------------------------------------------------ quant

def raw_blocks(rng, n, k, qtype):
    """Random GGUF block bytes with every fp16 scale pattern reachable (subnormals, inf, NaN too)."""
    nb = n * (k // 32)
    if qtype == "q8_0":
        dt = np.dtype([("d", "<u2"), ("qs", "i1", 32)])
        blocks = np.zeros(nb, dt)
        blocks["qs"] = rng.integers(-128, 128, size=(nb, 32))
    else:
        dt = np.dtype([("d", "<u2"), ("qs", "u1", 16)])
        blocks = np.zeros(nb, dt)
        blocks["qs"] = rng.integers(0, 256, size=(nb, 16))
    blocks["d"] = rng.integers(0, 1 << 16, size=nb)
    return blocks.view(np.uint8)


def gguf_dequantize(w):
    gguf = need("gguf")
    t = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[w.qtype]
    if w.shape[0] == 0:  # gguf's q4_0 path cannot reshape an empty array
        return np.zeros(w.shape, np.float32)
    return np.asarray(gguf.quants.dequantize(np.asarray(w.data), t), dtype=np.float32).reshape(w.shape)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("n,k", [(0, 32), (1, 32), (7, 96), (33, 64), (9, 4096)])
def test_dequantize_matches_gguf_and_cpu_bit_exact(gpu, rng, qtype, n, k):
    from hipsched.ops.quant import QuantizedTensor
    w = QuantizedTensor(raw_blocks(rng, n, k, qtype), (n, k), qtype)
    got, cpu = run_both(gpu, "dequantize", w)
    assert got.shape == (n, k) and got.dtype == np.float32
    np.testing.assert_array_equal(got, gguf_dequantize(w))
    np.testing.assert_array_equal(got, cpu)


def quantized(rng, n, k, qtype):
    import hipsched as hs
    return hs.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


def check_product(got, w, x):
    wf = gguf_dequantize(w).astype(np.float64)
    ref = wf @ x.astype(np.float64)
    bound = 2e-6 * math.sqrt(max(w.shape[1], 1)) * (np.abs(wf) @ np.abs(x.astype(np.float64))) + 1e-30
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) / bound))


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("n,k", [(0, 32), (1, 32), (7, 64), (8, 96), (9, 32), (31, 64), (33, 4096), (130, 256)])
@pytest.mark.parametrize("m", [None, 1, 3, 8, 9, 70])
def test_qmatmul_matches_reference_and_cpu(gpu, rng, qtype, n, k, m):
    w = quantized(rng, n, k, qtype)
    x = rng.standard_normal((k,) if m is None else (k, m)).astype(np.float32)
    got, cpu = run_both(gpu, "qmatmul", w, x)
    check_product(got, w, x)
    check_product(cpu, w, x)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_qmatmul_device_inputs_give_device_results(gpu, rng, qtype):
    from hipsched.gpu.memory.device_array import DeviceArray, to_device
    w = quantized(rng, 37, 128, qtype)
    x = rng.standard_normal(128).astype(np.float32)
    out = gpu.run(OPS["qmatmul"].prepare(w, to_device(x)))
    assert isinstance(out, DeviceArray) and out.shape == (37,)
    check_product(out.get(), w, x)
    # A device x whose base is not 16-byte aligned (a view 4 bytes into a buffer) takes the copy path.
    buf = to_device(np.concatenate([[np.float32(0)], x]))
    view = DeviceArray(buf.ptr + 4, (128,), np.float32, buf.runtime, owner=buf)
    out = gpu.run(OPS["qmatmul"].prepare(w, view))
    check_product(out.get(), w, x)
    xm = rng.standard_normal((128, 5)).astype(np.float32)
    out = gpu.run(OPS["qmatmul"].prepare(w, to_device(xm)))
    assert isinstance(out, DeviceArray) and out.shape == (37, 5)
    check_product(out.get(), w, xm)


def test_qmatmul_weights_stay_resident(gpu, rng):
    from hipsched.gpu.memory.device_array import to_device
    w = quantized(rng, 64, 256, "q8_0")
    x = to_device(rng.standard_normal(256).astype(np.float32))  # device x: only w uses the cache
    first = gpu.run(OPS["qmatmul"].prepare(w, x)).get()
    hits = gpu._ctx.resident.hits
    again = gpu.run(OPS["qmatmul"].prepare(w, x)).get()
    assert gpu._ctx.resident.hits == hits + 1
    np.testing.assert_array_equal(again, first)
    w2 = quantized(rng, 64, 256, "q8_0")  # another tensor is never served from w's device copy
    check_product(gpu.run(OPS["qmatmul"].prepare(w2, x)).get(), w2, x.get())


# ------------------------------------------------------------------ attention

def attention_ref(q, k, v, causal, scale):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    sq, sk = q.shape[2], k.shape[2]
    out = np.zeros(q.shape)
    if sk == 0 or sq == 0:
        return out
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v)


def check_attention(got, ref, tol=2e-5):
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.all(np.abs(got - ref) <= tol * (1 + np.abs(ref))), float(np.max(np.abs(got - ref)))


@pytest.mark.parametrize("hd", [1, 7, 8, 33, 64, 100, 128, 200, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_head_dims(gpu, rng, hd, causal):
    q, k, v = (rng.standard_normal((2, 3, 37, hd)).astype(np.float32) for _ in range(3))
    got, cpu = run_both(gpu, "attention", q, k, v, causal=causal)
    ref = attention_ref(q, k, v, causal, 1 / math.sqrt(hd))
    check_attention(got, ref)
    check_attention(cpu, ref)


@pytest.mark.parametrize("sq,sk", [(0, 5), (1, 1), (7, 7), (31, 33), (33, 31), (1, 130), (130, 1), (5, 0),
                                   (300, 300)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_sequence_lengths(gpu, rng, sq, sk, causal):
    q = rng.standard_normal((1, 2, sq, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, sk, 64)).astype(np.float32) for _ in range(2))
    got, cpu = run_both(gpu, "attention", q, k, v, causal=causal, scale=0.3)
    ref = attention_ref(q, k, v, causal, 0.3)
    check_attention(got, ref)
    check_attention(cpu, ref)


def test_attention_device_arrays_and_large_scores(gpu, rng):
    from hipsched.gpu.memory.device_array import DeviceArray, to_device
    q, k, v = (rng.standard_normal((1, 4, 65, 32)).astype(np.float32) * 4 for _ in range(3))
    out = gpu.run(OPS["attention"].prepare(to_device(q), to_device(k), to_device(v), causal=True, scale=2.0))
    assert isinstance(out, DeviceArray)
    # Scores reach a few hundred: fp32 rounding of a score s moves its weight by ~s * 6e-8 relative.
    check_attention(out.get(), attention_ref(q, k, v, True, 2.0), tol=5e-4)


def test_attention_head_dim_over_limit_is_gpu_error(gpu, rng):
    from hipsched.errors import GpuError
    q = rng.standard_normal((1, 1, 4, 257)).astype(np.float32)
    with pytest.raises(GpuError) as e:
        gpu.run(OPS["attention"].prepare(q, q, q))
    assert e.value.kind == "unsupported"


# ------------------------------------------------------------------ spread_activation

def spread_ref(indptr, indices, weights, seeds, decay, steps, threshold):
    n = len(seeds)
    a = np.asarray(seeds, np.float64)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    for _ in range(steps):
        acc = np.zeros(n)
        np.add.at(acc, indices, weights.astype(np.float64) * a[rows])
        a = np.clip(a + decay * acc, 0.0, 1.0)
        a[a < threshold] = 0.0
    return a


def random_csr(rng, n, nnz, idx_dtype, dyadic=False):
    rows = np.sort(rng.integers(0, n, size=nnz)) if n else np.zeros(0, np.int64)
    indptr = np.zeros(n + 1, np.int64)
    np.add.at(indptr, rows + 1, 1)
    indptr = np.cumsum(indptr)
    indices = (rng.integers(0, n, size=nnz) if n else np.zeros(0)).astype(idx_dtype)
    if dyadic:
        weights = rng.integers(-4, 9, size=nnz).astype(np.float32) / 8
    else:
        weights = rng.random(nnz).astype(np.float32)
    return indptr, indices, weights


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n,nnz", [(0, 0), (1, 0), (1, 3), (10, 0), (50, 400), (1000, 20000)])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_spread_activation_random_graphs(gpu, rng, idx_dtype, n, nnz, steps):
    indptr, indices, weights = random_csr(rng, n, nnz, idx_dtype)
    seeds = np.where(rng.random(n) < 0.2, rng.random(n), 0).astype(np.float32)
    got, cpu = run_both(gpu, "spread_activation", (indptr, indices, weights), seeds, decay=0.3, steps=steps,
                        threshold=0.0)
    ref = spread_ref(indptr, indices, weights, seeds, 0.3, steps, 0.0)
    assert got.shape == (n,) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cpu, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threshold", [0.0, 0.25, 0.5])
def test_spread_activation_threshold_exact(gpu, rng, threshold):
    n = 300
    # 3000 random edges on 300 nodes: self loops and duplicate edges occur (checked below)
    indptr, indices, weights = random_csr(rng, n, 3000, np.int64, dyadic=True)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    assert np.any(rows == indices) and len(set(zip(rows, indices))) < len(rows)
    seeds = (rng.integers(0, 9, size=n) / 8).astype(np.float32)
    got, cpu = run_both(gpu, "spread_activation", (indptr, indices, weights), seeds, decay=0.5, steps=2,
                        threshold=threshold)
    ref = spread_ref(indptr, indices, weights, seeds, 0.5, 2, threshold)
    np.testing.assert_array_equal(got, ref.astype(np.float32))
    np.testing.assert_array_equal(cpu, ref.astype(np.float32))


def test_spread_activation_self_loops_duplicates_and_scipy(gpu):
    sp = need("scipy.sparse")
    rows = np.array([0, 0, 1, 1, 1, 3])
    cols = np.array([0, 0, 2, 2, 2, 3])
    vals = np.array([0.5, 0.25, 0.125, 0.125, 0.25, 1.0], np.float32)
    g = sp.csr_matrix((vals, (rows, cols)), shape=(5, 5))  # duplicates summed by SciPy
    seeds = np.array([0.5, 1.0, 0.0, 0.25, 0.0], np.float32)
    got, cpu = run_both(gpu, "spread_activation", g, seeds, decay=0.5, steps=3, threshold=0.0)
    ref = spread_ref(g.indptr.astype(np.int64), g.indices, g.data, seeds, 0.5, 3, 0.0)
    np.testing.assert_array_equal(got, ref.astype(np.float32))
    np.testing.assert_array_equal(cpu, ref.astype(np.float32))


def test_spread_activation_int32_pair_and_special_values(gpu):
    """SciPy-style int32 indptr+indices; an inf weight out of an inactive node makes its target NaN, as
    SciPy's A.T @ a gives (0 * inf) and the CPU engine does; a NaN seed propagates as the CPU rule says
    (np.clip keeps NaN)."""
    indptr = np.array([0, 2, 3, 4, 4], np.int32)
    indices = np.array([1, 2, 3, 0], np.int32)
    weights = np.array([0.5, np.inf, 0.25, 1.0], np.float32)
    seeds = np.array([0.0, 0.5, 0.0, 0.0], np.float32)  # node 0 (inf edge) inactive
    got, cpu = run_both(gpu, "spread_activation", (indptr, indices, weights), seeds, decay=1.0, steps=1)
    sp = need("scipy.sparse")
    with np.errstate(invalid="ignore"):
        pushed = sp.csr_matrix((weights, indices, indptr), shape=(4, 4)).T @ seeds
    np.testing.assert_array_equal(got, np.clip(seeds + pushed, 0.0, 1.0).astype(np.float32))   # [0, .5, nan, .125]
    np.testing.assert_array_equal(got, cpu)
    seeds = np.array([0.0, np.nan, 0.0, 0.0], np.float32)
    got, cpu = run_both(gpu, "spread_activation", (indptr, indices, weights), seeds, decay=1.0, steps=2)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(cpu))
    assert np.isnan(got[1]) and np.isnan(got[3])
