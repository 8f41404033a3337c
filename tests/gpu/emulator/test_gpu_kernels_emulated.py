"""The GPU kernels and their launch glue, run on the CPU by tests/support/gpu_emulator.py, against the CPU engine.
Real kernel sources, real GpuBackend/GpuContext/glue; only the device is emulated. Covers what compile
checks cannot: reductions, shuffles, multi-pass top-k, tails, float4/scalar variants, for warp 32
(NVIDIA) and warp 64 (AMD gfx9). Shapes are small: every block is OS threads. The vendor BLAS is off
(HIPSCHED_BLAS=none) so matmul runs our tiled kernel. Tolerances as in test_gpu_ops.py.

A test taking `dtype` runs in float32 and in float16 and bfloat16 (pytest_generate_tests below). The half
kernels are the float32 templates with 2-byte loads and stores, so besides the outside reference a half
result must be the float32 kernel's result on the widened inputs rounded once to the half type, bit for
bit; float32 results are compared with the CPU engine instead. Outside references: the float32
computation NumPy/ml_dtypes round to the type, bit for bit where the kernel's arithmetic is that float32
computation, a float64 computation otherwise. The formats' terms of the half bounds (UNIT: a rounding's
relative error; TINY: its absolute error where the result underflows) are tests/support/half_formats.py's,
as in the CPU tests."""
import numpy as np
import pytest
from half_formats import HALF, TINY, TYPE_IDS, TYPES, UNIT, assert_same_halves, ml_dtypes, rounded
from requires import need

import gpu_emulator
from hipsched.backends.cpu import CpuBackend
from hipsched.backends.gpu import GpuBackend
from hipsched.errors import GpuError
from hipsched.ops import OPS
from hipsched.ops.base import Call

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

CPU = CpuBackend()


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


def parametrize_dtype(metafunc, dtypes):
    """Runs a test taking `dtype` once per type in `dtypes` (here float32 and the halves; test_gpu_ops.py,
    which collects the tests below on a device beside float32 tests of its own, the halves only), under
    TYPE_IDS' ids: the halves' say "half", which CI's slowest emulator steps leave out (.ci/run). A test
    whose cases differ by type (dtype_cases) gets each type's own; one that parametrizes `dtype` itself
    keeps its own list."""
    marked = (m.args[0] for m in metafunc.definition.iter_markers("parametrize"))
    if "dtype" not in metafunc.fixturenames or any(
            "dtype" in ([a.strip() for a in n.split(",")] if isinstance(n, str) else n) for n in marked):
        return
    type_id = dict(zip(TYPES, TYPE_IDS))
    table = getattr(metafunc.function, "dtype_cases", None)
    if table is None:
        metafunc.parametrize("dtype", dtypes, ids=[type_id[d] for d in dtypes])
        return
    argnames, cases = table
    rows = [(d, case) if len(argnames) == 1 else (d, *case) for d in dtypes for case in cases[d]]
    metafunc.parametrize(["dtype", *argnames], rows,
                         ids=lambda v: type_id.get(v) if isinstance(v, str) else None)


def dtype_cases(argnames, float32, halves):
    """The cases of a test whose shapes differ by type: float32's and each half type's, lists of
    `argnames` values. (The attribute's name is one of the test's -k keywords, so it must not say "half".)"""
    def attach(test):
        names = [n.strip() for n in argnames.split(",")]
        test.dtype_cases = (names, {"float32": float32, **dict.fromkeys(HALF, halves)})
        return test
    return attach


def both(be, op, *args, **kwargs):
    return be.run(OPS[op].prepare(*args, **kwargs)), CPU.run(OPS[op].prepare(*args, **kwargs))


def half_call(op, args, params, dtype, on_device=False):
    nbytes = sum(int(a.nbytes) for a in args) + int(args[0].nbytes)
    return Call(op, tuple(args), dict(params), int(args[0].size), nbytes, dtype=dtype, on_device=on_device)


def call_of(op, args, params, dtype, on_device=False):
    """float32 through the op spec's prepare, as a user's call goes; the halves through Calls built here, so
    that their kernels' tests do not depend on which dtypes the specs declare."""
    if dtype == "float32":
        return OPS[op].prepare(*args, **params)
    return half_call(op, args, params, dtype, on_device)


def _emu_f32(emu, op, x, params, *more):
    """The float32 kernel's result on the widened inputs: the half kernels must equal it rounded."""
    args = (x.astype(np.float32),) + tuple(m.astype(np.float32) for m in more)
    return emu.run(half_call(op, args, params, "float32"))


