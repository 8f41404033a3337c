"""The GPU kernels and their launch glue, run on the CPU by tests/support/gpu_emulator.py, against the CPU engine.
Real kernel sources, real GpuBackend/GpuContext/glue; only the device is emulated. Covers what compile
checks cannot: reductions, shuffles, multi-pass top-k, tails, float4/scalar variants, for warp 32
(NVIDIA) and warp 64 (AMD gfx9). Shapes are small: every block is OS threads. The vendor BLAS is off
(HIPSCHED_BLAS=none) so matmul runs our tiled kernel. Tolerances as in test_gpu_ops.py.

The tests a real GPU runs too (tests/gpu/device/test_gpu_ops.py) are tests/support/kernel_cases.py's,
collected here by importing them; the emulator's own are below. A test taking `dtype` runs in float32 and
in float16 and bfloat16 (pytest_generate_tests below). The half kernels are the float32 templates with
2-byte loads and stores, so besides the outside reference a half result must be the float32 kernel's
result on the widened inputs rounded once to the half type, bit for bit; float32 results are compared with
the CPU engine instead (kernel_cases.py states the references and the half bounds' terms)."""
import numpy as np
import pytest
from half_formats import HALF, TINY, TYPES, UNIT, assert_same_halves, rounded
from requires import need

import gpu_emulator
from hipsched.backends.gpu import GpuBackend
from hipsched.ops import OPS
from kernel_cases import (  # noqa: F401  (the shared tests, collected here with this module's `emu`)
    test_add_scale, test_attention_head_classes, test_cosine, test_device_in_device_out,
    test_half_dtype_without_kernels_is_refused, test_half_overflow_nan_inf, test_half_qmatmul, test_half_qmatmul_device_x,
    test_half_supports_table, test_matmul_tiled_kernel, test_rms_norm, test_softmax, test_softmax_nan_inf, test_top_k)
from kernel_cases import (CPU, _attention_f64, _attention_kernel, _emu_f32, _softmax_bound, assert_attention_contract,
                          assert_rms_norm, attention_contract, both, gguf_dequantized, half_call, parametrize_dtype,
                          qmatmul_bound, same)

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


@pytest.fixture(scope="module", params=[32, 64], ids=["warp32", "warp64"])
def emu(request, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HIPSCHED_BLAS", "none")
    rt = gpu_emulator.EmuRuntime(request.param)
    be = GpuBackend({"kernel_cache_dir": str(tmp_path_factory.mktemp("kernels"))}, runtime=rt)
    assert be.available, be.unavailable_reason
    yield be
    be.close()
    rt.close()
    mp.undo()


def pytest_generate_tests(metafunc):
    parametrize_dtype(metafunc, list(TYPES))


def test_rms_norm_nan_inf_empty(emu):
    x = np.array([[1, 2, np.nan, 4], [1, np.inf, 3, 4], [0, 0, 0, 0], [1e30, -1e30, 3, 0]], np.float32)
    w = np.array([1, -2, 0.5, 3], np.float32)
    g, c = both(emu, "rms_norm", x, w)
    np.testing.assert_array_equal(g, c)
    for shape in ((0, 4), (3, 0)):
        g, c = both(emu, "rms_norm", np.zeros(shape, np.float32), np.ones(shape[-1], np.float32))
        assert g.shape == c.shape == shape


def test_cosine_zero_nan_extreme(emu):
    T = np.array([[0, 0, 0, 0], [1, 2, 3, 4], [np.nan, 1, 1, 1], [np.inf, 0, 0, 0], [1e-30, 0, 0, 0],
                  [1e20, 1e20, 0, 0]], np.float32)
    for q in ([0, 0, 0, 0], [1, 0, 0, 0], [np.nan, 0, 0, 0], [1e-25, 2e-25, 0, 0]):
        g, c = both(emu, "cosine_similarity", np.array(q, np.float32), T)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
        np.testing.assert_allclose(g[~np.isnan(c)], c[~np.isnan(c)], atol=1e-6)


def test_top_k_ties_nan(emu, rng):
    # 6 pairs of exact ties plus a NaN, all ranked (k = n), for two queries
    base = rng.standard_normal((6, 5)).astype(np.float32)
    T = np.concatenate([base, base])
    T[3] = np.nan
    Q = rng.standard_normal((2, 5)).astype(np.float32)
    (gi, gs), (ci, cs) = both(emu, "top_k", Q, T, 12)
    np.testing.assert_array_equal(gi, ci)                   # exact ties to the lower index, NaN last
    assert (gi[:, -1] == 3).all()


# (n, k) of the quant kernel tests: 69 rows leave a partial pair of rows for the one-column mat-vec, a
# partial 16-row block for the several-column one and a partial 64-row tile; k = 64 is one superblock,
# mostly padding; 37 x 1056 has two superblocks per row for Q8_0 (512 weights each), one full and one
# partial for Q4_0 (1024), and more than one 32-lane step of the tiles
QUANT_SHAPES = ((69, 64), (37, 1056))


# x columns: the vector; the several-column mat-vec with 2, 8 (one column chunk) and 16 (two); 17 and
# 70, the 64x64 tiles (70: a partial column tile)
QUANT_COLUMNS = (1, 2, 8, 16, 17, 70)


# Every kernel runs in this file at least once (the ones below are reached by no test above), because
# this file is also what CI's memcheck and racecheck steps run (docs/design/emulator-and-proof.md).

@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_quant_kernels(emu, rng, qtype):
    """dequantize, and qmatmul's three kernels on the repacked device layout, against gguf's
    dequantization (bit for bit), a float64 product and the CPU engine."""
    from hipsched import quantize
    for n, k in QUANT_SHAPES:
        W = quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
        Wf = gguf_dequantized(W)
        g, c = both(emu, "dequantize", W)
        np.testing.assert_array_equal(g, c)
        np.testing.assert_array_equal(g, Wf)
        for m in QUANT_COLUMNS:
            if k > 64 and m == 70:
                continue   # the tiles' column tail is the same at either k; spare the emulator
            x = rng.standard_normal((k,) if m == 1 else (k, m)).astype(np.float32)
            g, c = both(emu, "qmatmul", W, x)
            assert g.shape == c.shape
            # both within the float32 bound of the float64 product, so within twice it of each other (the
            # summation orders differ: a 1056-long sum of magnitude ~700 differs by ~4e-5)
            ref = Wf.astype(np.float64) @ x.astype(np.float64)
            bound = qmatmul_bound(Wf, x)
            np.testing.assert_array_less(np.abs(g - ref), bound)
            np.testing.assert_array_less(np.abs(g - c.astype(np.float64)), 2 * bound)
            if k == 64:
                np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-5)


