"""hipsched.dask.top_k over a persisted corpus reuses the corpus's placement (which worker holds which
chunk: hipsched/dask/placement.py) between queries instead of asking the scheduler (who_has,
nthreads) on every call, and writes the graph directly from it. These tests check that the cache is
used, that it is dropped when the chunks move or a worker leaves (a group task that Dask ran on
another worker reports it on PLACEMENT_TOPIC; a placement older than PLACEMENT_TTL_S is read again),
and that the results stay the single-machine op's, bit for bit, before and after."""
import time

import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
distributed = need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
import dask  # noqa: E402

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from dask_support import job_fixture, move_chunks, tie_nan_corpus  # noqa: E402
from hipsched.dask import ops, placement  # noqa: E402

D = 16
WAIT_S = 60.0

job = job_fixture("placement")


@pytest.fixture(scope="module")
def corpus():
    return tie_nan_corpus(23, 3000, D)


def _exact(q, Td, T, k):
    idx, val = dask.compute(*hd.top_k(q, Td, k))
    ref_idx, ref_val = hs.top_k(q, T, k)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val)


def _until(cond, what):
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {WAIT_S:.0f} s waiting for {what}")


def _holders(client, Td):
    futs = distributed.futures_of(Td)
    return {k: set(v) for k, v in client.who_has(futs).items()}


def test_placement_is_cached_between_queries(dask_client, job, corpus, monkeypatch):
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    Td = da.from_array(corpus, chunks=(100, D)).persist()   # 30 chunks over 2 workers
    distributed.wait(Td)
    q = corpus[7].copy()
    qm = np.random.default_rng(1).standard_normal((4, D)).astype(np.float32)
    _exact(q, Td, corpus, 10)
    refreshes = placement.placement_stats["refreshes"]
    # later queries over the same corpus never ask the scheduler where its chunks are
    calls = []
    for name in ("who_has", "nthreads"):
        real = getattr(dask_client, name)
        monkeypatch.setattr(dask_client, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    for qq, k in ((q, 10), (qm, 7), (q, 3000), (da.from_array(qm, chunks=(2, D)), 5)):
        _exact(qq, Td, corpus, k)
    assert calls == [] and placement.placement_stats["refreshes"] == refreshes
    # the cached groups are the who_has ones: each worker reads only chunks it holds
    before = _holders(dask_client, Td)
    keys = [k[0] for k in Td.__dask_keys__()]
    groups = ops.chunk_groups(Td)
    assert sorted(i for _, run in groups for i in run) == list(range(30))
    assert all(w in before[keys[i]] for w, run in groups for i in run)
    assert _holders(dask_client, Td) == before   # no chunk was copied by the queries
    # a placement older than the TTL is read again
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 0.0)
    _exact(q, Td, corpus, 10)
    assert placement.placement_stats["refreshes"] == refreshes + 1
    assert placement.forget_placements(Td) == 1 and placement.forget_placements(Td) == 0


def test_moved_chunks_invalidate_the_placement_and_results_stay_exact(dask_client, job, corpus, monkeypatch):
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    a, b = sorted(dask_client.nthreads())
    Td = dask_client.persist(da.from_array(corpus[:2000], chunks=(250, D)), workers=[a])   # 8 chunks, all on a
    distributed.wait(Td)
    T = corpus[:2000]
    q = corpus[7].copy()
    _exact(q, Td, T, 10)
    assert {w for w, _ in ops.chunk_groups(Td)} == {a}
    refreshes, invalidations = placement.placement_stats["refreshes"], placement.placement_stats["invalidations"]
    # every chunk moves from a to b (copied there, then deleted on a): the cached plan is stale
    keys = [k[0] for k in Td.__dask_keys__()]
    move_chunks(dask_client, keys, a, b)
    assert all(v == {b} for v in _holders(dask_client, Td).values())
    # the stale plan still gives the exact answer: Dask runs the group where its chunks are, and that
    # task reports that it ran away from its planned worker
    _exact(q, Td, T, 10)
    _until(lambda: placement.placement_stats["invalidations"] > invalidations, "the placement event to reach the client")
    # the next query reads the placement again and plans every group on b; no chunk moves back
    _exact(q, Td, T, 10)
    assert placement.placement_stats["refreshes"] == refreshes + 1
    assert {w for w, _ in ops.chunk_groups(Td)} == {b}
    assert all(v == {b} for v in _holders(dask_client, Td).values())