def same(got, want):
    if got.dtype == np.float32:
        np.testing.assert_array_equal(got, want)
    else:
        assert_same_halves(got, want)


def test_add_scale(emu, rng, dtype):
    t = TYPES[dtype]
    # n 64: the 4-wide kernels; 9 and 4099: the scalar ones (and their tails)
    for n in (1, 9, 64, 4099):
        a, b = (rng.standard_normal(n) * 100).astype(t), (rng.standard_normal(n) * 100).astype(t)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        # one float32 operation on the widened inputs, rounded once to the type, as NumPy's own add does
        same(emu.run(call_of("add", (a, b), {}, dtype)), rounded(a32 + b32, dtype))
        # -1.7 is not a float32: the kernel multiplies by its float32 rounding, as NumPy does
        same(emu.run(call_of("scale", (a,), {"alpha": -1.7}, dtype)), rounded(a32 * np.float32(-1.7), dtype))
    # bias: 4-wide (8) and scalar; a one-element b as the op spec takes it (0-d)
    for sa, sb in [((5, 8), (8,)), ((7, 9), (9,)), ((2, 3), ())]:
        a, b = rng.standard_normal(sa).astype(t), np.asarray(rng.standard_normal(sb)).astype(t)
        g = emu.run(call_of("add", (a, b), {}, dtype))
        same(g, rounded(a.astype(np.float32) + b.astype(np.float32), dtype))
        if dtype == "float32":
            np.testing.assert_array_equal(g, CPU.run(OPS["add"].prepare(a, b)))
    # a (1,) b is no trailing part of (2, 3): the spec refuses it, and so does the glue, by the same rule
    # (hipsched/broadcast.py), where the Call is built here past the spec (the halves' calls)
    if dtype != "float32":
        a, b = rng.standard_normal((2, 3)).astype(t), np.ones(1, t)
        with pytest.raises(GpuError, match="neither a's shape"):
            emu.run(call_of("add", (a, b), {}, dtype))


# the halves' own range (float32's special values in add and scale are test_gpu_ops.py's, on a device)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_half_overflow_nan_inf(emu, dtype):
    t = HALF[dtype]
    big = float(ml_dtypes.finfo(t).max)
    a = np.array([big, -big, np.inf, np.nan, 1.0, -0.0, 2.0 ** -20, -np.inf], np.float32).astype(t)
    b = np.array([big, -big, -np.inf, 1.0, np.nan, -0.0, 2.0 ** -20, 1.0], np.float32).astype(t)
    for x, y in ((a, b), (a[:7], b[:7])):   # 8 elements: 4-wide kernel; 7: scalar
        g = emu.run(half_call("add", (x, y), {}, dtype))
        assert_same_halves(g, rounded(x.astype(np.float32) + y.astype(np.float32), dtype))
        # past the format's range a sum becomes inf (float16: 65504 + 65504), as PyTorch's .half() gives
        assert np.isposinf(g[0].astype(np.float32)) and np.isneginf(g[1].astype(np.float32))
        assert np.isnan(g[2].astype(np.float32)) and np.isnan(g[3].astype(np.float32))
        assert_same_halves(emu.run(half_call("scale", (x,), {"alpha": 3.0}, dtype)),
                         rounded(x.astype(np.float32) * np.float32(3.0), dtype))


def _softmax_bound(x, dtype, axis=-1):
    """(float64 softmax, the bound on |result - it|): float32's error 2e-6 relative (device expf is within
    2 ulp) plus 1e-7; for a half type the half rounding (UNIT relative, TINY absolute) on top of it."""
    from scipy.special import softmax
    ref = softmax(x.astype(np.float64), axis=axis)
    if dtype == "float32":
        return ref, 2e-6 * ref + 1e-7
    return ref, (UNIT[dtype] * (1 + 2e-6) + 2e-6) * ref + TINY[dtype] + 1e-300


SOFTMAX_SHAPES = [((9, 33), -1), ((3, 1000), -1), ((2, 12300), -1), ((4, 5, 6), 1), ((6, 4), 0)]


# The halves also at rows the register kernel holds at 1 and 4 packs per thread (4104: the last thread's
# later packs absent), which float32 meets only in test_softmax_register_and_fallback_paths: every float32
# case here runs again under CI's sanitizers and asynchronous streams, where a case costs.
@dtype_cases("shape,axis", float32=SOFTMAX_SHAPES,
             halves=SOFTMAX_SHAPES + [((3, 64), -1), ((2, 4104), -1), ((1, 16384), -1)])
