"""spread_activation over a CSR graph partitioned by rows across the workers: for graphs no single worker
holds. Partition p holds rows [r0, r1) of A (the out-edges of nodes r0 .. r1-1). Each step, every
partition pushes its nodes' activations along its edges (A_p^T a_p, a dense vector over all n nodes),
a fixed tree sums the partial vectors, and the root applies the single-machine rule

    a_new = clip(a + decay * sum_p A_p^T a_p, 0, 1);  a_new[a_new < threshold] = 0

(hipsched/ops/graph.py). The partitions are checked on the client, before any task: every block a
well-formed CSR piece with indices in [0, n), the blocks tiling [0, n) with no gap or overlap."""
from __future__ import annotations

import numbers

import dask
import dask.array as da
import numpy as np

from ..ops.validation import as_f32, check_ndim, finite_scalar, shape_mismatch
from ..ops.graph import MAX_STEPS, OP, _csr_parts, _index_array, _index_pair, _seed_array

SPLIT_EVERY = 8      # fan-in of the tree that sums the partitions' partial vectors
MAX_GRAPH_STEPS = 10_000   # the task graph grows with steps; far beyond the few steps spreading uses


class _Part:
    __slots__ = ("row_start", "rows", "nnz", "data")

    def __init__(self, row_start, rows, nnz, data):
        self.row_start, self.rows, self.nnz, self.data = row_start, rows, nnz, data


def _where(i):
    return f"hipsched.dask.{OP}: partition {i}"


def _check_block(i, block, n):
    """(row_start, (indptr, indices, weights)) of one partition, checked; n may be None (not known yet)."""
    if not isinstance(block, (tuple, list)) or len(block) not in (2, 4):
        raise TypeError(f"{_where(i)} must be (row_start, indptr, indices, weights) or (row_start, scipy CSR rows), "
                        f"got {type(block).__name__}" + (f" of length {len(block)}" if isinstance(block, (tuple, list)) else ""))
    r0 = block[0]
    if isinstance(r0, (bool, np.bool_)) or not isinstance(r0, numbers.Integral) or r0 < 0:
        raise ValueError(f"{_where(i)}: row_start must be an integer >= 0, got {r0!r}")
    r0 = int(r0)
    cols = None
    if len(block) == 2:
        m = block[1]
        if not (hasattr(m, "tocsr") and hasattr(m, "shape")):
            raise TypeError(f"{_where(i)}: expected a SciPy sparse matrix of its rows, got {type(m).__name__}")
        if getattr(m, "format", None) != "csr":
            m = m.tocsr()
        cols = int(m.shape[1])
        indptr, indices, weights = m.indptr, m.indices, m.data
    else:
        indptr, indices, weights = block[1:]
    indptr, indices = _index_pair(_index_array(indptr, f"partition {i} indptr"), _index_array(indices, f"partition {i} indices"))
    weights = as_f32(weights, OP, f"partition {i} weights", allow_device=False)
    check_ndim(weights, (1,), OP, f"partition {i} weights")
    if indptr.shape[0] < 1:
        raise ValueError(f"{_where(i)}: indptr must hold rows + 1 >= 1 offsets, got shape {indptr.shape}")
    if indices.shape[0] != weights.shape[0]:
        raise shape_mismatch(OP, f"partition {i} indices", indices.shape, "weights", weights.shape, "one weight per edge")
    nnz = int(indices.shape[0])
    d = np.diff(indptr)
    if indptr[0] != 0 or (d.size and int(d.min()) < 0) or int(indptr[-1]) != nnz:
        bad = 0 if indptr[0] != 0 else (int(np.argmax(d < 0)) + 1 if d.size and d.min() < 0 else indptr.shape[0] - 1)
        raise ValueError(f"{_where(i)}: indptr is not a valid CSR row pointer at position {bad} (value {indptr[bad]}): "
                         f"it must start at 0, never decrease, and end at nnz = {nnz}")
    if cols is not None and n is not None and cols != n:
        raise ValueError(f"{_where(i)}: its SciPy rows have {cols} columns, the graph has {n} nodes")
    return r0, cols, (indptr, indices, weights)


