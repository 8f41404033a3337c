"""Faults on a Dask cluster: a worker killed with SIGKILL in the middle of a distributed top_k (through the
task graph, lazy and persisted corpora) and of a direct query (hd.search).

The test has a LocalCluster of its own (worker processes under nannies, so the killed one restarts), so
the session's shared cluster never sees a dead worker. The kill point is made deterministic with a gate,
not with timing: after its first top_k chunk each worker's executor waits for a file that the test
creates only after the kill, so when the victim dies the job cannot have finished and the victim is
holding a task that Dask must run again elsewhere. Every wait is bounded (GATE_TIMEOUT_S, DEADLINE_S)."""
import contextlib
import json
import os
import signal
import sys
import time

import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
distributed = need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from hipsched.telemetry import schema_path  # noqa: E402

# the executor factory is pickled to the workers by value (it need not be importable there)
import cloudpickle  # noqa: E402
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N_CHUNKS, ROWS, D, K = 48, 200, 32, 10
GATE_TIMEOUT_S = 90.0    # a held top_k call goes ahead after this even if the test never opens the gate
DEADLINE_S = 120.0       # each wait in the test (a loaded 2-core machine can take a while to spawn a worker)


class GatedFactory:
    """executor_factory: each worker's executor runs its first `free` top_k calls, then holds every
    further one until the file `gate` exists (at most GATE_TIMEOUT_S). So each worker logs a chunk and
    then sits in a top_k task until the test has killed its victim: the kill lands mid-job, with a task
    in flight on the victim, however the scheduler placed the chunks and however loaded the machine is."""

    def __init__(self, gate, free=1):
        self.gate, self.free = gate, free

    def __call__(self, config):
        import threading
        from hipsched import Executor
        gate, free = self.gate, self.free

        class GatedExecutor(Executor):
            _calls, _lock = 0, threading.Lock()

            def top_k(self, *args, **kwargs):
                with self._lock:
                    n, GatedExecutor._calls = GatedExecutor._calls, GatedExecutor._calls + 1
                if n >= free:
                    end = time.monotonic() + GATE_TIMEOUT_S
                    while not os.path.exists(gate) and time.monotonic() < end:
                        time.sleep(0.01)
                return super().top_k(*args, **kwargs)

        return GatedExecutor(config)


def _wait(cond, what):
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out after {DEADLINE_S:.0f} s waiting for {what}")


def _complete_lines(path):
    """The log's complete lines (a line cut by the kill, with no newline after it, is not one)."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as fh:
        data = fh.read()
    return data.split(b"\n")[:-1]


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dask-fault-gate") / "open")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, gate):
    # processes=True: each worker runs under a Nanny, which restarts it after it dies
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)   # the session cluster stays the default
    logs = tmp_path_factory.mktemp("dask-fault-logs")
    job = hd.setup(client, persist_model=False, telemetry_dir=str(logs), job="fault",
                   executor_factory=GatedFactory(gate))
    yield client, os.path.join(str(logs), job)
    client.close()
    cluster.close()


@contextlib.contextmanager
def _gated_cluster(tmp_path, job):
    """A 2-worker LocalCluster of the test's own with the gated executors: (client, gate, job folder)."""
    gate = str(tmp_path / "open")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    try:
        logs = tmp_path / "logs"
        job = hd.setup(client, persist_model=False, telemetry_dir=str(logs), job=job, executor_factory=GatedFactory(gate))
        yield client, gate, os.path.join(str(logs), job)
    finally:
        client.close()
        cluster.close()


def _records(path):
    return [json.loads(x) for x in _complete_lines(path)]


def _workers(client):
    """{worker name: (address, pid)}."""
    pids = client.run(os.getpid)
    return {str(w["name"]): (addr, pids[addr]) for addr, w in client.scheduler_info()["workers"].items()
            if addr in pids}