def test_softmax(emu, rng, dtype, shape, axis):
    t = TYPES[dtype]
    x = (rng.standard_normal(shape) * 5).astype(t)
    g = emu.run(call_of("softmax", (x,), {"axis": axis}, dtype))
    assert g.dtype == t and g.shape == x.shape
    ref, bound = _softmax_bound(x, dtype, axis)
    np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)
    if dtype == "float32":
        np.testing.assert_allclose(g, CPU.run(OPS["softmax"].prepare(x, axis=axis)), rtol=4e-6, atol=1e-7)
    else:   # max, exponentials and sum in float32 (same launch geometry, same order), rounded on the store
        assert_same_halves(g, rounded(_emu_f32(emu, "softmax", x, {"axis": axis}), dtype))


def test_softmax_nan_inf(emu, dtype):
    x = np.array([[1, np.nan, 2, 0], [np.inf, 1, 2, 0], [-np.inf] * 4, [-np.inf, 0, 1, 2]], np.float32)
    # rows of 4: float4 kernel; rows of 3: scalar kernel; rows of 8: the register kernel
    for xs in (x, x[:, :3].copy(), np.tile(x, 2)):
        xt = xs.astype(TYPES[dtype])
        g = emu.run(call_of("softmax", (xt,), {"axis": -1}, dtype))
        np.testing.assert_array_equal(np.isnan(g.astype(np.float32))[:3], True)
        if dtype == "float32":
            c = CPU.run(OPS["softmax"].prepare(xt))
            np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
            np.testing.assert_allclose(g[~np.isnan(c)], c[~np.isnan(c)], rtol=4e-6, atol=1e-7)
        else:
            assert_same_halves(g, rounded(_emu_f32(emu, "softmax", xt, {"axis": -1}), dtype))


def assert_rms_norm(g, x, w, dtype):
    """Against rms_norm in float64: float32 within one ulp of it and of the CPU engine (each rounds the same
    float64 value once; only the order of the double sums differs); a half type within that plus the half
    rounding."""
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * w.astype(np.float64)
    if dtype == "float32":
        np.testing.assert_array_max_ulp(g, CPU.run(OPS["rms_norm"].prepare(x, w, eps=1e-5)), maxulp=1)
        np.testing.assert_array_max_ulp(g, ref.astype(np.float32), maxulp=1)
    else:
        bound = (UNIT[dtype] + 2.0 ** -23) * np.abs(ref) + TINY[dtype]
        np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound + 1e-300)


# rms_norm: widths below, at and past each block size the glue picks (64 / 256 / 1024 threads), so rows
# leave threads idle, fill the block and loop; the double block sum is checked for warp 32 and 64.
# Rows of a multiple of 8 up to 16384 take the register kernel (p1/p2/p4 packs per thread, 64 to 512
# threads: 64, 1024, 4096, 16384); 16392 is past it and takes the scalar one. The halves take one shape
# per block size and a register kernel (the launches are the float32 ones; CI's memcheck step runs every
# float16 case); their other register and scalar shapes are test_rms_norm_register_and_fallback_paths's.
@dtype_cases("shape", float32=[(1,), (5, 3), (4, 64), (3, 100), (2, 1024), (2, 1500), (1, 16384 + 7), (2, 3, 40),
                               (2, 4096), (1, 16384), (1, 16392)],
             halves=[(5, 3), (3, 100), (2, 1500), (2, 3, 40), (2, 4096), (1, 16384)])
def test_rms_norm(emu, rng, dtype, shape):
    t = TYPES[dtype]
    x = (rng.standard_normal(shape) * 4).astype(t)
    w = rng.standard_normal(shape[-1]).astype(t)
    g = emu.run(call_of("rms_norm", (x, w), {"eps": 1e-5}, dtype))
    assert g.dtype == t
    assert_rms_norm(g, x, w, dtype)
    if dtype != "float32":
        assert_same_halves(g, rounded(_emu_f32(emu, "rms_norm", x, {"eps": 1e-5}, w), dtype))