def test_a_corpus_released_and_persisted_again_is_read_again(dask_client, job, corpus, monkeypatch):
    """da.from_array names chunks by content: the same array persisted again after its release has the
    same keys, but its chunks are placed anew. The placement read for the first persist must not plan
    the second (it would send each worker to chunks it does not hold); two live handles on the same keys
    share one placement."""
    import gc
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    a, b = sorted(dask_client.nthreads())
    T = corpus[:1600]
    q = corpus[9].copy()
    Td = dask_client.persist(da.from_array(T, chunks=(200, D)), workers=[a])
    distributed.wait(Td)
    _exact(q, Td, T, 6)
    assert {w for w, _ in ops.chunk_groups(Td)} == {a}
    keys = [k[0] for k in Td.__dask_keys__()]
    del Td
    gc.collect()
    def held(keys=keys):   # the scheduler's own view (who_has of bare keys would ask about none)
        return dask_client.run_on_scheduler(lambda dask_scheduler: sum(k in dask_scheduler.tasks for k in keys))
    _until(lambda: held() == 0, "the scheduler to forget the released chunks")
    Td = dask_client.persist(da.from_array(T, chunks=(200, D)), workers=[b])
    distributed.wait(Td)
    assert [k[0] for k in Td.__dask_keys__()] == keys
    refreshes = placement.placement_stats["refreshes"]
    assert {w for w, _ in ops.chunk_groups(Td)} == {b}
    assert placement.placement_stats["refreshes"] == refreshes + 1
    _exact(q, Td, T, 6)
    # a second handle on the same held keys: no re-read, whichever handle queries
    Td2 = dask_client.persist(da.from_array(T, chunks=(200, D)))
    distributed.wait(Td2)
    for handle in (Td2, Td, Td2):
        _exact(q, handle, T, 6)
    assert placement.placement_stats["refreshes"] == refreshes + 1


def test_a_worker_leaving_invalidates_the_placement(tmp_path, monkeypatch):
    """Its own cluster: one worker is retired (its chunks move to the other) between queries."""
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)   # the session cluster stays the default
    try:
        hd.setup(client, persist_model=False, job="placement-leave")
        rng = np.random.default_rng(5)
        T = rng.standard_normal((2400, D)).astype(np.float32)
        q = rng.standard_normal((3, D)).astype(np.float32)
        Td = client.persist(da.from_array(T, chunks=(200, D)))
        client.gather(distributed.futures_of(Td))   # persisted: every chunk in a worker's memory
        idx, val = client.gather(client.compute(list(hd.top_k(q, Td, 9))))
        ref = hs.top_k(q, T, 9)
        np.testing.assert_array_equal(idx, ref[0])
        np.testing.assert_array_equal(val, ref[1])
        workers = {w for w, _ in ops.chunk_groups(Td)}
        holders = {w for v in _holders(client, Td).values() for w in v}
        assert workers == holders and len(workers) == 2   # the cached plan uses both workers
        invalidations = placement.placement_stats["invalidations"]
        gone = sorted(workers)[0]
        client.retire_workers([gone], close_workers=True)
        _until(lambda: gone not in client.nthreads(), "the worker to leave")
        left = set(client.nthreads())
        assert all(v <= left for v in _holders(client, Td).values())
        idx, val = client.gather(client.compute(list(hd.top_k(q, Td, 9))))   # the stale plan: still exact
        np.testing.assert_array_equal(idx, ref[0])
        np.testing.assert_array_equal(val, ref[1])
        _until(lambda: placement.placement_stats["invalidations"] > invalidations, "the placement event to reach the client")
        assert {w for w, _ in ops.chunk_groups(Td)} <= left
        idx, val = client.gather(client.compute(list(hd.top_k(q, Td, 9))))
        np.testing.assert_array_equal(idx, ref[0])
        np.testing.assert_array_equal(val, ref[1])
    finally:
        client.close()
        cluster.close()


