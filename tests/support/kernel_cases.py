"""The kernel tests that run on any GPU backend a test module gives them as its `emu` fixture: collected
by tests/gpu/emulator/test_gpu_kernels_emulated.py on the kernel emulator (float32 and the halves) and by
tests/gpu/device/test_gpu_ops.py on a real GPU (the halves; its float32 tests are its own), each with its
own `emu` and its own pytest_generate_tests (parametrize_dtype), and the helpers both use. Each test
checks the kernels and their glue against the CPU engine and outside references: a half result must be
the float32 kernel's result on the widened inputs rounded once to the half type, bit for bit; float32
results are compared with the CPU engine instead. Outside references: the float32 computation
NumPy/ml_dtypes round to the type, bit for bit where the kernel's arithmetic is that float32 computation,
a float64 computation otherwise. The formats' terms of the half bounds (UNIT: a rounding's relative
error; TINY: its absolute error where the result underflows) are tests/support/half_formats.py's, as in
the CPU tests. A test module collects a test here by importing it."""
import numpy as np
import pytest
from half_formats import HALF, TINY, TYPE_IDS, TYPES, UNIT, assert_same_halves, ml_dtypes, rounded
from requires import need

from hipsched.backends.cpu import CpuBackend
from hipsched.errors import GpuError
from hipsched.ops import OPS
from hipsched.ops.base import Call


CPU = CpuBackend()


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
