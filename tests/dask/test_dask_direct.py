"""hipsched.dask.search: top_k computed now, over a persisted corpus by one request per worker (an RPC
handler on the worker scans the chunks it holds), and through top_k's task graph whenever that cannot give
the answer (a lazy corpus, a Dask query, chunks moved, a worker gone). Every result must equal
hipsched.top_k on the whole corpus bit for bit (at most 12 queries: the kernel scores each row on its
own), whichever path gave it; the tests also check which path that was."""
import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
distributed = need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")

import dask  # noqa: E402

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from dask_support import (computed, job_fixture, move_chunks, no_task_runs, same_bits, tie_nan_corpus,  # noqa: E402
                          unaligned_copy)
from half_formats import TYPE_IDS, TYPES  # noqa: E402
from hipsched.dask import direct, placement  # noqa: E402

D = 16

job = job_fixture("direct")


@pytest.fixture(scope="module")
def corpus():
    return tie_nan_corpus(31, 3000, D)


def _same(got, ref):
    assert isinstance(got[0], np.ndarray) and isinstance(got[1], np.ndarray)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert got[0].dtype == np.int64 and got[1].dtype == np.float32


def _paths(fn):
    """(direct, graph) queries that fn() made."""
    before = dict(direct.search_stats)
    fn()
    return (direct.search_stats["direct"] - before["direct"], direct.search_stats["graph"] - before["graph"])


def test_direct_queries_equal_the_single_machine_op(dask_client, job, corpus, monkeypatch):
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    Td = da.from_array(corpus, chunks=(100, D)).persist()   # 30 chunks over both workers
    distributed.wait(Td)
    q = corpus[7].copy()
    qm = np.random.default_rng(2).standard_normal((12, D)).astype(np.float32)
    qm[3] = corpus[1500]
    cases = [(q, 10), (q, 1), (q, 3000), (q, 5000), (qm, 7), (qm[:1], 3), (corpus[2900].astype(np.float64), 4)]
    for qq, k in cases[:1]:
        _same(hd.search(qq, Td, k), hs.top_k(qq, corpus, k))
    installs = direct.search_stats["installs"]
    for qq, k in cases:
        assert _paths(lambda: _same(hd.search(qq, Td, k), hs.top_k(qq, corpus, k))) == (1, 0), (qq.shape, k)
    # the last direct query's timing: each worker's handler ran within the client's round trip, and its
    # groups' scans within the handler
    t = direct.last_timing
    assert set(t["workers"]) == {w for w, _ in hd.ops.chunk_groups(Td)}
    for w, wt in t["workers"].items():
        assert 0 < max(wt["scan_s"]) <= wt["handler_s"] <= t["wall_s"], (w, t)
    # the handler is installed once per worker, on the first query
    assert direct.search_stats["installs"] == installs
    assert {key[1] for key in direct._installed if key[0] == dask_client.id} >= {w for w, _ in hd.ops.chunk_groups(Td)}
    # no task ran for these queries, and none is left on the scheduler for them
    from dask.utils import key_split
    names = {key_split(key) for key in dask_client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))}
    assert not any(name.startswith("hipsched") for name in names), names
    # the same answer as the task graph, which it stands for
    _same(hd.search(qm, Td, 7), tuple(dask_client.compute(list(hd.top_k(qm, Td, 7)), sync=True)))


@pytest.mark.parametrize("dtype", list(TYPES), ids=TYPE_IDS)
def test_a_corpus_of_each_float_type_gives_the_single_machine_bits(dask_client, job, dtype):
    """top_k (the task graph and the direct search) and cosine_similarity over a float32, float16 or
    bfloat16 corpus: the single-machine op's results bit for bit, the scores float32 whatever the type."""
    rng = np.random.default_rng(41)
    T = rng.standard_normal((3000, 24)).astype(TYPES[dtype])
    T[2900] = T[7]
    Td = da.from_array(T, chunks=(250, 24)).persist()
    distributed.wait(Td)
    for q in (rng.standard_normal(24).astype(np.float32), rng.standard_normal((12, 24)).astype(np.float32), T[7].copy()):
        ref = hs.top_k(q, T, 10)
        served = direct.search_stats["direct"]
        for got in (dask.compute(*hd.top_k(q, Td, 10)), hd.search(q, Td, 10)):
            same_bits(got[0], ref[0])
            same_bits(got[1], ref[1])
        assert direct.search_stats["direct"] == served + 1   # search answered directly, not through the graph
        same_bits(computed(hd.cosine_similarity(q, Td)), hs.cosine_similarity(q, T))


