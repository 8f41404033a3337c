"""The op matrix's cases: for every registered op with a GPU side, a builder of its arguments (per
dtype and form) and a check of its result against `backend="cpu"`'s and an outside reference. Shared by
tests/gpu/emulator/test_executor_op_matrix.py (every op x dtype x form through the Executor) and
test_compiled_call_path.py (the same cases replayed through the compiled call path).

Bounds: U is the unit roundoff of the result's type (2^-24 float32, 2^-11 float16, 2^-8 bfloat16) and
TINY half its smallest subnormal step (the absolute error where a result underflows); each half result
is one rounding of a float32 computation, so its bound is U |ref| on top of that computation's float32
bound (the same bounds as the kernel tests, test_gpu_kernels_emulated.py, state per op). U and TINY are
half_formats.py's, as everywhere in the tests."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest

from graph_data import random_graph
from half_formats import HALF, TINY, UNIT
from hipsched import quantize
from hipsched.gpu.memory.device_array import DeviceArray
from hipsched.ops import OPS
from kernel_cases import cosines64, gguf_dequantized
from requires import need

NP = {"float32": np.dtype(np.float32), **HALF}


def elem(dtype: str) -> str:
    """The element type of the arrays a declared dtype stands for: a float name is itself; qmatmul's
    "q8_0/float16" is x's float16; a bare quant type ("q8_0") has float32 activations."""
    if dtype in NP:
        return dtype
    return dtype.partition("/")[2] or "float32"


def randn(rng, dtype, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(NP[elem(dtype)])


def f64(a):
    return np.asarray(a).astype(np.float64)


def within(got, ref, bound, what=""):
    got = f64(got)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    err = np.abs(got - ref)
    assert np.all(err <= bound), f"{what}: worst error / bound = {float(np.max(err / (bound + 1e-300))):.3g}"


# ------------------------------------------------------------------------------ per-op builders
# make(rng, dtype, form) -> (args, kwargs); check(out, args, kwargs, dtype) asserts the result against the
# outside reference (host arrays); out_dtype(dtype) is the result's dtype by the op's rule (scores and
# dequantized weights are float32, everything else the inputs' type).

FLOATS = ("float32", "float16", "bfloat16")
QTYPES = ("q8_0", "q4_0")


@dataclasses.dataclass(frozen=True)
class Case:
    make: Callable
    check: Callable
    # every input type the op's prepare takes, named as its Call.dtype should name it: the cases run the
    # union of these and the GPU side's declared dtypes, so inputs the GPU side does not declare are run
    # too (the GPU must refuse them, not read them as another type)
    variants: tuple = FLOATS
    forms: tuple = ("vector", "matrix")
    device: tuple = ()            # positions of the arguments the op takes as device arrays
    exact: bool = False           # GPU and CPU give the same bits (elementwise arithmetic)
    out_dtype: Callable = elem


def _add(rng, dtype, form):
    if form == "vector":
        return (randn(rng, dtype, 257, scale=10), randn(rng, dtype, 257, scale=10)), {}
    return (randn(rng, dtype, 5, 40, scale=10), randn(rng, dtype, 40, scale=10)), {}   # b a bias


def _check_add(out, args, kwargs, dtype):
    ref = f64(args[0]) + f64(args[1])
    within(out, ref, UNIT[elem(dtype)] * np.abs(ref) + TINY[elem(dtype)], "add")


def _scale(rng, dtype, form):
    return (randn(rng, dtype, *((257,) if form == "vector" else (5, 40)), scale=10), -1.7), {}


def _check_scale(out, args, kwargs, dtype):
    ref = f64(args[0]) * float(np.float32(args[1]))   # alpha rounded to float32, as PyTorch does
    within(out, ref, UNIT[elem(dtype)] * np.abs(ref) + TINY[elem(dtype)], "scale")


def _softmax(rng, dtype, form):
    return (randn(rng, dtype, *((300,) if form == "vector" else (5, 33)), scale=5),), {}


def _check_softmax(out, args, kwargs, dtype):
    softmax = need("scipy.special", reason="SciPy's softmax is the reference (test extra)").softmax
    ref = softmax(f64(args[0]), axis=-1)
    # float32's error 2e-6 relative (test_softmax), then the result's rounding
    within(out, ref, (UNIT[elem(dtype)] * (1 + 2e-6) + 2e-6) * ref + 1e-7 * (elem(dtype) == "float32")
           + TINY[elem(dtype)], "softmax")


def _rms_norm(rng, dtype, form):
    x = randn(rng, dtype, *((40,) if form == "vector" else (5, 40)), scale=4)
    return (x, randn(rng, dtype, 40)), {"eps": 1e-5}


def _check_rms_norm(out, args, kwargs, dtype):
    x, w = f64(args[0]), f64(args[1])
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + kwargs["eps"]) * w
    # float32 within one ulp (the sum of squares is double), then the result's rounding
    within(out, ref, (UNIT[elem(dtype)] + 2.0 ** -23) * np.abs(ref) + TINY[elem(dtype)], "rms_norm")