class PartitionedGraph:
    """A graph of n nodes (A[i, j] = weight of the edge i -> j) as row partitions, for
    hipsched.dask.spread_activation.

    `parts`: a list of blocks, each `(row_start, indptr, indices, weights)` (the CSR of rows
    [row_start, row_start + len(indptr) - 1), column indices over all n nodes) or `(row_start, csr)` with a
    SciPy sparse matrix of shape (rows, n). They must tile [0, n) exactly: sorted by row_start, the
    first starts at 0 and each starts where the previous ends (no gap, no overlap); `n` defaults to
    where the last ends. Every block is checked here, on the client: indptr starts at 0, never decreases
    and ends at its nnz; every index lies in [0, n). `scatter(client)` moves the blocks to the workers
    (each block to one worker) and returns a graph that refers to them there."""

    def __init__(self, parts, n=None):
        if not isinstance(parts, (list, tuple)) or not parts:
            raise TypeError(f"hipsched.dask.{OP}: a partitioned graph needs a non-empty list of row blocks, got "
                            f"{type(parts).__name__ if not isinstance(parts, (list, tuple)) else 'an empty list'}")
        if n is not None and (isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or n < 0):
            raise ValueError(f"hipsched.dask.{OP}: n must be an integer >= 0, got {n!r}")
        checked = [(i, *_check_block(i, b, n)) for i, b in enumerate(parts)]
        # tiling first: the index check needs n, and n is where the tiling ends
        order = sorted(checked, key=lambda c: (c[1], c[3][0].shape[0] - 1))
        end = 0
        for i, r0, _, (indptr, _, _) in order:
            rows = indptr.shape[0] - 1
            if r0 > end:
                raise ValueError(f"hipsched.dask.{OP}: the partitions do not tile the node range: rows [{end}, {r0}) "
                                 f"are in no partition (partition {i} starts at {r0})")
            if r0 < end:
                raise ValueError(f"hipsched.dask.{OP}: the partitions do not tile the node range: partition {i} "
                                 f"(rows [{r0}, {r0 + rows})) overlaps rows before {end}")
            end = r0 + rows
        if n is None:
            n = end
        elif end != n:
            raise ValueError(f"hipsched.dask.{OP}: the partitions do not tile the node range: they cover [0, {end}), "
                             f"the graph has n = {n} nodes")
        self._parts = []
        for i, r0, cols, (indptr, indices, weights) in order:
            if cols is not None and cols != n:
                raise ValueError(f"{_where(i)}: its SciPy rows have {cols} columns, the graph has {n} nodes")
            if indices.size:
                lo, hi = int(indices.min()), int(indices.max())
                if lo < 0 or hi >= n:
                    e = int(np.argmax((indices < 0) | (indices >= n)))
                    raise ValueError(f"{_where(i)}: indices[{e}] = {indices[e]} is out of range for a graph of {n} "
                                     f"nodes (valid: 0 .. {n - 1})")
            self._parts.append(_Part(r0, indptr.shape[0] - 1, int(indices.shape[0]), (indptr, indices, weights)))
        self.n = int(n)
        self._scattered = False

    @classmethod
    def _from_parts(cls, parts, n, scattered):
        g = cls.__new__(cls)
        g._parts, g.n, g._scattered = parts, n, scattered
        return g

    @property
    def partitions(self):
        """[(row_start, rows, nnz)] in row order."""
        return [(p.row_start, p.rows, p.nnz) for p in self._parts]

    @property
    def nnz(self):
        return sum(p.nnz for p in self._parts)

    def scatter(self, client, **kwargs) -> "PartitionedGraph":
        """The same graph with each block held by one worker (client.scatter, spread over the workers):
        steps then move activations, never edges. Returns a new PartitionedGraph; this one is unchanged."""
        if self._scattered:
            return self
        futures = client.scatter([p.data for p in self._parts], **kwargs)
        parts = [_Part(p.row_start, p.rows, p.nnz, f) for p, f in zip(self._parts, futures)]
        return PartitionedGraph._from_parts(parts, self.n, True)

    def __repr__(self):
        return (f"PartitionedGraph(n={self.n}, nnz={self.nnz}, partitions={len(self._parts)}"
                f"{', scattered' if self._scattered else ''})")