def _victim_holding_a_group(client, before, job_dir):
    """The victim: the worker that has run (and logged) the most of this top_k's chunks, returned once
    it holds a grouped top_k task (which then waits at the gate)."""
    def ran_chunks():
        counts = {w: len(_complete_lines(os.path.join(job_dir, f"{w}.jsonl"))) for w in before}
        w = max(counts, key=counts.get)
        return w if counts[w] else None
    victim = _wait(ran_chunks, "a worker to log a top_k chunk")
    addr = before[victim][0]

    def victim_tasks(dask_scheduler, addr=addr):
        ws = dask_scheduler.workers.get(addr)
        return sorted(str(ts.key) for ts in ws.processing) if ws is not None else []
    _wait(lambda: [k for k in client.run_on_scheduler(victim_tasks) if "hipsched-top_k-group" in k],
          "the victim to hold a grouped top_k task")
    return victim


def test_sigkill_mid_top_k_reruns_tasks_and_leaves_a_parseable_log(cluster, gate):
    jsonschema = need("jsonschema")
    client, job_dir = cluster
    rng = np.random.default_rng(11)
    T = rng.standard_normal((N_CHUNKS * ROWS, D)).astype(np.float32)
    q = rng.standard_normal(D).astype(np.float32)
    T[N_CHUNKS * ROWS - 5] = 3 * q        # the best row, in the last chunk
    Td = da.from_array(T, chunks=(ROWS, D))
    assert Td.numblocks == (N_CHUNKS, 1)

    before = _workers(client)
    assert sorted(before) == ["0", "1"]
    idx_d, val_d = hd.top_k(q, Td, K)
    fut_idx, fut_val = client.compute([idx_d, val_d])

    # its second top_k call (the second chunk of its group) is held at the gate: that grouped task is
    # lost with the process, with the chunks it already scanned
    victim = _victim_holding_a_group(client, before, job_dir)
    addr, pid = before[victim]
    assert not fut_val.done()   # the gate is closed: the job cannot have finished
    os.kill(pid, signal.SIGKILL)
    path = os.path.join(job_dir, f"{victim}.jsonl")
    lines_at_kill = len(_complete_lines(path))
    open(gate, "w").close()

    idx, val = fut_idx.result(timeout=DEADLINE_S), fut_val.result(timeout=DEADLINE_S)
    ref_idx, ref_val = hs.top_k(q, T, K)
    # the victim's tasks ran again elsewhere; the answer is still the single-machine one, bit for bit
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val)
    assert idx[0] == N_CHUNKS * ROWS - 5

    # the nanny restarts the victim under its name, in a new process, with its executor from the plugin
    def back():
        try:
            w = _workers(client).get(victim)
            if w is None or w[1] == pid:
                return None
            # the scheduler lists a worker before its plugins have run: wait for the executor too
            info = client.run(hd.worker_info, workers=[w[0]]).get(w[0])
        except OSError:   # distributed's CommClosedError: a process listed but not answering (yet)
            return None
        return (w, info) if info is not None else None
    restarted, info = _wait(back, f"worker {victim} to restart with its executor")
    assert info["worker"] == victim and info["pid"] == restarted[1]
    # a small top_k on the restarted worker appends to the same log under a new run id
    small = da.from_array(T[:400], chunks=(100, D))
    old_run = _records(path)[0]["run"]
    hd.flush_telemetry(client)

    def new_run_lines():
        return sum(r["run"] != old_run for r in _records(path))
    n_new = new_run_lines()   # reruns of the big job's chunks, if the restart came back in time
    idx2 = client.compute(hd.top_k(q, small, 3)[0], workers=[restarted[0]]).result(timeout=DEADLINE_S)
    np.testing.assert_array_equal(idx2, hs.top_k(q, T[:400], 3)[0])
    hd.flush_telemetry(client)

    validator = jsonschema.Draft202012Validator(json.load(open(schema_path())))
    _wait(lambda: new_run_lines() >= n_new + 4, "the small top_k's 4 chunks in the restarted worker's log")
    lines = _complete_lines(path)
    runs = []
    for raw in lines:
        # Every complete line parses. The writer appends each batch with one write(), which a kill does
        # not cut short at these sizes (one or two events per 20 ms batch, far below a page), so not
        # even the fragment a cut would leave (and the newline the next run puts after it) is excused.
        rec = json.loads(raw)
        validator.validate(rec)
        assert (rec["worker"], rec["job"]) == (victim, "fault")
        if not runs or runs[-1] != rec["run"]:
            runs.append(rec["run"])
    # the first run's lines, then the restarted run's: appended, not interleaved or rewritten
    assert len(runs) == len(set(runs)) >= 2
    assert lines_at_kill >= 1 and len(lines) > lines_at_kill
    assert runs[0] == old_run and new_run_lines() == n_new + 4   # the small top_k's 4 chunks, once each