def _cosine(rng, dtype, form):
    q = randn(rng, dtype, *((12,) if form == "vector" else (3, 12)))
    return (q, randn(rng, dtype, 70, 12)), {}


def _check_cosine(out, args, kwargs, dtype):
    # scores are float32 sums of d products whatever the inputs (these widen exactly): test_cosine's bound
    d = args[1].shape[1]
    within(out, cosines64(*args), np.full(np.shape(out), 3e-6 + 2e-7 * np.sqrt(d)), "cosine_similarity")


def _top_k(rng, dtype, form):
    q = randn(rng, dtype, *((8,) if form == "vector" else (2, 8)))
    return (q, randn(rng, dtype, 64, 8), 3), {}


def _check_top_k(out, args, kwargs, dtype):
    idx, scores = out
    ref = np.atleast_2d(cosines64(args[0], args[1]))
    idx2, scores2 = np.atleast_2d(idx), np.atleast_2d(scores)
    assert idx2.shape == (ref.shape[0], args[2]) and np.asarray(scores).dtype == np.float32
    at = np.take_along_axis(ref, idx2.astype(np.int64), axis=1)
    within(scores2, at, np.full(at.shape, 3e-6 + 2e-7 * np.sqrt(args[1].shape[1])), "top_k scores")
    # the k best by the float64 scores, up to swaps between scores closer than float32's error
    kth = -np.sort(-ref, axis=1)[:, args[2] - 1]
    assert (at > kth[:, None] - 1e-5).all(), "top_k: an index outside the k best"
    assert (np.diff(scores2, axis=1) <= 0).all(), "top_k: scores not in descending order"


def _matmul(rng, dtype, form):
    if form == "vector":
        return (randn(rng, dtype, 9), randn(rng, dtype, 9, 33)), {}
    return (randn(rng, dtype, 33, 8), randn(rng, dtype, 8, 65)), {}


def _check_matmul(out, args, kwargs, dtype):
    a, b = f64(args[0]), f64(args[1])
    ref, mag = a @ b, np.abs(a) @ np.abs(b)
    # a float32 sum of K products (K 2^-24 |a| @ |b|), doubled for a vendor BLAS's order and split-K
    within(out, ref, UNIT[elem(dtype)] * np.abs(ref) + 2 * a.shape[-1] * 2.0 ** -24 * mag + TINY[elem(dtype)],
           "matmul")


# plain and causal: head dim 16 (the d32 kernels, padded); d32: head dim exactly 32, 2 batches of 3
# heads (the tensor-core grid covers every (batch, head)); peaky: q scaled so that about 3 in 4 softmax
# numerators fall under 2^-14 (float16's least normal: P rounded to float16 is subnormal there)
ATTENTION_FORMS = {"plain": (1, 2, 7, 20, 16, 1.0), "causal": (1, 2, 7, 20, 16, 1.0),
                   "d32": (2, 3, 9, 21, 32, 1.0), "peaky": (2, 2, 9, 40, 32, 7.0)}


def _attention(rng, dtype, form):
    b, h, sq, sk, hd, qscale = ATTENTION_FORMS[form]
    q = randn(rng, dtype, b, h, sq, hd, scale=qscale)
    k, v = randn(rng, dtype, b, h, sk, hd), randn(rng, dtype, b, h, sk, hd)
    return (q, k, v), {"causal": form == "causal"}


def _check_attention(out, args, kwargs, dtype):
    torch = need("torch", reason="PyTorch CPU is the attention reference (test extra)")
    q, k, v = (torch.from_numpy(f64(a)) for a in args)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=kwargs["causal"]).numpy()
    # float32's error (2e-5 relative and absolute: test_gpu_quant_attention_spread.py), then the result's rounding
    bound = UNIT[elem(dtype)] * np.abs(ref) + 2e-5 * (1 + np.abs(ref)) + TINY[elem(dtype)]
    if dtype != "float32":
        # the GPU's tensor-core kernels also round the softmax numerators P to the input type: 2u/(1-u) M
        # more, M the output's magnitude scale (attention applied to |v|; docs/design/kernels.md, "Attention on
        # tensor cores"). The CPU engine's result, checked here too, is well inside it.
        mag = torch.nn.functional.scaled_dot_product_attention(q, k, v.abs(), is_causal=kwargs["causal"]).numpy()
        u = UNIT[elem(dtype)]
        bound = bound + 2 * u / (1 - u) * mag
    within(out, ref, bound, "attention")


def _spread(rng, dtype, form):
    indptr, indices, weights = random_graph(rng, 40, 200)
    seeds = np.zeros(40, np.float32)
    seeds[:4] = 1
    return ((indptr, indices, weights * np.float32(0.5)), seeds), {"decay": 0.5, "steps": 3, "threshold": 0.0}