def test_rms_norm_nan_inf_empty(emu):
    x = np.array([[1, 2, np.nan, 4], [1, np.inf, 3, 4], [0, 0, 0, 0], [1e30, -1e30, 3, 0]], np.float32)
    w = np.array([1, -2, 0.5, 3], np.float32)
    g, c = both(emu, "rms_norm", x, w)
    np.testing.assert_array_equal(g, c)
    for shape in ((0, 4), (3, 0)):
        g, c = both(emu, "rms_norm", np.zeros(shape, np.float32), np.ones(shape[-1], np.float32))
        assert g.shape == c.shape == shape


def cosines64(q, T):
    """Cosine similarities in float64 (the outside reference), 0 against a zero vector as the op's rule."""
    q64, T64 = np.atleast_2d(q.astype(np.float64)), T.astype(np.float64)
    norms = np.linalg.norm(q64, axis=1)[:, None] * np.linalg.norm(T64, axis=1)[None, :]
    ref = np.divide(q64 @ T64.T, norms, out=np.zeros_like(norms), where=norms > 0)
    return ref[0] if q.ndim == 1 else ref


@pytest.mark.parametrize("m,d", [(None, 8), (None, 33), (9, 12), (2, 7)])   # d 8, 12: the 4-wide kernels
def test_cosine(emu, rng, dtype, m, d):
    t = TYPES[dtype]
    q = rng.standard_normal(d if m is None else (m, d)).astype(t)
    T = rng.standard_normal((70, d)).astype(t)
    T[5] = 0   # a zero row: scored in double (0)
    g = emu.run(call_of("cosine_similarity", (q, T), {}, dtype))
    ref = cosines64(q, T)
    # scores are float32 whatever the inputs, within float32 sums of d products of the float64 ones (a
    # half input widens exactly, so no half rounding)
    assert g.dtype == np.float32 and g.shape == ref.shape
    np.testing.assert_allclose(g, ref, rtol=0, atol=3e-6 + 2e-7 * np.sqrt(d))
    if dtype == "float32":
        np.testing.assert_allclose(g, CPU.run(OPS["cosine_similarity"].prepare(q, T)), rtol=0,
                                   atol=3e-6 + 2e-7 * np.sqrt(d))
    else:   # the widened inputs make them the float32 kernel's scores, exactly
        np.testing.assert_array_equal(g, _emu_f32(emu, "cosine_similarity", q, {}, T))


def test_cosine_zero_nan_extreme(emu):
    T = np.array([[0, 0, 0, 0], [1, 2, 3, 4], [np.nan, 1, 1, 1], [np.inf, 0, 0, 0], [1e-30, 0, 0, 0],
                  [1e20, 1e20, 0, 0]], np.float32)
    for q in ([0, 0, 0, 0], [1, 0, 0, 0], [np.nan, 0, 0, 0], [1e-25, 2e-25, 0, 0]):
        g, c = both(emu, "cosine_similarity", np.array(q, np.float32), T)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
        np.testing.assert_allclose(g[~np.isnan(c)], c[~np.isnan(c)], atol=1e-6)


# The time goes into selection rounds (k per block, each hundreds of emulated barriers, and this file also
# runs under ASan and TSan in .ci/run), so k stays small. float32 takes 3 segments (two selection passes)
# and one query. Only the scoring differs for a half type: the glue scores half inputs with the half cosine
# kernel into float32 scratch, then launches the same hs_topk_select_f32 passes whatever the dtype; so one
# segment (600 rows < HS_TOPK_SEG) and 2 queries (the multi-query scoring kernel).
@dtype_cases("rows,d,queries", float32=[(5000, 6, None)], halves=[(600, 8, 2)])
def test_top_k(emu, rng, dtype, rows, d, queries):
    t = TYPES[dtype]
    T = rng.standard_normal((rows, d)).astype(t)
    q = rng.standard_normal(d if queries is None else (queries, d)).astype(t)
    gi, gs = emu.run(call_of("top_k", (q, T), {"k": 5}, dtype))
    assert gs.dtype == np.float32 and gi.shape == gs.shape == q.shape[:-1] + (5,)
    ref = cosines64(q, T)
    if dtype == "float32":
        ci, cs = CPU.run(OPS["top_k"].prepare(q, T, 5))
        np.testing.assert_array_equal(gi, ci)
        np.testing.assert_allclose(gs, cs, atol=5e-6)
        np.testing.assert_allclose(gs, ref[gi], rtol=0, atol=5e-6)
    else:
        # the inputs widen exactly, so the scores are the float32 cosine kernel's, and the selection is
        # their exact order (descending, ties to the lower index)
        fs = _emu_f32(emu, "cosine_similarity", q, {}, T)
        want = np.stack([np.lexsort((np.arange(len(r)), -r.astype(np.float64)))[:5] for r in fs])
        np.testing.assert_array_equal(gi, want)
        np.testing.assert_array_equal(gs, np.take_along_axis(fs, want, axis=1))
    # against float64 scores: ranks may swap only between scores closer than the float32 error bound
    kth = -np.sort(-ref, axis=-1)[..., 4:5]
    assert (np.take_along_axis(ref, gi, axis=-1) > kth - 1e-5).all()