def test_sigkill_mid_top_k_over_a_persisted_corpus(tmp_path):
    """The same kill over a persisted corpus, whose group tasks depend on one chunk each and read the
    others from their worker's memory (hipsched/dask/ops.py, _topk_held): the victim's chunks are lost
    with it, Dask recomputes them, the victim's group runs again elsewhere and scans the chunks it does
    not find there where they are. The answer is still the single-machine one, bit for bit."""
    with _gated_cluster(tmp_path, "fault-persisted") as (client, gate, job_dir):
        rng = np.random.default_rng(12)
        T = rng.standard_normal((N_CHUNKS * ROWS, D)).astype(np.float32)
        q = rng.standard_normal(D).astype(np.float32)
        T[7] = 3 * q                          # the best row, in the first chunk
        T[N_CHUNKS * ROWS - 5] = 2.5 * q      # the second, in the last
        Td = client.persist(da.from_array(T, chunks=(ROWS, D)))
        client.gather(distributed.futures_of(Td))
        before = _workers(client)
        holders = {w for v in client.who_has(distributed.futures_of(Td)).values() for w in v}
        assert len(holders) == 2   # both workers hold chunks: the victim takes some with it
        fut_idx, fut_val = client.compute(list(hd.top_k(q, Td, K)))

        victim = _victim_holding_a_group(client, before, job_dir)
        addr, pid = before[victim]
        assert not fut_val.done()
        os.kill(pid, signal.SIGKILL)
        open(gate, "w").close()
        idx, val = fut_idx.result(timeout=DEADLINE_S), fut_val.result(timeout=DEADLINE_S)
        ref_idx, ref_val = hs.top_k(q, T, K)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_array_equal(val, ref_val)
        assert list(idx[:2]) == [7, N_CHUNKS * ROWS - 5]
        # and again from a placement read afresh (other groups: their keys must not be the first query's,
        # whose results may still be held)
        hd.forget_placements(Td)
        idx, val = client.gather(client.compute(list(hd.top_k(q, Td, K))))
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_array_equal(val, ref_val)


def test_sigkill_mid_search_falls_back_to_the_graph(tmp_path):
    """hd.search's direct requests are not tasks, so Dask does not rerun them: a worker killed while it
    scans for a request makes that request fail, and search answers through top_k's task graph, where
    Dask recomputes the lost chunks. Still the single-machine answer, bit for bit."""
    import threading
    from hipsched.dask import direct
    with _gated_cluster(tmp_path, "fault-search") as (client, gate, job_dir):
        rng = np.random.default_rng(13)
        T = rng.standard_normal((N_CHUNKS * ROWS, D)).astype(np.float32)
        q = rng.standard_normal((2, D)).astype(np.float32)
        T[N_CHUNKS * ROWS - 5] = 3 * q[0]
        Td = client.persist(da.from_array(T, chunks=(ROWS, D)))
        client.gather(distributed.futures_of(Td))
        before = _workers(client)
        graph_before = direct.search_stats["graph"]
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", hd.search(q, Td, K)), daemon=True)
        t.start()
        # each worker scans its first chunk, then waits at the gate: both are mid-request
        logged = lambda: all(_complete_lines(os.path.join(job_dir, f"{w}.jsonl")) for w in before)  # noqa: E731
        _wait(logged, "both workers to log a chunk of the direct query")
        victim = sorted(before)[0]
        assert t.is_alive()
        os.kill(before[victim][1], signal.SIGKILL)
        open(gate, "w").close()
        t.join(DEADLINE_S)
        assert not t.is_alive(), "search did not return"
        ref_idx, ref_val = hs.top_k(q, T, K)
        np.testing.assert_array_equal(out["r"][0], ref_idx)
        np.testing.assert_array_equal(out["r"][1], ref_val)
        assert out["r"][0][0, 0] == N_CHUNKS * ROWS - 5
        assert direct.search_stats["graph"] == graph_before + 1   # the failed request's query ran as the graph
        for w in before:   # every complete line of both logs parses, the killed worker's included
            _records(os.path.join(job_dir, f"{w}.jsonl"))
