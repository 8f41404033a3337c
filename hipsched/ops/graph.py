"""spread_activation: Engram-style spreading activation over a weighted directed graph.

The graph is a SciPy sparse matrix/array (CSR, or any format with .tocsr()) or an
(indptr, indices, weights) CSR tuple, n x n, with A[i, j] the weight of the edge i -> j. Seeds are the
initial activations: a dense (n,) array, or a dict {node: activation} (other nodes 0). Each step, from
the previous step's activations a (all of them, so the order of nodes does not matter):

    a_new[j] = a[j] + decay * sum_i A[i, j] * a[i]       (a + decay * A^T a; duplicate edges add up)
    a_new    = clip(a_new, 0, 1)                          (NaN stays NaN, as np.clip)
    a_new[a_new < threshold] = 0

`steps` = 0 returns the seeds unchanged (as float32), the graph still validated. An edge out of a node
whose activation is exactly 0 adds nothing, unless its weight is NaN or inf: 0 * w is NaN there, which
reaches the target as SciPy's `a + decay * (A.T @ a)` gives it (NaN stays NaN through the clamp). The
kernels skip inactive nodes' edges all the same, reading only their weights in the first step (a graph
with no NaN or inf weight costs one pass over the weights of nodes inactive in the first step).
Results are float32, accumulated in float32: within ~1e-6 absolute per step of a float64 evaluation
for activations in [0, 1] and moderate degrees (summation order differs).

The graph is validated here, before any backend sees it, by one parallel pass in C: indptr must start
at 0, never decrease and end at nnz; every index must lie in [0, n). A bad graph is a ValueError,
never a read out of bounds (the CPU kernel checks again as it reads, for direct callers). indptr and
indices are passed on both int32 (when both are, as SciPy keeps them: no copy) or both int64;
weights and seeds as float32. SciPy is never imported here: sparse matrices are
recognised by their attributes."""
from __future__ import annotations

import numpy as np

from .base import Call, _resolve, register
from .converted_copies import converted_once
from .validation import as_f32, check_ndim, contiguous_aligned, finite_scalar, shape_mismatch

OP = "spread_activation"
MAX_STEPS = 2**31 - 1
_CPU = "hipsched.cpu._graph"
# The CSR check is compiled code of the CPU extension that every backend relies on (the GPU kernels trust
# the graph). Named like the spec's kernels and resolved on first use, so the op specs import no kernel
# module and `import hipsched` never needs it.
_CHECK_CSR = (_CPU, "check_csr")


def _csr_parts(graph):
    """(indptr, indices, weights, n_cols or None) from a SciPy sparse matrix/array or a CSR tuple."""
    if hasattr(graph, "tocsr") and hasattr(graph, "shape"):  # SciPy sparse, by duck type
        if getattr(graph, "format", None) != "csr":
            graph = graph.tocsr()
        rows, cols = (int(s) for s in graph.shape)
        if rows != cols:
            raise ValueError(f"{OP}: the graph must be square (n x n, A[i, j] = weight of i -> j), got shape "
                             f"{tuple(graph.shape)}")
        return graph.indptr, graph.indices, graph.data, cols
    if isinstance(graph, (tuple, list)) and len(graph) == 3:
        return graph[0], graph[1], graph[2], None
    raise TypeError(f"{OP}: graph must be a SciPy sparse matrix/array or an (indptr, indices, weights) tuple, "
                    f"got {type(graph).__name__}")


def _index_array(x, name: str):
    """1-d integer array (any integer dtype; converted later)."""
    try:
        a = np.asarray(x)
    except Exception as e:
        raise TypeError(f"{OP}: {name} cannot be read as an array: {e}") from None
    if a.dtype.kind not in "iu":
        raise TypeError(f"{OP}: {name} must hold integers, got dtype {a.dtype}")
    check_ndim(a, (1,), OP, name)
    return a


_INT32_MAX = 2**31 - 1


def _fits_int32(a) -> bool:
    return a.size == 0 or (int(a.min()) >= 0 and int(a.max()) <= _INT32_MAX)


def _index_pair(indptr, indices):
    """indptr and indices as C-contiguous arrays of one dtype: both int32 when both already are (SciPy's
    usual case, no copy), or when indices are int32 and the offsets fit in int32 (n + 1 offsets are
    converted, not nnz indices: large graphs often come with int64 offsets), else both int64 (uint64
    beyond int64 wraps negative: the checks reject it). A conversion of an input that cannot change is
    made once (ops.converted_copies.converted_once), so a fixed graph is neither converted nor uploaded again."""
    if indices.dtype == np.int32 and indptr.dtype != np.int32 and indptr.shape[0] - 1 <= _INT32_MAX:
        narrow = converted_once(indptr, "int32 offsets",
                                lambda a: contiguous_aligned(a, np.int32) if _fits_int32(a) else None)
        if narrow is not None:
            return narrow, contiguous_aligned(indices)
    dt = np.int32 if indptr.dtype == np.int32 and indices.dtype == np.int32 else np.int64
    # an array the kernels take as it is (SciPy's int32 pair) is passed on without a look at the memo
    return tuple(a if a.dtype == dt and a.flags.c_contiguous and a.flags.aligned else
                 converted_once(a, ("index", dt), lambda a, dt=dt: contiguous_aligned(a, dt)) for a in (indptr, indices))


