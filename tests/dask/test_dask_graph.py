"""hipsched.dask.spread_activation over a row-partitioned graph on the session's 2-process LocalCluster,
against hipsched.spread_activation on the whole graph.

The float32 bound. One step computes S_j = sum_i A_ij a_i, then x = a + decay S, clamp, threshold.
- One machine: float32 products w_ij a_i, summed per thread in float32, then the thread sums added:
  |S - exact| <= gamma_(D + T) (|A|^T |a|)_j, D the largest in-degree, T the threads.
- Here: the same float32 products summed per partition in float64 and rounded once, then the P partial
  vectors summed in float32: |S - exact| <= gamma_(P + 2) (|A|^T |a|)_j.
So the two S differ by at most 2 gamma_m (|A|^T |a|)_j with m = D + T + P + 2, gamma_m = m u / (1 - m u),
u = 2^-24; forming x adds at most u (|a| + |decay| |A|^T |a|) on each side; the clamp does not widen a
difference. Over steps, a difference E in the input grows to at most E + |decay| |A|^T E, plus the
step's own rounding (computed with |a| + E for |a|). The threshold is a jump: a value within the bound of
it may be zeroed on one side only, so the thresholded test checks its data keeps clear of it."""
import os

import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
sp = need("scipy.sparse")

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from dask_support import job_fixture, no_task_runs  # noqa: E402

U = 2.0 ** -24
N = 3000


def gamma(m):
    return m * U / (1 - m * U)


job = job_fixture("graph")


@pytest.fixture(scope="module")
def graph():
    r = np.random.default_rng(17)
    m = 15000
    rows, cols = r.integers(0, N, m), r.integers(0, N, m)
    w = r.uniform(-0.4, 1.0, m).astype(np.float32)
    rows, cols, w = np.r_[rows, rows[:40]], np.r_[cols, cols[:40]], np.r_[w, w[:40]]   # duplicate edges add up
    A = sp.csr_matrix((w, (rows, cols)), shape=(N, N))
    A.sum_duplicates()
    # node 5 has no in-edges and seed 0: inactive at every step (an inf weight out of it would make node 9
    # NaN: test_a_non_finite_weight_of_an_inactive_node_gives_nan_as_on_one_machine)
    A = A.tolil()
    A[:, 5] = 0
    A[5, 9] = 0.75
    A = A.tocsr()
    A.eliminate_zeros()
    seeds = np.zeros(N, np.float32)
    seeds[r.choice(N, 120, replace=False)] = r.uniform(0.05, 1.0, 120).astype(np.float32)
    seeds[5] = 0
    return A, seeds


def error_bound(A, seeds, decay, steps, parts):
    """The bound above, step by step along the single-machine trajectory."""
    Aabs = abs(A).astype(np.float64)
    D = int(np.bincount(A.indices, minlength=A.shape[0]).max())
    m = D + (os.cpu_count() or 1) + parts + 2
    E = np.zeros(A.shape[0])
    for t in range(steps):
        a = np.abs(hs.spread_activation(A, seeds, decay, t).astype(np.float64)) + E
        push = Aabs.T @ a
        E = E + abs(decay) * (Aabs.T @ E) + 2 * gamma(m) * abs(decay) * push + 2 * U * (a + abs(decay) * push)
    return E


def blocks_at(A, cuts, scipy_rows=()):
    """Partitions [cuts[i], cuts[i+1]) as (row_start, indptr, indices, weights), or as (row_start, scipy
    rows) for the i in scipy_rows."""
    out = []
    for i, (r0, r1) in enumerate(zip(cuts[:-1], cuts[1:])):
        rows = A[r0:r1]
        out.append((r0, rows) if i in scipy_rows else (r0, rows.indptr, rows.indices, rows.data))
    return out