def test_top_k_ties_nan(emu, rng):
    # 6 pairs of exact ties plus a NaN, all ranked (k = n), for two queries
    base = rng.standard_normal((6, 5)).astype(np.float32)
    T = np.concatenate([base, base])
    T[3] = np.nan
    Q = rng.standard_normal((2, 5)).astype(np.float32)
    (gi, gs), (ci, cs) = both(emu, "top_k", Q, T, 12)
    np.testing.assert_array_equal(gi, ci)                   # exact ties to the lower index, NaN last
    assert (gi[:, -1] == 3).all()


MATMUL_SHAPES = [((33, 8), (8, 65)), ((2, 5, 7), (7, 3)), ((9,), (9, 33))]


# float32 also times a vector of 70 rows; the halves keep the three shapes they had (CI's memcheck step
# runs every float16 case).
@dtype_cases("sa,sb", float32=MATMUL_SHAPES + [((70, 40), (40,))], halves=MATMUL_SHAPES)
def test_matmul_tiled_kernel(emu, rng, dtype, sa, sb):
    t = TYPES[dtype]
    a, b = rng.standard_normal(sa).astype(t), rng.standard_normal(sb).astype(t)
    g = emu.run(call_of("matmul", (a, b), {}, dtype))   # HIPSCHED_BLAS=none: the tiled kernel
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref, mag = np.matmul(a64, b64), np.matmul(np.abs(a64), np.abs(b64))
    assert g.dtype == t and g.shape == ref.shape
    if dtype == "float32":
        assert np.all(np.abs(g - ref) <= 1e-5 * mag + 1e-30)
        return
    # products accumulate in float32 as in the float32 kernel, then C is rounded once
    assert_same_halves(g, rounded(_emu_f32(emu, "matmul", a, {}, b), dtype))
    # float32 sum of K products: K * 2^-24 * sum|a||b|; then the half rounding
    bound = UNIT[dtype] * np.abs(ref) + (1 + UNIT[dtype]) * sa[-1] * 2.0 ** -24 * mag + TINY[dtype]
    np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound + 1e-300)


def test_device_in_device_out(emu, rng, dtype):
    from hipsched.gpu.memory.device_array import DeviceArray, to_device
    rt, t = emu._ctx.rt, TYPES[dtype]
    x = rng.standard_normal((5, 40)).astype(t)
    out = emu.run(call_of("softmax", (to_device(x, runtime=rt),), {"axis": -1}, dtype, on_device=True))
    assert isinstance(out, DeviceArray) and out.dtype == t
    if dtype == "float32":
        np.testing.assert_allclose(out.get(), CPU.run(OPS["softmax"].prepare(x)), rtol=4e-6, atol=1e-7)
    else:   # the host run's bits (a half's host path is checked against the float32 kernel above)
        assert_same_halves(out.get(), emu.run(half_call("softmax", (x,), {"axis": -1}, dtype)))
    xs = (to_device(x[0], runtime=rt), to_device(x, runtime=rt))
    gi, gs = emu.run(call_of("top_k", xs, {"k": 3}, dtype, on_device=True))
    assert isinstance(gi, DeviceArray) and gi.get()[0] == 0


# Every kernel runs in this file at least once (the ones below are reached by no test above), because
# this file is also what CI's memcheck and racecheck steps run (docs/design/emulator-and-proof.md).

def gguf_dequantized(W):
    """The outside reference for the quant kernels: the gguf package's dequantization of W's blocks."""
    gguf = need("gguf")
    t = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[W.qtype]
    return np.asarray(gguf.quants.dequantize(np.asarray(W.data), t), np.float32).reshape(W.shape)


def qmatmul_bound(Wf, x):
    """|float32 product - float64 product| for a sum of k products in float32 in any order: k 2^-24
    (|W| @ |x|), doubled for the per-block scale products the kernels form."""
    k = Wf.shape[1]
    return 2 * k * 2.0 ** -24 * (np.abs(Wf.astype(np.float64)) @ np.abs(x.astype(np.float64))) + 1e-30