def _check_spread(out, args, kwargs, dtype):
    sparse = need("scipy.sparse", reason="SciPy's sparse matrices are the reference (test extra)")
    (indptr, indices, weights), seeds = args
    n = len(seeds)
    A = sparse.csr_matrix((f64(weights), indices, indptr), shape=(n, n))   # duplicate edges add up
    a = f64(seeds)
    for _ in range(kwargs["steps"]):
        a = np.clip(a + kwargs["decay"] * (A.T @ a), 0, 1)
        a[a < kwargs["threshold"]] = 0
    # float32 sums in any order: ~1e-6 per step for activations in [0, 1] (ops/graph.py)
    within(out, a, np.full(a.shape, 1e-5), "spread_activation")


def _dequantize(rng, dtype, form):
    return (quantize(rng.standard_normal((20, 64)).astype(np.float32), dtype),), {}


def _check_dequantize(out, args, kwargs, dtype):
    np.testing.assert_array_equal(out, gguf_dequantized(args[0]))   # fp16 scale x int: exact


# the mat-vec, the 8-column mat-vec, and the 64x64 tiles (on the emulated sm_90 a half x takes the
# tensor-core ones, a float32 x the SIMT ones) with a partial column tile (17, 100) and a whole one (64)
QMATMUL_COLUMNS = {"vector": None, "columns": 3, "tiles17": 17, "tiles64": 64, "tiles100": 100}


def _qmatmul(rng, dtype, form):
    qtype = dtype.partition("/")[0]
    # 69 rows: partial row pairs and tiles; k = 96: the tiles' last 64-k step is half padding
    W = quantize(rng.standard_normal((69, 96)).astype(np.float32), qtype)
    m = QMATMUL_COLUMNS[form]
    return (W, randn(rng, dtype, *((96,) if m is None else (96, m)))), {}


def _check_qmatmul(out, args, kwargs, dtype):
    Wf, x = f64(gguf_dequantized(args[0])), f64(args[1])
    ref = Wf @ x
    # float32 sums of k products (and the per-block scale products): 2 k 2^-24 |W| @ |x|, then the
    # result's rounding
    bound = UNIT[elem(dtype)] * np.abs(ref) + 2 * Wf.shape[1] * 2.0 ** -24 * (np.abs(Wf) @ np.abs(x))
    within(out, ref, bound + TINY[elem(dtype)], "qmatmul")


CASES = {
    "add": Case(_add, _check_add, device=(0, 1), exact=True),
    "scale": Case(_scale, _check_scale, device=(0,), exact=True),
    "softmax": Case(_softmax, _check_softmax, device=(0,)),
    "rms_norm": Case(_rms_norm, _check_rms_norm, device=(0, 1)),
    "cosine_similarity": Case(_cosine, _check_cosine, device=(0, 1), out_dtype=lambda d: "float32"),
    "top_k": Case(_top_k, _check_top_k, device=(0, 1), out_dtype=lambda d: "float32"),
    "matmul": Case(_matmul, _check_matmul, device=(0, 1)),
    "attention": Case(_attention, _check_attention, forms=tuple(ATTENTION_FORMS), device=(0, 1, 2)),
    # CSR parts and seeds are host arrays only (ops/graph.py)
    "spread_activation": Case(_spread, _check_spread, variants=("float32",), forms=("graph",)),
    "dequantize": Case(_dequantize, _check_dequantize, variants=QTYPES, forms=("matrix",), exact=True,
                       out_dtype=lambda d: "float32"),
    # W's quant type with x of each float type: "q8_0" (float32 x), "q8_0/float16", ...
    "qmatmul": Case(_qmatmul, _check_qmatmul, variants=tuple(q if x == "float32" else f"{q}/{x}"
                                                             for q in QTYPES for x in FLOATS),
                    forms=tuple(QMATMUL_COLUMNS), device=(1,)),
}


def matrix():
    """(op, dtype, form, where) for every op with a GPU side: the dtypes its spec declares for the GPU,
    and those its builder makes."""
    params = []
    for op, spec in OPS.items():
        if spec.gpu is None:
            continue
        case = CASES.get(op)
        if case is None:   # collected, and failed by the test: a registered op left uncovered is loud
            params.append(pytest.param(op, None, None, None, id=f"{op}-has-no-builder"))
            continue
        for dtype in dict.fromkeys(spec.gpu_dtypes + case.variants):
            for form in case.forms:
                for where in ("host", "device") if case.device else ("host",):
                    params.append(pytest.param(op, dtype, form, where,
                                               id=f"{op}-{dtype.replace('/', '-')}-{form}-{where}"))
    return params


def to_host(out):
    if isinstance(out, tuple):
        return tuple(to_host(o) for o in out)
    return out.get() if isinstance(out, DeviceArray) else out


def assert_same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