def test_chunks_missing_from_the_planned_worker_are_scanned_where_they_are(dask_client, job, corpus, monkeypatch):
    """A group reads its chunks from its worker's memory; the ones that moved away since the placement
    was read are scanned where they now are (a task each, only k candidates come back), not copied."""
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    a, b = sorted(dask_client.nthreads())
    T = corpus[:2000]
    Td = dask_client.persist(da.from_array(T, chunks=(250, D)), workers=[a])   # 8 chunks, all on a
    distributed.wait(Td)
    qm = np.random.default_rng(3).standard_normal((3, D)).astype(np.float32)
    qm[0] = T[1700]   # its best row is in a chunk that moves
    _exact(qm, Td, T, 6)
    assert ops.chunk_groups(Td) == [(a, list(range(8)))]
    invalidations = placement.placement_stats["invalidations"]
    keys = [k[0] for k in Td.__dask_keys__()]
    moved = keys[3:]   # the group's anchor (its first chunk, a's alone) stays: Dask still runs it on a
    move_chunks(dask_client, moved, a, b)
    after_move = _holders(dask_client, Td)
    _exact(qm, Td, T, 6)
    _exact(qm[0], Td, T, 2000)
    assert _holders(dask_client, Td) == after_move   # nothing was copied back to a
    _until(lambda: placement.placement_stats["invalidations"] > invalidations, "the placement event to reach the client")
    _exact(qm, Td, T, 6)
    assert sorted(ops.chunk_groups(Td)) == [(a, [0, 1, 2]), (b, [3, 4, 5, 6, 7])]


def test_the_corpus_outlives_a_del_before_the_compute(dask_client, job, corpus):
    """The graph keeps the corpus's futures alive on the client as dependencies would (the group tasks
    depend on one chunk each and read the others by key)."""
    import gc
    T = corpus[:1200]
    Td = da.from_array(T, chunks=(100, D)).persist()
    distributed.wait(Td)
    keys = [k[0] for k in Td.__dask_keys__()]
    q = corpus[7].copy()
    arrays = hd.top_k(q, Td, 10)
    del Td
    gc.collect()
    time.sleep(0.5)   # had the futures gone, the scheduler would be releasing the chunks by now

    def held(dask_scheduler, keys=keys):
        return sum(1 for k in keys if k in dask_scheduler.tasks and dask_scheduler.tasks[k].state == "memory")
    assert dask_client.run_on_scheduler(held) == len(keys)
    idx, val = dask.compute(*arrays)
    ref_idx, ref_val = hs.top_k(q, T, 10)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val)


def test_a_group_depends_on_a_chunk_only_its_worker_holds(dask_client, job, corpus, monkeypatch, request):
    """Dask runs a group task where its one dependency is; a replicated chunk has two holders, so the
    dependency (the anchor) is a chunk held by the planned worker alone, and no query runs elsewhere."""
    monkeypatch.setattr(placement, "PLACEMENT_TTL_S", 3600.0)
    T = corpus[:2400]
    Td = da.from_array(T, chunks=(100, D)).persist()   # 24 chunks over 2 workers
    distributed.wait(Td)
    q = corpus[7].copy()
    _exact(q, Td, T, 10)
    keys = [k[0] for k in Td.__dask_keys__()]
    futs = {f.key: f for f in distributed.futures_of(Td)}
    # every group's first chunk (and a few more) now lives on both workers. Client.replicate is
    # incompatible with the active memory manager's ReduceReplicas (distributed's docs): it would drop
    # the extra replicas within seconds, one of them perhaps the planned worker's, and the query would
    # rightly report running away. So the AMM is stopped for this test.
    if dask_client.amm.running():
        dask_client.amm.stop()
        request.addfinalizer(dask_client.amm.start)
    firsts = {run[0] for _, run in ops.chunk_groups(Td)} | {0, 1, 2, 12, 13}
    dask_client.replicate([futs[keys[i]] for i in sorted(firsts)], n=2)
    holders = _holders(dask_client, Td)
    assert all(len(holders[keys[i]]) == 2 for i in firsts)
    placement.forget_placements(Td)
    _exact(q, Td, T, 10)
    (p,) = [v for key, v in placement._placements.items() if key[1] == Td.name]
    for (worker, run), a in zip(p.groups, p.anchors):
        if any(holders[keys[i]] == {worker} for i in run):
            assert holders[keys[run[a]]] == {worker}
    invalidations = placement.placement_stats["invalidations"]
    for k in (3, 10, 2400):
        _exact(q, Td, T, k)
    time.sleep(0.5)   # a report, had there been one, would have reached the client by now
    assert placement.placement_stats["invalidations"] == invalidations