# (n, k) of the quant kernel tests: 69 rows leave a partial pair of rows for the one-column mat-vec, a
# partial 16-row block for the several-column one and a partial 64-row tile; k = 64 is one superblock,
# mostly padding; 37 x 1056 has two superblocks per row for Q8_0 (512 weights each), one full and one
# partial for Q4_0 (1024), and more than one 32-lane step of the tiles
QUANT_SHAPES = ((69, 64), (37, 1056))
# x columns: the vector; the several-column mat-vec with 2, 8 (one column chunk) and 16 (two); 17 and
# 70, the 64x64 tiles (70: a partial column tile)
QUANT_COLUMNS = (1, 2, 8, 16, 17, 70)


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
    from hipsched.gpu.ops.quant import device_layout, host_layout
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


def _attention_f64(q, k, v, causal):
    """softmax(q k^T / sqrt(d) [+ causal mask, torch SDPA's: query i sees keys j <= i]) v, in float64."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    # einsum, not @: at a few hundred rows @ goes to OpenBLAS's threads, whose synchronisation
    # ThreadSanitizer (CI's racecheck step runs this file) cannot see, so it aborts
    s = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("...qk,...kd->...qd", s / s.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("hd", [20, 40, 100, 200], ids=["d32", "d64", "d128", "d256"])
def test_attention_head_classes(emu, rng, dtype, hd):
    t = TYPES[dtype]
    q = rng.standard_normal((1, 2, 7, hd)).astype(t)
    k, v = (rng.standard_normal((1, 2, 20, hd)).astype(t) for _ in range(2))  # d256: 2 key tiles
    for causal in (False, True):
        params = {"causal": causal, "scale": None}
        call = call_of("attention", (q, k, v), params, dtype)
        g = emu.run(call)
        assert g.dtype == t and g.shape == q.shape
        # a float64 reference written out here rather than torch's SDPA: this file also runs under
        # ThreadSanitizer (CI's racecheck step), which aborts on torch's OpenMP threads (libgomp's
        # synchronisation is invisible to it); the Executor-level matrix compares with torch
        ref = _attention_f64(q, k, v, causal)
        if dtype == "float32":
            np.testing.assert_allclose(g, CPU.run(OPS["attention"].prepare(q, k, v, causal=causal)),
                                       rtol=2e-5, atol=2e-6)
            np.testing.assert_array_less(np.abs(g - ref), 2e-5 * (1 + np.abs(ref)))   # test_gpu_quant_attention_spread.py's bound
        elif "_mma_" in _attention_kernel(emu, call):
            # the tensor-core kernel rounds P too: test_tensor_core_attention's contract
            assert_attention_contract(g, q, k, v, causal, dtype)
        else:
            # the SIMT kernel: float32 running max, sum and output as in the float32 kernel, one rounding
            # on the store
            assert_same_halves(g, rounded(_emu_f32(emu, "attention", q, params, k, v), dtype))
            # float32's error (2e-5 relative, 2e-6 absolute against the CPU engine, as above) plus the half
            # rounding of each output
            bound = UNIT[dtype] * np.abs(ref) + 2e-5 * np.abs(ref) + 2e-6 + TINY[dtype]
            np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)


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
    from hipsched.gpu.ops.common import KERNEL_SUFFIX
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
    from hipsched.gpu.ops.common import KERNEL_SUFFIX
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
    from hipsched.gpu.ops.common import KERNEL_SUFFIX
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


def _attention_kernel(emu, call) -> str:
    from hipsched.gpu.ops.attention import attention_plan
    (launch,) = attention_plan(emu._ctx, call)
    return launch.kernel


def attention_contract(q, k, v, causal, dtype):
    """(float64 reference, the error bound docs/design/kernels.md states for the tensor-core kernels), elementwise.

    With weights w_j = softmax_j(s) and M = sum_j w_j |v_j| (the output's magnitude scale: attention
    applied to |V|), u the unit roundoff of the output type: rounding each P to the input type moves the
    normalised weights by at most 2u/(1-u) relative, so the output by 2u/(1-u) M (the errors of l and of
    P cancel to first order only for equal v, so the bound takes no credit for it); the final rounding adds
    u |out|; P's underflow to half subnormals at most TINY per visible key times |v_j|. The float32 parts
    (Q K^T over hd exact products, the scaled exponent, the P V and l sums over Sk keys) are
    2^-23 ((hd + 4) 1.5 max_j sa_j + Sk + 8) M, with sa = scale |q| |k|^T. One ulp at the magnitude scale
    being 2u M, that is 1.5 ulps plus the float32 parts."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    hd, sk = q.shape[-1], k.shape[-2]
    scale = 1 / np.sqrt(hd)
    s = q64 @ np.swapaxes(k64, -1, -2) * scale
    vis = np.ones(s.shape[-2:], bool)
    if causal:
        vis = np.tril(vis)
    s = np.where(vis, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    av = np.abs(v64)
    ref, M = w @ v64, w @ av
    sa = np.where(vis, np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2) * scale, 0).max(-1, keepdims=True)
    u = UNIT[dtype]
    f32 = 2.0 ** -23 * ((hd + 4) * 1.5 * sa + sk + 8) * M
    bound = u * np.abs(ref) + 2 * u / (1 - u) * M + f32 + 2 * TINY[dtype] * (vis @ av) + TINY[dtype]
    return ref, bound