def test_quant_device_layout_round_trip(rng):
    """The repacked device layout (quant.hip's header) holds gguf's blocks bit for bit: device_layout then
    host_layout gives them back; its size is gguf_blocks.device_bytes (rows padded to whole superblocks);
    and each weight read where the header says (superblock k // S, lane (k % 128) // 4, group
    (k % S) // 128, byte k % 4; its scale at (lane // 8) NG + group) is gguf's dequantized value."""
    from hipsched import quantize
    from hipsched.gguf_blocks import BLOCK_BYTES, SUPERBLOCK, device_bytes
    from hipsched.gpu.glue.quant import device_layout, host_layout
    for qtype in ("q8_0", "q4_0"):
        S, ng, sbb = SUPERBLOCK[qtype] * 32, 4 if qtype == "q8_0" else 8, SUPERBLOCK[qtype] * BLOCK_BYTES[qtype]
        for n, k in ((1, 32), (3, 64), (5, 512), (2, 1024), (4, 1056), (2, 3072 + 32)):
            W = quantize(rng.standard_normal((n, k)).astype(np.float32) * 3, qtype)
            dev = device_layout(W.data, qtype)
            assert dev.dtype == np.uint8 and dev.nbytes == device_bytes(n, k, qtype) == n * -(-k // S) * sbb
            assert (dev.nbytes == W.nbytes) == (k % S == 0)
            np.testing.assert_array_equal(host_layout(dev, n, k, qtype), W.data)
            rows = dev.reshape(n, -1)
            kk = np.arange(k)
            s, r = kk // S, kk % S
            g, lane, c = r // 128, (r % 128) // 4, r % 4
            base = s * sbb
            if qtype == "q8_0":
                q = rows[:, base + 16 * lane + 4 * g + c].astype(np.float32) - 128
            else:
                q = ((rows[:, base + 16 * lane + 4 * (g // 2) + c] >> (4 * (g % 2))) & 15).astype(np.float32) - 8
            sp = base + 512 + 2 * ((lane // 8) * ng + g)
            d = (rows[:, sp].astype(np.uint16) | (rows[:, sp + 1].astype(np.uint16) << 8)).view(np.float16)
            np.testing.assert_array_equal(q * d.astype(np.float32), gguf_dequantized(W))


@pytest.mark.parametrize("hd", [40, 100], ids=["d64", "d128"])
def test_attention_query_blocks_and_key_tiles(emu, rng, hd):
    """More query rows than a block holds (128 at d64, 64 at d128, the last block partial) and keys over
    several shared tiles (the last partial): the key chunks every row of a thread sees run without a
    test per key, those on the causal diagonal or past Sk with one, and both must agree with float64."""
    q = rng.standard_normal((1, 1, 150, hd)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 141, hd)).astype(np.float32) for _ in range(2))
    for causal in (False, True):
        g, c = both(emu, "attention", q, k, v, causal=causal)
        np.testing.assert_allclose(g, c, rtol=2e-5, atol=2e-6)
        ref = _attention_f64(q, k, v, causal)
        np.testing.assert_array_less(np.abs(g - ref), 2e-5 * (1 + np.abs(ref)))


@pytest.mark.parametrize("index", [np.int32, np.int64])   # the _i32 and _i64 push kernels
def test_spread_activation(emu, rng, index):
    from graph_data import random_graph
    indptr, indices, weights = random_graph(rng, 40, 200)
    graph = (indptr.astype(index), indices.astype(index), weights * np.float32(0.5))
    seeds = np.zeros(40, np.float32)
    seeds[:4] = 1
    g, c = both(emu, "spread_activation", graph, seeds, 0.5, 3, 0.01)
    np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)
    # the rule of ops/graph.py in float64 through SciPy's sparse product (duplicate edges add up)
    sparse = need("scipy.sparse", reason="SciPy's sparse matrices are the reference (test extra)")
    A = sparse.csr_matrix((graph[2].astype(np.float64), indices, indptr), shape=(40, 40))
    a = seeds.astype(np.float64)
    for _ in range(3):
        a = np.clip(a + 0.5 * (A.T @ a), 0, 1)
        a[a < 0.01] = 0
    np.testing.assert_allclose(g, a, rtol=1e-5, atol=1e-6)


def test_spread_activation_non_finite_weights_of_inactive_nodes(emu, rng):
    """The push kernel skips a row whose activation is 0, but 0 * NaN and 0 * inf are NaN in SciPy's
    A.T @ a: such a row's non-finite weights must still reach their targets (first step, and a node
    active in one step and back at 0 in the next)."""
    from graph_data import random_graph
    indptr, indices, weights = random_graph(rng, 60, 400, isolated=6)
    weights = weights * np.float32(0.4)
    bad = rng.choice(weights.size, 9, replace=False)
    weights[bad[:3]], weights[bad[3:6]], weights[bad[6:]] = np.nan, np.inf, -np.inf
    seeds = np.where(rng.random(60) < 0.1, rng.random(60), 0).astype(np.float32)
    sparse = need("scipy.sparse", reason="SciPy's sparse matrices are the reference (test extra)")
    A = sparse.csr_matrix((weights.astype(np.float64), indices, indptr), shape=(60, 60))
    for steps in (1, 2):
        g, c = both(emu, "spread_activation", (indptr, indices, weights), seeds, 0.5, steps, 0.01)
        a = seeds.astype(np.float64)
        with np.errstate(invalid="ignore"):
            for _ in range(steps):
                a = np.clip(a + 0.5 * (A.T @ a), 0, 1)
                a[a < 0.01] = 0
        assert np.isnan(a).any()
        np.testing.assert_array_equal(np.isnan(g), np.isnan(a))
        np.testing.assert_array_equal(np.isnan(c), np.isnan(a))
        ok = ~np.isnan(a)
        np.testing.assert_allclose(g[ok], a[ok], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("w", [np.inf, -np.inf])
def test_spread_activation_inf_weight_of_a_node_that_falls_inactive(emu, w):
    """Node 0 is active in step 1 (its inf weight sends node 1 to +-inf, clamped) and under the threshold
    after it: in step 2 SciPy's 0 * inf makes node 1 NaN. Only a kernel that remembers the first step's
    non-finite product reads node 0's weights again."""
    graph = (np.array([0, 1, 1, 1], np.int64), np.array([1], np.int64), np.array([w], np.float32))
    seeds = np.array([0.005, 0.0, 0.0], np.float32)
    g, c = both(emu, "spread_activation", graph, seeds, 0.5, 2, 0.01)
    np.testing.assert_array_equal(np.isnan(g), [False, True, False])
    np.testing.assert_array_equal(np.isnan(c), [False, True, False])


# ------------------------------------------------------------------ 16-byte paths and their fallbacks
# The bandwidth-bound kernels move 8-element packs in 16-byte accesses (_v8 elementwise kernels; softmax
# and rms_norm rows held in registers, _p1/_p2/_p4 packs per thread) when every pointer is 16-byte
# aligned, and fall back to the scalar / shared-memory kernels otherwise. Each test below says which
# kernel the glue launched (its name is the path) and checks the result against the outside reference.
@pytest.fixture
def launched(emu, monkeypatch):
    """The names of the kernels the glue runs, in order."""
    names, ctx = [], emu._ctx
    real = ctx.run

    def run(launch, args, stream=0):
        names.append(launch.kernel)
        return real(launch, args, stream)
    monkeypatch.setattr(ctx, "run", run)
    return names


def offset_view(rt, x):
    """x on the device one element into a buffer: a foreign array off 16-byte alignment."""
    from hipsched.gpu.memory.device_array import DeviceArray, to_device
    buf = to_device(np.concatenate([np.zeros(1, x.dtype), x.ravel()]), runtime=rt)
    view = DeviceArray(buf.ptr + x.itemsize, x.shape, x.dtype, rt, owner=buf)
    assert int(view.ptr) % 16
    return view


def test_elementwise_16_byte_and_scalar_paths(emu, rng, launched, dtype):
    from hipsched.gpu.glue.common import KERNEL_SUFFIX
    t, sfx = TYPES[dtype], KERNEL_SUFFIX[dtype]
    # 1, 7: the tail alone; 8, 16: whole packs (one thread's second pack present or not); 67, 4099: packs
    # and a tail; 2 * 65536 + 29: four passes of the grid (2 CUs x 4 blocks x 256 threads x 2 packs of 8)
    # and a tail
    for n in (1, 7, 8, 16, 67, 4099, 2 * 65536 + 29):
        a, b = (rng.standard_normal(n) * 100).astype(t), (rng.standard_normal(n) * 100).astype(t)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        del launched[:]
        same(emu.run(half_call("add", (a, b), {}, dtype)), (a32 + b32).astype(t))
        same(emu.run(half_call("scale", (a,), {"alpha": -1.7}, dtype)), (a32 * np.float32(-1.7)).astype(t))
        assert launched == [f"hs_add_{sfx}_v8", f"hs_scale_{sfx}_v8"]
    # a bias of whole packs (8, 16 elements) in packs; one of 12 or 1 element by element
    for sa, sb, kernel in (((5, 8), (8,), "_v8"), ((70, 16), (16,), "_v8"), ((4, 12), (12,), ""), ((3, 1), (1,), "")):
        a, b = rng.standard_normal(sa).astype(t), rng.standard_normal(sb).astype(t)
        del launched[:]
        same(emu.run(half_call("add", (a, b), {}, dtype)), (a.astype(np.float32) + b.astype(np.float32)).astype(t))
        assert launched == [f"hs_add_bias_{sfx}{kernel}"]
    # inputs off 16-byte alignment (foreign device views): the scalar kernels, the same results
    rt = emu._ctx.rt
    a, b = (rng.standard_normal(67) * 100).astype(t), (rng.standard_normal(67) * 100).astype(t)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    del launched[:]
    out = emu.run(half_call("add", (offset_view(rt, a), offset_view(rt, b)), {}, dtype, on_device=True))
    same(out.get(), (a32 + b32).astype(t))
    out = emu.run(half_call("add", (offset_view(rt, a), b), {}, dtype, on_device=True))
    same(out.get(), (a32 + b32).astype(t))
    out = emu.run(half_call("scale", (offset_view(rt, a),), {"alpha": 3.0}, dtype, on_device=True))
    same(out.get(), (a32 * np.float32(3.0)).astype(t))
    a = rng.standard_normal((5, 8)).astype(t)
    out = emu.run(half_call("add", (offset_view(rt, a), b[:8]), {}, dtype, on_device=True))
    same(out.get(), (a.astype(np.float32) + b32[:8]).astype(t))
    assert launched == [f"hs_add_{sfx}", f"hs_add_{sfx}", f"hs_scale_{sfx}", f"hs_add_bias_{sfx}"]


def test_softmax_register_and_fallback_paths(emu, rng, launched, dtype):
    from hipsched.gpu.glue.common import KERNEL_SUFFIX
    t, sfx = TYPES[dtype], KERNEL_SUFFIX[dtype]
    # rows in registers at 1, 2 and 4 packs per thread (64 .. 1024 threads; 4104: 513 packs, 4 per thread
    # over 192 threads, the last thread's later packs absent); past 32768 elements the multi-pass kernel
    # in 16-byte packs; of 4 (mod 8) the shared-memory kernel 4 wide (uncached past 11264); of an odd
    # length, the scalar one
    for length, kernel in ((8, "regs_{}_p1"), (1000, "regs_{}_p1"), (4096, "regs_{}_p2"), (4104, "regs_{}_p4"),
                           (16384, "regs_{}_p4"), (32768, "regs_{}_p4"), (32776, "rows_{}_v8"),
                           (32772, "rows_{}_v4"), (1004, "rows_{}_v4"), (1001, "rows_{}")):
        x = (rng.standard_normal((2, length)) * 5).astype(t)
        del launched[:]
        g = emu.run(half_call("softmax", (x,), {"axis": -1}, dtype))
        assert launched == ["hs_softmax_" + kernel.format(sfx)], length
        ref, bound = _softmax_bound(x, dtype)
        np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)
        if dtype == "float32":
            np.testing.assert_allclose(g, CPU.run(OPS["softmax"].prepare(x)), rtol=4e-6, atol=1e-7)
        else:   # the float32 kernel on the widened rows (the same path), rounded
            assert_same_halves(g, rounded(_emu_f32(emu, "softmax", x, {"axis": -1}), dtype))
    # a row off 16-byte alignment (a foreign device view): the scalar kernel
    x = (rng.standard_normal((3, 1000)) * 5).astype(t)
    del launched[:]
    g = emu.run(half_call("softmax", (offset_view(emu._ctx.rt, x),), {"axis": -1}, dtype, on_device=True)).get()
    assert launched == [f"hs_softmax_rows_{sfx}"]
    ref, bound = _softmax_bound(x, dtype)
    np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)


def test_rms_norm_register_and_fallback_paths(emu, rng, launched, dtype):
    from hipsched.gpu.glue.common import KERNEL_SUFFIX
    t, sfx = TYPES[dtype], KERNEL_SUFFIX[dtype]
    rt = emu._ctx.rt
    for shape, kernel, view in (((3, 64), "regs_{}_p1", False), ((2, 4096), "regs_{}_p2", False),
                                ((1, 16384), "regs_{}_p4", False), ((1, 16392), "{}", False),
                                ((2, 1500), "{}", False), ((3, 64), "{}", True)):
        x = (rng.standard_normal(shape) * 4).astype(t)
        w = rng.standard_normal(shape[-1]).astype(t)
        del launched[:]
        if view:   # x off 16-byte alignment (a foreign device view): the scalar kernel
            g = emu.run(half_call("rms_norm", (offset_view(rt, x), w), {"eps": 1e-5}, dtype, on_device=True)).get()
        else:
            g = emu.run(half_call("rms_norm", (x, w), {"eps": 1e-5}, dtype))
        assert launched == ["hs_rms_norm_" + kernel.format(sfx)], shape
        assert_rms_norm(g, x, w, dtype)


def _on_tensor_cores(emu, q, k, v, causal, dtype):
    """A half attention run, whose launch must be the matrix-core kernel's (every head-dim class, at warp
    32 and 64)."""
    call = half_call("attention", (q, k, v), {"causal": causal, "scale": None}, dtype)
    kernel = _attention_kernel(emu, call)
    assert "_mma_" in kernel, kernel
    return emu.run(call)


# Tensor-core attention (hs_attention_{f16,bf16}_mma_d*: warp 32, the emulated sm_90's mma.sync kernel;
# warp 64, the emulated gfx90a's MFMA kernel): query and key tails (not multiples of the 64-row block or
# the 64-, 32- or 16-key tile), several key tiles (the double buffer, the register prefetch), Sq != Sk both
# ways, head dims below their class (padding), every class (d256: NVIDIA's Q fragments read each k step,
# AMD's 16-key tiles, one S^T step each; an odd 201 padded, its pairs read 16 bits at a time).
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("sq,sk,hd", [(70, 90, 64), (17, 33, 40), (65, 40, 128), (5, 130, 20), (16, 16, 64),
                                     (70, 50, 256), (17, 35, 201)],
                         ids=["tails", "pad", "d128", "d32", "one_block", "d256", "d256_pad"])
def test_tensor_core_attention(emu, rng, dtype, sq, sk, hd):
    t = HALF[dtype]
    q = (rng.standard_normal((1, 2, sq, hd)) * 1.5).astype(t)
    k, v = (rng.standard_normal((1, 2, sk, hd)).astype(t) for _ in range(2))
    for causal in (False, True):
        g = _on_tensor_cores(emu, q, k, v, causal, dtype)
        assert g.dtype == t and g.shape == q.shape
        assert_attention_contract(g, q, k, v, causal, dtype)
        # the CPU engine rounds only its float32 result: within the contract plus its own rounding and
        # float32 error (2e-5, test_attention_head_classes's)
        c = CPU.run(OPS["attention"].prepare(q, k, v, causal=causal))
        ref, bound = attention_contract(q, k, v, causal, dtype)
        np.testing.assert_array_less(np.abs(g.astype(np.float64) - c.astype(np.float64)),
                                     bound + UNIT[dtype] * np.abs(ref) + 2e-5 * (1 + np.abs(ref)) + TINY[dtype])


# Peaky scores: q scaled so that a row's scores spread over tens of units and most of its softmax
# numerators exp(s - max) fall under 2^-14, float16's least normal: P rounded to float16 is subnormal
# there, which MI200's MFMA reads as zero (the emulator's warp 64 flushes as it does, gpu_emulator.py).
PEAKY = 2.0 ** -14


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("b,h,sq,sk,hd,qscale", [(2, 3, 20, 37, 32, 1.5), (2, 2, 24, 70, 32, 7.0)],
                         ids=["d32_batch2_heads3", "d32_peaky"])
def test_tensor_core_attention_batches_heads_and_peaky_scores(emu, rng, dtype, b, h, sq, sk, hd, qscale):
    """Head dim exactly 32 (the d32 class unpadded), batch 2 and 2-3 heads (each (batch, head) its own
    blocks: a grid or an offset that confuses them reads another head's rows), and peaky scores."""
    t = HALF[dtype]
    q = (rng.standard_normal((b, h, sq, hd)) * qscale).astype(t)
    k, v = (rng.standard_normal((b, h, sk, hd)).astype(t) for _ in range(2))
    for causal in (False, True):
        call = half_call("attention", (q, k, v), {"causal": causal, "scale": None}, dtype)
        assert _attention_kernel(emu, call) == f"hs_attention_{'f16' if dtype == 'float16' else 'bf16'}_mma_d32"
        g = emu.run(call)
        assert g.dtype == t and g.shape == q.shape
        assert_attention_contract(g, q, k, v, causal, dtype)
    if qscale > 2:
        s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / np.sqrt(hd)
        p = np.exp(s - s.max(-1, keepdims=True))
        assert (p < PEAKY).mean() > 0.5, (p < PEAKY).mean()        # many probabilities under 2^-14
        assert ((p > 0.05) & (p < 1)).any()                          # and some others besides each row's max


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_attention_no_keys(emu, dtype):
    t = HALF[dtype]
    q = np.ones((1, 2, 5, 64), t)
    k = v = np.zeros((1, 2, 0, 64), t)
    for causal in (False, True):
        g = _on_tensor_cores(emu, q, k, v, causal, dtype)
        assert g.shape == q.shape and not g.astype(np.float32).any()   # zeros, as PyTorch and the CPU engine


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hd", [64, 256])
def test_tensor_core_attention_hidden_inf_nan(emu, rng, dtype, hd):
    """Causal: a hidden key must not reach a row even when its V holds inf or NaN (0 * inf = NaN in a
    tensor-core product): keys on each warp's diagonal 16 x 16 step (3, 20, 36: warps of rows 0-15,
    16-31, 32-47) and past a warp's rows (20 for rows 0-15), a NaN key (38) only rows 38, 39 see."""
    t = HALF[dtype]
    sq = sk = 40
    q = rng.standard_normal((1, 1, sq, hd)).astype(t)
    k, v = (rng.standard_normal((1, 1, sk, hd)).astype(t) for _ in range(2))
    v[0, 0, 3, :8] = np.inf
    v[0, 0, 20, 5] = np.nan
    v[0, 0, 36, 9] = -np.inf
    k[0, 0, 38, 0] = np.nan
    g = _on_tensor_cores(emu, q, k, v, True, dtype).astype(np.float64)
    c = CPU.run(OPS["attention"].prepare(q, k, v, causal=True)).astype(np.float64)
    assert np.isfinite(g[0, 0, :3]).all()
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(g), special(c))
    # where the output is finite only finite values met it: the contract on V's non-finite entries zeroed
    # (they reach no finite output), K's NaN key kept out of the rows that see it (they are all NaN)
    v0 = np.where(np.isfinite(v.astype(np.float32)), v, t.type(0))
    ref, bound = attention_contract(q, k[..., :38, :], v0[..., :38, :], True, dtype)
    fin = np.isfinite(c)
    fin[0, 0, 38:] = False
    assert fin[0, 0, :38].sum() > 30 * hd
    np.testing.assert_array_less(np.abs(g[..., :38, :] - ref[..., :38, :])[fin[..., :38, :]],
                                 bound[..., :38, :][fin[..., :38, :]])


def _qmatmul_kernel(emu, call) -> str:
    from hipsched.gpu.glue.quant import qmatmul_plan
    (launch,) = qmatmul_plan(emu._ctx, call)
    return launch.kernel


# Tensor-core qmatmul (hs_qmatmat_{f16,bf16}_mma_*: warp 32, the emulated sm_90's mma.sync; warp 64, the
# emulated gfx90a's MFMA), more than 16 columns of a half x: 17 and 100 columns are partial 64-column
# tiles, 64 one whole; 69 rows a partial 64-row tile; k = 96 ends in half a 64-k step (the last
# superblock's padding), k = 1056 crosses superblocks (three Q8_0, two Q4_0) and every group of 16 lanes.
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("n,k,m", [(69, 96, 17), (69, 96, 100), (37, 1056, 64)], ids=["m17", "m100", "m64_k1056"])
def test_half_qmatmul_tensor_core(emu, rng, dtype, qtype, n, k, m):
    """Each quant (an integer of 8 bits at most) is exact in either half type, so the matrix core's
    products of quants and x are exact and each block's 32 are summed in float32 before the block's scale:
    the error of a float32 sum of k products, k 2^-24 (|W| @ |x|) (the block sums, their scaling and the
    sum over k / 32 blocks together take 32 + 1 + k / 32 roundings at most), then y's rounding. Against
    the float64 product of gguf's dequantization and x, and the CPU engine; a float32 x is not sent to
    the tensor cores."""
    from hipsched import quantize
    t = HALF[dtype]
    W = quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    Wf = gguf_dequantized(W).astype(np.float64)
    x = (rng.standard_normal((k, m)) * 2).astype(t)
    call = OPS["qmatmul"].prepare(W, x)
    assert _qmatmul_kernel(emu, call) == f"hs_qmatmat_{'f16' if dtype == 'float16' else 'bf16'}_mma_{qtype}"
    assert "_mma_" not in _qmatmul_kernel(emu, OPS["qmatmul"].prepare(W, x.astype(np.float32)))
    g = emu.run(call)
    assert g.dtype == t and g.shape == (n, m)
    x64 = x.astype(np.float64)
    ref, mag = Wf @ x64, np.abs(Wf) @ np.abs(x64)
    u = UNIT[dtype]
    bound = u * np.abs(ref) + (1 + u) * k * 2.0 ** -24 * mag + TINY[dtype]
    np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)
    # the CPU engine: a float32 sum in its own order (qmatmul_bound), rounded once
    c = CPU.run(OPS["qmatmul"].prepare(W, x)).astype(np.float64)
    np.testing.assert_array_less(np.abs(g.astype(np.float64) - c),
                                 bound + u * np.abs(ref) + qmatmul_bound(Wf, x64) + TINY[dtype])


# ------------------------------------------------- grouped-query heads, causal alignment and kv_len
def _visible(b, sq, sk, causal, kv_len):
    """(b, 1, sq, sk) booleans: key j visible to query i of batch row b (torch's explicit-mask form of
    attention(causal=..., kv_len=...))."""
    lens = np.full(b, sk) if kv_len is None else np.asarray(kv_len)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    vis = np.empty((b, 1, sq, sk), bool)
    for r in range(b):
        m = j < lens[r]
        if causal in (True, "upper_left"):
            m = m & (j <= i)
        elif causal == "lower_right":
            m = m & (j <= i + lens[r] - sq)
        vis[r, 0] = m
    return vis


def _masked_contract(q, k, v, causal, kv_len, dtype):
    """(float64 reference, bound): K and V repeated to q's heads (repeat_interleave), the explicit mask;
    a row with no visible key is zeros. The bound is attention_contract's, with that mask (float32: its
    f32 part plus 2e-5 (1 + |ref|), test_attention_head_classes's)."""
    g = q.shape[1] // k.shape[1]
    q64 = q.astype(np.float64)
    k64, v64 = (np.repeat(a.astype(np.float64), g, axis=1) for a in (k, v))
    hd, sk = q.shape[-1], k.shape[-2]
    vis = np.broadcast_to(_visible(q.shape[0], q.shape[2], sk, causal, kv_len), q.shape[:3] + (sk,))
    s = np.einsum("...qd,...kd->...qk", q64, k64) / np.sqrt(hd)
    s = np.where(vis, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    w = np.where(vis, np.exp(s - np.where(np.isfinite(mx), mx, 0)), 0)
    tot = w.sum(-1, keepdims=True)
    w = w / np.where(tot > 0, tot, 1)
    av = np.abs(v64)
    ref, M = np.einsum("...qk,...kd->...qd", w, v64), np.einsum("...qk,...kd->...qd", w, av)
    if dtype == "float32":
        return ref, 2e-5 * (1 + np.abs(ref))
    sa = np.where(vis, np.einsum("...qd,...kd->...qk", np.abs(q64), np.abs(k64)) / np.sqrt(hd), 0).max(-1, keepdims=True)
    u = UNIT[dtype]
    f32 = 2.0 ** -23 * ((hd + 4) * 1.5 * sa + sk + 8) * M
    bound = (u * np.abs(ref) + 2 * u / (1 - u) * M + f32 + 2 * TINY[dtype] * np.einsum("...qk,...kd->...qd", vis * 1.0, av)
             + TINY[dtype] + 2e-5 * (1 + np.abs(ref)))
    return ref, bound


# (batch, heads_q, heads_kv, seq_q, seq_k, head_dim, kv_len): groups of 4 and 3, a prefill of 40 new
# queries behind 24 cached keys (lower_right's offset a multiple of 16: the tensor-core kernels), one
# whose offsets are not (the SIMT kernels), more queries than valid keys (rows that see nothing: zeros),
# and a kv_len of 0 (a batch row with an empty cache: zeros)
GQA_CASES = [(2, 8, 2, 40, 56, 40, [56, 40]), (1, 6, 2, 21, 50, 20, [37]), (2, 4, 4, 30, 40, 64, [12, 40]),
             (2, 3, 1, 17, 33, 32, [0, 33])]


@pytest.mark.parametrize("case", GQA_CASES, ids=["prefill_aligned", "unaligned", "short_cache", "empty_cache"])
def test_attention_grouped_heads_causal_alignment_kv_len(emu, rng, dtype, case):
    b, hq, hkv, sq, sk, hd, lens = case
    t = TYPES[dtype]
    q = rng.standard_normal((b, hq, sq, hd)).astype(t)
    k, v = (rng.standard_normal((b, hkv, sk, hd)).astype(t) for _ in range(2))
    kv_len = np.array(lens, np.int64)
    for causal in (False, True, "lower_right"):
        for kl in (None, kv_len):
            call = OPS["attention"].prepare(q, k, v, causal=causal, kv_len=kl)
            if case[0] == 2 and case[5] == 40 and dtype != "float32" and causal == "lower_right":
                assert "_mma_" in _attention_kernel(emu, call)   # the aligned prefill runs on matrix cores
            g = emu.run(call)
            assert g.dtype == t and g.shape == q.shape
            ref, bound = _masked_contract(q, k, v, causal, kl, dtype)
            np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound + 1e-300,
                                         err_msg=f"{case} causal={causal} kv_len={kl} {_attention_kernel(emu, call)}")
            c = CPU.run(call)
            np.testing.assert_array_less(np.abs(c.astype(np.float64) - ref), bound + 1e-300)


def test_attention_lower_right_chooses_tensor_cores_only_on_aligned_diagonals(emu, rng):
    """The matrix-core kernels step their causal diagonal by 16 keys: lower_right goes to them when every
    row's offset kv_len - seq_q is a multiple of 16, to the SIMT kernel otherwise (both exact above)."""
    q = rng.standard_normal((2, 4, 8, 64)).astype(np.float16)
    k = rng.standard_normal((2, 2, 40, 64)).astype(np.float16)
    aligned = OPS["attention"].prepare(q, k, k, causal="lower_right", kv_len=np.array([24, 40]))
    unaligned = OPS["attention"].prepare(q, k, k, causal="lower_right", kv_len=np.array([24, 39]))
    assert "_mma_" in _attention_kernel(emu, aligned)   # both emulated targets have matrix cores
    assert "_mma_" not in _attention_kernel(emu, unaligned)


# (batch, heads_q, heads_kv, seq_k, head_dim, kv_len): the split-K decode kernel (one query per head)
# over several key ranges (and a last partial one), a group of 4 and one of 12 (two head blocks of 8),
# head dims below their class, and a batch row with an empty cache
DECODE_CASES = [(2, 8, 2, 300, 64, [300, 129]), (1, 12, 1, 90, 20, [77]), (2, 4, 4, 40, 128, [0, 40]),
                (1, 2, 1, 70, 200, [70])]


@pytest.mark.parametrize("case", DECODE_CASES, ids=["gqa4", "gqa12", "empty_row", "d256"])
def test_attention_decode_split_k(emu, rng, dtype, case):
    b, hq, hkv, sk, hd, lens = case
    t = TYPES[dtype]
    q = rng.standard_normal((b, hq, 1, hd)).astype(t)
    k, v = (rng.standard_normal((b, hkv, sk, hd)).astype(t) for _ in range(2))
    kv_len = np.array(lens, np.int64)
    for causal in (False, True, "lower_right"):
        for kl in (None, kv_len):
            call = OPS["attention"].prepare(q, k, v, causal=causal, kv_len=kl)
            assert _attention_kernel_names(emu, call)[0].startswith("hs_attention_decode_")
            g = emu.run(call)
            assert g.dtype == t and g.shape == q.shape
            # float32 throughout, one rounding on the store: the SIMT bound
            ref, _ = _masked_contract(q, k, v, causal, kl, "float32")
            bound = UNIT[dtype] * np.abs(ref) + 2e-5 * (1 + np.abs(ref)) + TINY[dtype]
            np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound,
                                         err_msg=f"{case} causal={causal} kv_len={kl}")


def test_attention_decode_splits_the_keys(emu):
    """A single query against a long cache spreads over about two blocks per multiprocessor."""
    from hipsched.gpu.glue.attention import decode_launches
    launches, nsplit, chunk = decode_launches(1, 32, 8, 4096, 128, "f16", 132)
    assert nsplit * chunk >= 4096 > (nsplit - 1) * chunk
    assert 1.5 * 132 <= launches[0].grid[0] <= 2.5 * 132 and launches[1].grid[0] == 32   # 8 KV heads alone: 8 blocks


def _attention_kernel_names(emu, call):
    from hipsched.gpu.glue.attention import attention_plan
    return [launch.kernel for launch in attention_plan(emu._ctx, call)]