def _seed_array(seeds, n: int):
    if isinstance(seeds, dict):
        a = np.zeros(n, dtype=np.float32)
        for node, value in seeds.items():
            if isinstance(node, (bool, np.bool_)) or not isinstance(node, (int, np.integer)):
                raise TypeError(f"{OP}: seed nodes must be integers, got {node!r}")
            if not 0 <= int(node) < n:
                raise ValueError(f"{OP}: seed node {node} is out of range for a graph of {n} nodes")
            # each value as a dense seed would be: a string, complex or None is a TypeError naming the
            # node (np.float32(None) was a silent NaN, "high" NumPy's bare ValueError)
            v = as_f32(np.asarray(value) if value is not None else np.asarray(value, dtype=object),
                       OP, f"seeds[{node!r}]", allow_device=False)
            if v.ndim:
                raise ValueError(f"{OP}: seeds[{node!r}] must be one number, got shape {v.shape}")
            a[int(node)] = v
        return a
    a = as_f32(seeds, OP, "seeds", allow_device=False)
    check_ndim(a, (1,), OP, "seeds")
    if a.shape[0] != n:
        raise shape_mismatch(OP, "seeds", a.shape, "graph", (n, n), "one activation per node")
    return a


def _sweep(rng, degree=8):
    for n in (256, 4096, 65536):
        indptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
        indices = rng.integers(0, n, n * degree, dtype=np.int64)
        weights = rng.random(n * degree, dtype=np.float32)
        seeds = np.zeros(n, np.float32)
        seeds[:8] = 1.0
        yield n * degree * 3, ((indptr, indices, weights), seeds), {"decay": 0.5, "steps": 3, "threshold": 0.0}


@register(OP, cpu=(_CPU, "spread_activation"), gpu=("hipsched.gpu.glue.graph", "spread_activation"),
          sweep=_sweep, cost=(12.0, 2.0), result=lambda call: ((int(call.args[3].shape[0]),), "float32"))
def prepare(graph, seeds, decay=0.5, steps=1, threshold=0.0) -> Call:
    """Spreading activation over a weighted directed graph (a SciPy sparse matrix or an (indptr,
    indices, weights) CSR tuple, n x n) from `seeds` (a dense (n,) array or a {node: activation} dict):
    each of `steps` steps sets a = clip(a + decay * A^T a, 0, 1), then zeroes activations below
    `threshold`. Returns float32 activations (n,)."""
    indptr, indices, weights, cols = _csr_parts(graph)
    indptr, indices = _index_pair(_index_array(indptr, "indptr"), _index_array(indices, "indices"))
    weights = as_f32(weights, OP, "weights", allow_device=False)
    check_ndim(weights, (1,), OP, "weights")
    if indptr.shape[0] < 1:
        raise ValueError(f"{OP}: indptr must hold n + 1 >= 1 offsets, got shape {indptr.shape}")
    n = indptr.shape[0] - 1
    if cols is not None and cols != n:
        raise shape_mismatch(OP, "indptr", indptr.shape, "graph", (cols, cols))
    if indices.shape[0] != weights.shape[0]:
        raise shape_mismatch(OP, "indices", indices.shape, "weights", weights.shape, "one weight per edge")
    _resolve(_CHECK_CSR)(indptr, indices)
    seeds = _seed_array(seeds, n)
    decay = finite_scalar(decay, OP, "decay")
    if abs(decay) > float(np.finfo(np.float32).max):  # the kernels take it as float32: inf * 0 would be NaN
        raise ValueError(f"{OP}: decay must be within float32's range, got {decay!r}")
    # the kernels count steps in an int64; far beyond any useful count, so bound it where the error can
    # name the argument (2**63 was a bare OverflowError from the cast)
    steps = finite_scalar(steps, OP, "steps", lo=0, hi=MAX_STEPS, integer=True)
    threshold = finite_scalar(threshold, OP, "threshold")
    nnz = int(indices.shape[0])
    return Call(OP, (indptr, indices, weights, seeds), {"decay": decay, "steps": steps, "threshold": threshold},
                size=nnz * max(steps, 1),
                nbytes=indptr.nbytes + indices.nbytes + weights.nbytes + 2 * seeds.nbytes)