def assert_attention_contract(g, q, k, v, causal, dtype):
    ref, bound = attention_contract(q, k, v, causal, dtype)
    np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)


# Tensor-core attention (hs_attention_{f16,bf16}_mma_d*: warp 32, the emulated sm_90's mma.sync kernel;
# warp 64, the emulated gfx90a's MFMA kernel): query and key tails (not multiples of the 64-row block or
# the 64- or 32-key tile), several key tiles (the double buffer, the register prefetch), Sq != Sk both
# ways, head dims below their class (padding), every class with matrix-core kernels.
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("sq,sk,hd", [(70, 90, 64), (17, 33, 40), (65, 40, 128), (5, 130, 20), (16, 16, 64)],
                         ids=["tails", "pad", "d128", "d32", "one_block"])
def test_tensor_core_attention(emu, rng, dtype, sq, sk, hd):
    t = HALF[dtype]
    q = (rng.standard_normal((1, 2, sq, hd)) * 1.5).astype(t)
    k, v = (rng.standard_normal((1, 2, sk, hd)).astype(t) for _ in range(2))
    for causal in (False, True):
        call = half_call("attention", (q, k, v), {"causal": causal, "scale": None}, dtype)
        assert "_mma_" in _attention_kernel(emu, call)
        g = emu.run(call)
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
        call = half_call("attention", (q, k, v), {"causal": causal, "scale": None}, dtype)
        assert "_mma_" in _attention_kernel(emu, call)
        g = emu.run(call)
        assert g.shape == q.shape and not g.astype(np.float32).any()   # zeros, as PyTorch and the CPU engine


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_attention_hidden_inf_nan(emu, rng, dtype):
    """Causal: a hidden key must not reach a row even when its V holds inf or NaN (0 * inf = NaN in a
    tensor-core product): keys on each warp's diagonal 16 x 16 step (3, 20, 36: warps of rows 0-15,
    16-31, 32-47) and past a warp's rows (20 for rows 0-15), a NaN key (38) only rows 38, 39 see."""
    t = HALF[dtype]
    sq = sk = 40
    q = rng.standard_normal((1, 1, sq, 64)).astype(t)
    k, v = (rng.standard_normal((1, 1, sk, 64)).astype(t) for _ in range(2))
    v[0, 0, 3, :8] = np.inf
    v[0, 0, 20, 5] = np.nan
    v[0, 0, 36, 9] = -np.inf
    k[0, 0, 38, 0] = np.nan
    call = half_call("attention", (q, k, v), {"causal": True, "scale": None}, dtype)
    assert "_mma_" in _attention_kernel(emu, call)
    g = emu.run(call).astype(np.float64)
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
    assert fin[0, 0, :38].sum() > 30 * 64
    np.testing.assert_array_less(np.abs(g[..., :38, :] - ref[..., :38, :])[fin[..., :38, :]],
                                 bound[..., :38, :][fin[..., :38, :]])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_half_qmatmul(emu, rng, dtype, qtype, monkeypatch):
    """qmatmul's three SIMT products with a half x (a vector, 3 and 16 columns, 70 columns), through the op
    spec's prepare: x read in its own type, y in x's type, bit for bit the float32 kernel's result on the
    widened x rounded once to the half type; and within the half rounding of gguf's dequantization times x
    in float64 (before the fix, x's 2-byte elements were read as float32: values near 1e35). Both emulated
    targets have matrix cores, where the glue sends 70 half columns to the tensor-core tiles
    (test_half_qmatmul_tensor_core): here the glue is told the target has none, as on gfx906 or gfx1030."""
    from hipsched import quantize
    from hipsched.gpu.ops import quant
    monkeypatch.setattr(quant, "has_mma", lambda arch: False)
    t = HALF[dtype]
    W = quantize(rng.standard_normal((69, 64)).astype(np.float32), qtype)
    Wf = gguf_dequantized(W)
    for shape in ((64,), (64, 3), (64, 16), (64, 70)):
        x = rng.standard_normal(shape).astype(t)
        call = OPS["qmatmul"].prepare(W, x)
        assert call.dtype == f"{qtype}/{dtype}" and emu.supports("qmatmul", call.dtype)
        g = emu.run(call)
        assert g.dtype == t and g.shape == (69,) + shape[1:]
        x32 = x.astype(np.float32)
        assert_same_halves(g, rounded(emu.run(OPS["qmatmul"].prepare(W, x32)), dtype))
        ref = Wf.astype(np.float64) @ x32.astype(np.float64)
        bound = UNIT[dtype] * np.abs(ref) + qmatmul_bound(Wf, x32) + TINY[dtype]
        np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)