LAYOUTS = {
    "one-partition": [0, N],
    "uneven": [0, 700, 701, 1900, 1900, 3000],        # a one-row and an empty partition
    "more-than-split_every": list(range(0, N, 128)) + [N],   # 24 partitions: a two-level sum tree
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("steps", [1, 4])
def test_matches_the_single_machine_op_within_the_bound(dask_client, job, graph, layout, steps):
    A, seeds = graph
    cuts = LAYOUTS[layout]
    g = hd.PartitionedGraph(blocks_at(A, cuts, scipy_rows=(1, 3))[::-1])   # any order: sorted by row_start
    assert g.n == N and g.nnz == A.nnz and len(g.partitions) == len(cuts) - 1
    out = hd.spread_activation(g, seeds, decay=0.7, steps=steps)
    assert out.shape == (N,) and out.dtype == np.float32
    got = out.compute()
    ref = hs.spread_activation(A, seeds, decay=0.7, steps=steps)
    assert got.dtype == np.float32 and np.all(np.isfinite(ref))
    bound = error_bound(A, seeds, 0.7, steps, len(cuts) - 1)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= bound)
    # not a vacuous comparison: activation spread, and many values sit strictly inside (0, 1)
    assert (ref > 0).sum() > 2 * (seeds > 0).sum() and ((ref > 0) & (ref < 1)).sum() > 100


def test_scattered_partitions_give_the_same_bits(dask_client, job, graph):
    A, seeds = graph
    g = hd.partition_graph(A, 400)
    here = hd.spread_activation(g, seeds, 0.6, 3).compute()
    gs = g.scatter(dask_client)
    # the blocks live on both workers, none on the client's graph any more
    holders = dask_client.who_has([p.data for p in gs._parts])
    assert len({w for ws in holders.values() for w in ws}) == 2
    for _ in range(2):   # reused across calls; the sum tree's fixed order makes placement irrelevant
        np.testing.assert_array_equal(hd.spread_activation(gs, seeds, 0.6, 3).compute(), here)


def test_threshold_dict_seeds_and_zero_steps(dask_client, job, graph):
    A, seeds = graph
    g = hd.partition_graph(A, 1000)
    dseeds = {int(i): float(seeds[i]) for i in np.flatnonzero(seeds)}
    bound = error_bound(A, seeds, 0.8, 1, 3)
    # the threshold: the middle of the widest gap between unthresholded values in (0.2, 0.5), so every
    # value keeps clear of it by more than the bound and no value may flip
    Af = A.astype(np.float64)
    x = np.clip(seeds + 0.8 * (Af.T @ seeds.astype(np.float64)), 0, 1)
    inner = np.sort(x[(x > 0.2) & (x < 0.5)])
    gap = int(np.argmax(np.diff(inner)))
    th = float(inner[gap] + inner[gap + 1]) / 2
    assert np.all(np.abs(x - th) > 2 * bound)
    got = hd.spread_activation(g, dseeds, 0.8, 1, threshold=th).compute()
    ref = hs.spread_activation(A, dseeds, 0.8, 1, threshold=th)
    assert ((ref > 0) & (ref < 1)).sum() > 20 and (x[(x > 0) & (x < th)]).size > 20   # both sides of it
    assert np.all(np.abs(got.astype(np.float64) - ref) <= bound)
    assert np.all((got == 0) == (ref == 0))
    np.testing.assert_array_equal(hd.spread_activation(g, dseeds, 0.8, 0).compute(), hs.spread_activation(A, dseeds, 0.8, 0))


