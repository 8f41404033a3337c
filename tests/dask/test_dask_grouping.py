"""hipsched.dask.top_k groups the corpus's chunks into a few tasks (hipsched/dask/ops.py, chunk_groups):
a persisted corpus into one task per worker thread over the chunks that worker holds (no chunk moves), a
lazy one into consecutive runs, GROUPS_PER_THREAD per thread. The number of tasks per query is then set
by the workers, not by the chunking, and the result is still the single-machine op's, bit for bit
(q with at most 12 rows; see test_dask_ops.py for the equality rules). The session's LocalCluster has
2 worker processes with 1 thread each."""
import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
distributed = need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
import dask  # noqa: E402

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from dask_support import job_fixture  # noqa: E402
from hipsched.dask.ops import GROUPS_PER_THREAD, chunk_groups  # noqa: E402
from hipsched.dask.placement import runs as _runs  # noqa: E402

D = 24


job = job_fixture("grouping")


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(17)
    T = rng.standard_normal((4400, D)).astype(np.float32)
    T[4321] = T[5]        # equal scores far apart: the lower index first
    T[2222] = T[5]
    T[3000, 1] = np.nan   # NaN after every number
    T[100] = 0.0
    return T


def _queries(T):
    q1 = T[5].copy()
    qm = np.random.default_rng(2).standard_normal((5, D)).astype(np.float32)
    qm[0] = T[5]
    return q1, qm


def _exact(q, Td, T, k):
    idx, val = dask.compute(*hd.top_k(q, Td, k))
    ref_idx, ref_val = hs.top_k(q, T, k)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val)
    return idx, val


def _hipsched_tasks(*arrays):
    """Keys of the optimized graph that hipsched.dask made (the corpus's own keys left out)."""
    dsk = dask.base.collections_to_expr(arrays, optimize_graph=True).__dask_graph__() \
        if hasattr(dask.base, "collections_to_expr") else dask.base.collections_to_dsk(arrays, optimize_graph=True)
    return [k for k in dict(dsk) if str(k[0] if isinstance(k, tuple) else k).startswith("hipsched-top_k")]


def test_runs_are_consecutive_balanced_and_never_empty():
    assert _runs(list(range(10)), [1] * 10, 4) == [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9]]
    assert _runs([0, 1, 2], [5, 5, 5], 8) == [[0], [1], [2]]         # no more runs than items
    assert _runs([0, 1, 2, 3], [100, 1, 1, 1], 2) == [[0], [1, 2, 3]]  # rows, not items, are balanced
    assert _runs([7], [3], 1) == [[7]]
    for parts in range(1, 9):
        runs = _runs(list(range(20)), list(range(1, 21)), parts)
        assert sum(runs, []) == list(range(20)) and len(runs) == min(parts, 20) and all(runs)


def test_persisted_corpus_one_task_per_worker_thread_no_chunk_moves(dask_client, job, corpus):
    Td = da.from_array(corpus, chunks=(100, D)).persist()   # 44 chunks over 2 workers
    distributed.wait(Td)
    futs = distributed.futures_of(Td)
    before = {k: set(v) for k, v in dask_client.who_has(futs).items()}
    groups = chunk_groups(Td)
    nthreads = dask_client.nthreads()
    assert len(groups) <= sum(nthreads.values()) == 2
    keys = [k[0] for k in Td.__dask_keys__()]
    assert sorted(i for _, run in groups for i in run) == list(range(44))
    for worker, run in groups:   # every group reads chunks its worker holds
        assert all(worker in before[keys[i]] for i in run)

    def clear(dask_worker):
        dask_worker.plugins[hd.PLUGIN_NAME].executor.telemetry.clear()

    def scanned(dask_worker):
        ex = dask_worker.plugins[hd.PLUGIN_NAME].executor
        return sum(e["op"] == "top_k" for e in ex.events)

    dask_client.run(clear)
    q1, qm = _queries(corpus)
    for q, k in ((q1, 10), (qm, 7), (q1, 4400)):
        _exact(q, Td, corpus, k)
    # each worker scanned exactly the chunks it holds (3 queries), and no chunk was copied anywhere
    held = {w: sum(w in v for v in before.values()) for w in nthreads}
    assert dask_client.run(scanned) == {w: 3 * c for w, c in held.items()}
    assert {k: set(v) for k, v in dask_client.who_has(futs).items()} == before
    # the graph: a task per group and the merge, whatever the chunking
    tasks = _hipsched_tasks(*hd.top_k(q1, Td, 10))
    fine = da.from_array(corpus, chunks=(10, D)).persist()   # 440 chunks
    distributed.wait(fine)
    assert len(_hipsched_tasks(*hd.top_k(q1, fine, 10))) == len(tasks) <= 2 + 5
    _exact(q1, fine, corpus, 10)


def test_lazy_corpus_consecutive_runs_bounded_by_threads(dask_client, job, corpus):
    q1, qm = _queries(corpus)
    counts = set()
    for rows in (100, 37, 10):   # 44, 119 and 440 chunks
        Td = da.from_array(corpus, chunks=(rows, D))
        groups = chunk_groups(Td)
        assert len(groups) == min(Td.numblocks[0], GROUPS_PER_THREAD * 2)
        assert [i for _, run in groups for i in run] == list(range(Td.numblocks[0]))   # consecutive, in order
        assert all(w is None for w, _ in groups)
        counts.add(len(_hipsched_tasks(*hd.top_k(q1, Td, 10))))
        _exact(q1, Td, corpus, 10)
        _exact(qm, Td, corpus, 9)
    assert len(counts) == 1 and counts.pop() <= GROUPS_PER_THREAD * 2 + 5


def test_other_corpora_exact(dask_client, job, corpus):
    q1, qm = _queries(corpus)
    # chunks with no rows, and uneven chunks
    Td = da.from_array(corpus, chunks=((0, 1000, 0, 1, 2399, 1000, 0), (D,)))
    _exact(q1, Td, corpus, 10)
    _exact(qm, Td, corpus, 3)
    # a rechunk of a persisted corpus: its chunks are Dask's own tasks, passed to the groups
    base = da.from_array(corpus, chunks=(1000, D)).persist()
    distributed.wait(base)
    _exact(q1, base.rechunk((130, D)), corpus, 10)
    # a generated corpus: each group makes its chunks itself
    G = da.random.default_rng(5).standard_normal((3000, D), chunks=(70, D), dtype=np.float32)
    _exact(q1, G, G.compute(), 25)
    # a query given as a Dask array stays a dependency
    _exact(da.from_array(qm, chunks=(2, D)), da.from_array(corpus, chunks=(500, D)), corpus, 5)
    # one chunk, and k beyond n
    _exact(qm, da.from_array(corpus[:50], chunks=(50, D)), corpus[:50], 80)