def _qmatmul_kernel(emu, call) -> str:
    from hipsched.gpu.ops.quant import qmatmul_plan
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


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_qmatmul_device_x(emu, rng, dtype):
    """A half x on the device gives a device y of x's type, the bits of the host run; a vector x whose base
    is not 8-byte aligned (a view one element into a buffer: the mat-vec's 4-element loads need 8 bytes)
    goes through the alignment copy, in x's own type."""
    from hipsched import quantize
    from hipsched.gpu.memory.device_array import DeviceArray, to_device
    rt, t = emu._ctx.rt, HALF[dtype]
    W = quantize(rng.standard_normal((37, 64)).astype(np.float32), "q8_0")
    x = rng.standard_normal(64).astype(t)
    buf = to_device(np.concatenate([np.zeros(1, t), x]), runtime=rt)
    view = DeviceArray(buf.ptr + t.itemsize, (64,), t, rt, owner=buf)
    assert int(view.ptr) % 8
    for dev in (to_device(x, runtime=rt), view):
        out = emu.run(OPS["qmatmul"].prepare(W, dev))
        assert isinstance(out, DeviceArray) and out.dtype == t
        assert_same_halves(out.get(), emu.run(OPS["qmatmul"].prepare(W, x)))
    xm = rng.standard_normal((64, 5)).astype(t)
    out = emu.run(OPS["qmatmul"].prepare(W, to_device(xm, runtime=rt)))
    assert_same_halves(out.get(), emu.run(OPS["qmatmul"].prepare(W, xm)))


def test_half_supports_table(emu):
    for op in ("add", "scale", "softmax", "rms_norm", "cosine_similarity", "top_k", "matmul", "attention"):
        assert emu.supports(op, "float16") and emu.supports(op, "bfloat16") and emu.supports(op, "float32")
    for op in ("spread_activation", "dequantize"):
        assert not emu.supports(op, "float16") and not emu.supports(op, "bfloat16")
    # qmatmul's dtype is its (quant type, x dtype) pair: every pair has kernels, a bare half name is none
    for qtype in ("q8_0", "q4_0"):
        assert all(emu.supports("qmatmul", d) for d in (qtype, f"{qtype}/float16", f"{qtype}/bfloat16"))
    assert not emu.supports("qmatmul", "float16")


def test_half_dtype_without_kernels_is_refused(emu, rng):
    a = rng.standard_normal(8).astype(np.float64)
    call = half_call("add", (a, a), {}, "float64")
    assert emu.unsupported(call) is not None
    with pytest.raises(GpuError) as info:
        emu.run(call)
    assert info.value.kind == "unsupported"


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
    from hipsched.gpu.ops.attention import decode_launches
    launches, nsplit, chunk = decode_launches(1, 32, 8, 4096, 128, "f16", 132)
    assert nsplit * chunk >= 4096 > (nsplit - 1) * chunk
    assert 1.5 * 132 <= launches[0].grid[0] <= 2.5 * 132 and launches[1].grid[0] == 32   # 8 KV heads alone: 8 blocks


def _attention_kernel_names(emu, call):
    from hipsched.gpu.ops.attention import attention_plan
    return [launch.kernel for launch in attention_plan(emu._ctx, call)]