def partition_graph(graph, rows_per_part) -> PartitionedGraph:
    """A single-machine graph (SciPy sparse or an (indptr, indices, weights) CSR tuple, as
    hipsched.spread_activation takes) cut into partitions of `rows_per_part` rows (the last may be
    shorter). The blocks share the arrays' memory until scattered."""
    if isinstance(rows_per_part, (bool, np.bool_)) or not isinstance(rows_per_part, numbers.Integral) or rows_per_part < 1:
        raise ValueError(f"hipsched.dask.partition_graph: rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    indptr, indices, weights, cols = _csr_parts(graph)
    indptr = _index_array(indptr, "indptr")
    n = indptr.shape[0] - 1
    if cols is not None and cols != n:
        raise shape_mismatch(OP, "indptr", indptr.shape, "graph", (cols, cols))
    blocks = []
    for r0 in range(0, max(n, 1), int(rows_per_part)):
        r1 = min(r0 + int(rows_per_part), n)
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        blocks.append((r0, np.asarray(indptr[r0:r1 + 1]) - indptr[r0], np.asarray(indices)[e0:e1],
                       np.asarray(weights)[e0:e1]))
    return PartitionedGraph(blocks, n)


# ---------------------------------------------------------------------------------------- tasks
def _push(block, a, row_start, n):
    """A_p^T a_p for the partition's rows: the float32 products w_ij * a_i, as the CPU kernel forms them,
    summed per target node in float64 (then rounded once), so a partition adds no more rounding than
    one float32 sum would. An edge out of a node whose activation is exactly 0 adds nothing but where
    its weight is NaN or infinite, which adds NaN (0 * w), as on one machine and in SciPy's A.T @ a."""
    indptr, indices, weights = block
    src = np.repeat(a[row_start:row_start + indptr.shape[0] - 1], np.diff(indptr))
    live = (src != 0) | ~np.isfinite(weights)
    return np.bincount(indices[live], weights=weights[live] * src[live], minlength=n).astype(np.float32)


def _sum(*parts):
    out = parts[0].copy()
    for p in parts[1:]:
        out += p
    return out


def _finish(a, decay, threshold, *parts):
    """The single-machine step rule on the summed pushes: clip to [0, 1] (NaN stays NaN), then zero
    what is below the threshold, in float32 as the kernel computes it."""
    s = _sum(*parts)
    x = a + np.float32(decay) * s
    x[x < 0] = 0
    x[x > 1] = 1
    x[x < np.float32(threshold)] = 0
    return x


def _seeds(seeds, n):
    if isinstance(seeds, da.Array):
        if seeds.dtype.kind not in "biuf":
            raise TypeError(f"{OP}: argument 'seeds' has dtype {seeds.dtype}; expected float32 or a real numeric type "
                            f"convertible to float32")
        check_ndim(seeds, (1,), OP, "seeds")
        if seeds.shape[0] != n:
            raise shape_mismatch(OP, "seeds", seeds.shape, "graph", (n, n), "one activation per node")
        s = seeds.astype(np.float32)
        return s.rechunk(n) if s.numblocks != (1,) else s
    a = _seed_array(seeds, n)
    return da.from_array(a, chunks=a.shape, name=f"hipsched-seeds-{dask.base.tokenize(a)}")


def spread_activation(graph, seeds, decay=0.5, steps=1, threshold=0.0, *, split_every: int = SPLIT_EVERY):
    """hipsched.spread_activation over a graph partitioned by rows -> Dask float32 (n,), one chunk.

    `graph`: a PartitionedGraph (from partition_graph, PartitionedGraph(blocks), or .scatter(client)),
    or a list of blocks (checked as PartitionedGraph(blocks) does). `seeds`: a dense (n,) array (NumPy or
    Dask) or a dict {node: activation}. `decay`, `steps`, `threshold` as on one machine (steps at most
    10,000 here: the task graph has about steps x partitions tasks). Per step each partition computes
    A_p^T a_p from its nodes' activations, a tree of fan-in `split_every` sums the partial vectors in a
    fixed order, and the root applies the clamp and threshold. The summation order differs from the
    multi-threaded kernel's, so results agree with hipsched.spread_activation on the whole graph within
    the float32 bound of the sums (see tests/dask/test_dask_graph.py), not bit for bit."""
    if not isinstance(graph, PartitionedGraph):
        if isinstance(graph, (list, tuple)) and graph and isinstance(graph[0], (list, tuple)):
            graph = PartitionedGraph(graph)
        else:
            raise TypeError(f"hipsched.dask.{OP}: graph must be a PartitionedGraph or a list of row blocks "
                            f"(row_start, indptr, indices, weights), got {type(graph).__name__} "
                            f"(hipsched.dask.partition_graph(graph, rows_per_part) cuts a single-machine graph)")
    n = graph.n
    a0 = _seeds(seeds, n)
    decay = finite_scalar(decay, OP, "decay")
    if abs(decay) > float(np.finfo(np.float32).max):
        raise ValueError(f"{OP}: decay must be within float32's range, got {decay!r}")
    steps = finite_scalar(steps, OP, "steps", lo=0, hi=MAX_STEPS, integer=True)
    if steps > MAX_GRAPH_STEPS:
        raise ValueError(f"hipsched.dask.{OP}: steps must be <= {MAX_GRAPH_STEPS} on a partitioned graph (each step "
                         f"adds a task per partition), got {steps}")
    threshold = finite_scalar(threshold, OP, "threshold")
    if not isinstance(split_every, numbers.Integral) or split_every < 2:
        raise ValueError(f"hipsched.dask.{OP}: split_every must be an integer >= 2, got {split_every!r}")
    if steps == 0:
        return a0
    token = dask.base.tokenize(graph.partitions, [p.data.key if graph._scattered else p.data for p in graph._parts],
                               a0, decay, steps, threshold, split_every)
    if graph._scattered:
        blocks = [dask.delayed(p.data) for p in graph._parts]
    else:
        # one task per block: every step refers to the same key, so a block travels to a worker once per call
        blocks = [dask.delayed(p.data, name=f"hipsched-graph-block-{token}-{i}", pure=False)
                  for i, p in enumerate(graph._parts)]
    push = dask.delayed(_push, pure=True)
    add = dask.delayed(_sum, pure=True)
    finish = dask.delayed(_finish, pure=True)
    a = a0.to_delayed().ravel()[0]
    for s in range(1, steps + 1):
        level = [push(b, a, p.row_start, n, dask_key_name=(f"hipsched-graph-push-{token}", s, i))
                 for i, (b, p) in enumerate(zip(blocks, graph._parts))]
        depth = 0
        while len(level) > split_every:
            depth += 1
            level = [add(*level[j:j + split_every], dask_key_name=(f"hipsched-graph-sum{depth}-{token}", s, j))
                     for j in range(0, len(level), split_every)]
        a = finish(a, decay, threshold, *level, dask_key_name=(f"hipsched-graph-step-{token}", s))
    return da.from_delayed(a, shape=(n,), dtype=np.float32, name=f"hipsched-{OP}-{token}")