def test_held_chunks_are_realigned_once(dask_client, job, corpus):
    """A chunk that reached its worker inside a pickled message (da.from_array's chunks often do) starts
    wherever it fell there; a scan realigns each such chunk in the worker's memory once instead of
    copying it on every query. The chunks here are made unaligned on purpose, on the workers."""
    Td = da.from_array(corpus, chunks=(100, D)).map_blocks(unaligned_copy, dtype=np.float32).persist()
    distributed.wait(Td)
    keys = [k[0] for k in Td.__dask_keys__()]

    def unaligned(keys, dask_worker=None):
        return sum(1 for k in keys if k in dask_worker.data and not dask_worker.data[k].flags.aligned)
    assert sum(dask_client.run(unaligned, keys).values()) == len(keys)
    q = corpus[11].copy()
    assert _paths(lambda: _same(hd.search(q, Td, 5), hs.top_k(q, corpus, 5))) == (1, 0)
    # the swap runs on each worker's event loop, just after the scan
    import time
    deadline = time.monotonic() + 30
    while sum(dask_client.run(unaligned, keys).values()):
        assert time.monotonic() < deadline, "the held chunks were not realigned"
        time.sleep(0.02)
    assert _paths(lambda: _same(hd.search(q, Td, 5), hs.top_k(q, corpus, 5))) == (1, 0)
    _same(tuple(dask_client.compute(list(hd.top_k(q, Td, 5)), sync=True)), hs.top_k(q, corpus, 5))


def test_lazy_corpus_and_dask_query_take_the_task_graph(dask_client, job, corpus):
    lazy = da.from_array(corpus, chunks=(500, D))
    q = corpus[3].copy()
    assert _paths(lambda: _same(hd.search(q, lazy, 6), hs.top_k(q, corpus, 6))) == (0, 1)
    Td = da.from_array(corpus, chunks=(500, D)).persist()
    distributed.wait(Td)
    qm = np.random.default_rng(4).standard_normal((3, D)).astype(np.float32)
    qd = da.from_array(qm, chunks=(2, D))
    assert _paths(lambda: _same(hd.search(qd, Td, 6), hs.top_k(qm, corpus, 6))) == (0, 1)
    # empty inputs: the graph path's shapes
    _same(hd.search(qm[:0], Td, 6), hs.top_k(qm[:0], corpus, 6))


def test_spilled_chunks_are_read_back_from_disk(dask_client, job, corpus):
    """A chunk its worker spilled to disk is not in the spill buffer's memory part, which the scans read
    first: it must be read back through the buffer (unspilled), by search's handler and by top_k's group
    tasks alike, with the same answer."""
    Td = da.from_array(corpus, chunks=(150, D)).persist()   # 20 chunks
    distributed.wait(Td)
    keys = [k[0] for k in Td.__dask_keys__()]

    def spill(keys, dask_worker=None):
        from distributed.spill import SpillBuffer
        data = dask_worker.data
        if not isinstance(data, SpillBuffer):
            return None
        while any(k in data.fast for k in keys):
            if data.evict() < 0:
                return None
        return sum(1 for k in keys if k in data.slow)
    spilled = dask_client.run(spill, keys)
    if None in spilled.values():
        pytest.skip("the workers' memory is not a SpillBuffer that can spill here")
    assert sum(spilled.values()) == len(keys)
    q = corpus[13].copy()
    ref = hs.top_k(q, corpus, 9)
    assert _paths(lambda: _same(hd.search(q, Td, 9), ref)) == (1, 0)
    _same(tuple(dask_client.compute(list(hd.top_k(q, Td, 9)), sync=True)), ref)


def test_moved_chunks_are_found_again_and_stay_exact(dask_client, job, corpus, monkeypatch):
    """Chunks moved behind the cache's back: the query finds a planned chunk missing, reads the placement
    again and asks once more, directly; if the chunks are still not where the placement says, it runs
    as the graph."""
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    a, b = sorted(dask_client.nthreads())
    T = corpus[:2000]
    Td = dask_client.persist(da.from_array(T, chunks=(250, D)), workers=[a])   # 8 chunks, all on a
    distributed.wait(Td)
    qm = np.random.default_rng(3).standard_normal((3, D)).astype(np.float32)
    qm[0] = T[1700]
    ref = hs.top_k(qm, T, 6)
    assert _paths(lambda: _same(hd.search(qm, Td, 6), ref)) == (1, 0)
    stale = placement.placement(Td, list(range(8)))
    moved = [k[0] for k in Td.__dask_keys__()][3:]
    move_chunks(dask_client, moved, a, b)
    # worker a misses chunks: the placement is read again, and the same query is answered directly
    rereads, refreshes = direct.search_stats["rereads"], placement.placement_stats["refreshes"]
    assert _paths(lambda: _same(hd.search(qm, Td, 6), ref)) == (1, 0)
    assert direct.search_stats["rereads"] == rereads + 1
    assert placement.placement_stats["refreshes"] == refreshes + 1
    assert sorted(hd.ops.chunk_groups(Td)) == [(a, [0, 1, 2]), (b, [3, 4, 5, 6, 7])]
    assert _paths(lambda: _same(hd.search(qm, Td, 6), ref)) == (1, 0)
    assert direct.search_stats["rereads"] == rereads + 1
    # a placement that is stale again when read again (chunks still moving): the graph answers
    monkeypatch.setattr(direct, "placement", lambda T, live: stale)
    assert _paths(lambda: _same(hd.search(qm, Td, 6), ref)) == (0, 1)
    assert direct.search_stats["rereads"] == rereads + 2