def test_bad_graphs_and_arguments_fail_on_the_client(dask_client, job, graph):
    A, seeds = graph
    good = blocks_at(A, [0, 1000, 2000, N])
    with no_task_runs(dask_client):
        with pytest.raises(ValueError, match=r"do not tile the node range: rows \[1000, 1200\) are in no partition "
                                             r"\(partition 1 starts at 1200\)"):
            hd.spread_activation([good[0], blocks_at(A, [1200, 2000])[0], good[2]], seeds)
        with pytest.raises(ValueError, match=r"do not tile the node range: partition 1 \(rows \[900, 2000\)\) overlaps "
                                             r"rows before 1000"):
            hd.PartitionedGraph([good[0], blocks_at(A, [900, 2000])[0], good[2]])
        with pytest.raises(ValueError, match=r"rows \[0, 1000\) are in no partition"):
            hd.PartitionedGraph(good[1:])
        with pytest.raises(ValueError, match=r"they cover \[0, 3000\), the graph has n = 3500 nodes"):
            hd.PartitionedGraph(good, n=3500)
        with pytest.raises(ValueError, match=r"spread_activation: shapes do not match: seeds \(2999,\) vs graph"):
            hd.spread_activation(good, seeds[:-1])
        r0, ip, ix, w = good[1]
        ix = ix.copy()
        ix[3] = N
        with pytest.raises(ValueError, match=rf"partition 1: indices\[3\] = {N} is out of range for a graph of {N} nodes"):
            hd.PartitionedGraph([good[0], (r0, ip, ix, w), good[2]])
        ip2 = ip.copy()
        ip2[5] = ip2[4] - 1
        with pytest.raises(ValueError, match=r"partition 1: indptr is not a valid CSR row pointer at position 5"):
            hd.PartitionedGraph([good[0], (r0, ip2, good[1][2], w), good[2]])
        with pytest.raises(ValueError, match=r"partition 1: indptr is not a valid CSR row pointer at position 1000 .*"
                                             r"end at nnz"):
            hd.PartitionedGraph([good[0], (r0, ip, good[1][2][:-1], w[:-1]), good[2]])
        with pytest.raises(ValueError, match=r"partition 1 indices \(\d+,\) vs weights \(\d+,\) \(one weight per edge\)"):
            hd.PartitionedGraph([good[0], (r0, ip, good[1][2], w[:-1]), good[2]])
        with pytest.raises(ValueError, match=r"partition 0: its SciPy rows have 2999 columns, the graph has 3000 nodes"):
            hd.PartitionedGraph([(0, A[:1000, :2999]), good[1], good[2]])
        with pytest.raises(ValueError, match="row_start must be an integer >= 0"):
            hd.PartitionedGraph([(-1, *good[0][1:])])
        with pytest.raises(TypeError, match=r"must be a PartitionedGraph .*partition_graph"):
            hd.spread_activation(A, seeds)
        with pytest.raises(TypeError, match="non-empty list of row blocks"):
            hd.PartitionedGraph([])
        g = hd.PartitionedGraph(good)
        with pytest.raises(ValueError, match="steps must be >= 0"):
            hd.spread_activation(g, seeds, steps=-1)
        with pytest.raises(ValueError, match="steps must be <= 10000 on a partitioned graph"):
            hd.spread_activation(g, seeds, steps=10001)
        with pytest.raises(ValueError, match="decay must be finite"):
            hd.spread_activation(g, seeds, decay=float("nan"))
        with pytest.raises(ValueError, match=r"seed node 3000 is out of range"):
            hd.spread_activation(g, {3000: 1.0})
        with pytest.raises(ValueError, match="rows_per_part must be an integer >= 1"):
            hd.partition_graph(A, 0)


def test_a_non_finite_weight_of_an_inactive_node_gives_nan_as_on_one_machine(dask_client, job, graph):
    """0 * inf is NaN in SciPy's A.T @ a: node 5, inactive, makes node 9 NaN through its inf edge, on the
    cluster as on one machine (and the rest stays as it was)."""
    A, seeds = graph
    A = A.tolil()
    A[5, 9] = np.inf
    A = A.tocsr()
    got = hd.spread_activation(hd.partition_graph(A, 1000), seeds, 0.5, 2).compute()
    ref = hs.spread_activation(A, seeds, 0.5, 2)
    assert np.isnan(ref[9])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