def test_a_worker_that_does_not_answer_in_time_falls_back(dask_client, job, corpus, monkeypatch, caplog):
    """With a timeout, a worker that takes the request and never answers (here: its handler replaced by
    one that sleeps) does not hold the query: it runs as the graph, and the reason is logged."""
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    Td = da.from_array(corpus, chunks=(300, D)).persist()
    distributed.wait(Td)
    q = corpus[22].copy()
    ref = hs.top_k(q, corpus, 8)
    assert _paths(lambda: _same(hd.search(q, Td, 8, timeout=60), ref)) == (1, 0)
    stuck = sorted({w for w, _ in hd.ops.chunk_groups(Td)})[0]

    def hang(dask_worker=None, name=direct.HANDLER):
        import asyncio

        async def hipsched_top_k(**msg):
            await asyncio.sleep(30)
        dask_worker.handlers[name] = hipsched_top_k
    dask_client.run(hang, workers=[stuck])
    with caplog.at_level("WARNING", logger="hipsched.dask"):
        assert _paths(lambda: _same(hd.search(q, Td, 8, timeout=0.5), ref)) == (0, 1)
    assert any("did not answer" in r.getMessage() for r in caplog.records)
    # the installs were forgotten: the next query puts the real handler back
    assert _paths(lambda: _same(hd.search(q, Td, 8), ref)) == (1, 0)


def test_a_worker_without_the_handler_falls_back_then_gets_it_again(dask_client, job, corpus, monkeypatch):
    """A request that fails (here: a worker that lost the handler, as a restarted worker at the same
    address would) makes that query run as the graph; the next query installs the handler again."""
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    Td = da.from_array(corpus, chunks=(300, D)).persist()
    distributed.wait(Td)
    q = corpus[21].copy()
    ref = hs.top_k(q, corpus, 8)
    assert _paths(lambda: _same(hd.search(q, Td, 8), ref)) == (1, 0)
    victim = sorted(dask_client.nthreads())[0]

    def drop(dask_worker=None):
        return dask_worker.handlers.pop(direct.HANDLER, None) is not None
    assert dask_client.run(drop, workers=[victim]) == {victim: True}
    installs = direct.search_stats["installs"]
    assert _paths(lambda: _same(hd.search(q, Td, 8), ref)) == (0, 1)
    assert _paths(lambda: _same(hd.search(q, Td, 8), ref)) == (1, 0)
    assert direct.search_stats["installs"] == installs + 2   # every worker of the client, forgotten at once


def test_a_worker_leaving_drops_the_plan_and_the_survivor_serves(monkeypatch):
    """Its own cluster, through a client that is not the default one: one worker is retired (its chunks
    move to the other) between queries; the scheduler's remove-worker event drops the cached placement,
    so the next query is planned on the survivor alone and served directly."""
    import time
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    try:
        hd.setup(client, persist_model=False, job="direct-leave")
        rng = np.random.default_rng(8)
        T = rng.standard_normal((2400, D)).astype(np.float32)
        q = rng.standard_normal((2, D)).astype(np.float32)
        Td = client.persist(da.from_array(T, chunks=(200, D)))
        client.gather(distributed.futures_of(Td))
        ref = hs.top_k(q, T, 9)
        assert _paths(lambda: _same(hd.search(q, Td, 9), ref)) == (1, 0)
        invalidations = placement.placement_stats["invalidations"]
        gone = sorted(client.nthreads())[0]
        client.retire_workers([gone], close_workers=True)
        deadline = time.monotonic() + 60
        while gone in client.nthreads() or placement.placement_stats["invalidations"] == invalidations:
            assert time.monotonic() < deadline, "the worker did not leave, or its leaving did not reach the client"
            time.sleep(0.05)
        assert _paths(lambda: _same(hd.search(q, Td, 9), ref)) == (1, 0)
        assert {w for w, _ in hd.ops.chunk_groups(Td)} == set(client.nthreads())
    finally:
        client.close()
        cluster.close()


def test_bad_input_fails_on_the_client(dask_client, job, corpus):
    Td = da.from_array(corpus, chunks=(500, D))
    with no_task_runs(dask_client):
        with pytest.raises(ValueError, match="k"):
            hd.search(corpus[0], Td, 0)
        with pytest.raises(ValueError, match="d"):
            hd.search(np.ones(D + 1, np.float32), Td, 3)
        with pytest.raises(TypeError, match="dask array"):
            hd.search(corpus[0], corpus, 3)
        with pytest.raises(ValueError, match="chunked along d"):
            hd.search(corpus[0], Td.rechunk((500, 8)), 3)
        for bad in (1, 2.5, True):
            with pytest.raises(ValueError, match="split_every"):
                hd.search(corpus[0], Td, 3, split_every=bad)
        for bad in (0, -1.0):
            with pytest.raises(ValueError, match="timeout"):
                hd.search(corpus[0], Td, 3, timeout=bad)
