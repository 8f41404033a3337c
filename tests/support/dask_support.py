"""Helpers for the tests/dask/test_dask_*.py modules: the LocalCluster they share and an executor factory that
gives chosen workers the fake GPU (tests/support/fake_gpu.py). Worker processes are spawned and cannot import
this tests/ folder, so this module is pickled by value (cloudpickle) and the factory puts the folder on
the worker's sys.path before it imports fake_gpu there."""
import contextlib
import gc
import os
import sys
import time

import cloudpickle

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def computed(x):
    """x computed, after checking that its declared dtype is its chunks' dtype (a Dask array whose dtype
    lies would give wrong results downstream)."""
    out = x.compute()
    assert out.dtype == x.dtype, f"declared {x.dtype}, chunks are {out.dtype}"
    return out


def same_bits(got, ref):
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert got.tobytes() == ref.tobytes()


def start_cluster(distributed, n_workers=2, **kwargs):
    cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", **kwargs)
    return cluster, distributed.Client(cluster)


def job_fixture(name, **setup_options):
    """A module-scoped `job` fixture: hipsched.dask set up on the session's cluster as job `name` (with
    `setup_options`; the model is not persisted), torn down after the module."""
    import pytest

    @pytest.fixture(scope="module")
    def job(dask_client):
        import hipsched.dask as hd
        yield hd.setup(dask_client, persist_model=False, job=name, **setup_options)
        hd.teardown(dask_client)
    return job


class FakeGpuFactory:
    """executor_factory for hipsched.dask.setup: workers named in `gpu_workers` get a fake GPU whose
    every call costs `gpu_cost_us` (busy-waited), the others none at all."""

    def __init__(self, gpu_workers=("0",), gpu_cost_us=0.0, fail_workers=()):
        self.gpu_workers = set(gpu_workers)
        self.gpu_cost_us = gpu_cost_us
        self.fail_workers = set(fail_workers)   # these workers' fake GPU fails every launch

    def __call__(self, config):
        if TESTS_DIR not in sys.path:
            sys.path.insert(0, TESTS_DIR)
        from fake_gpu import FakeGpuBackend
        from hipsched import Executor
        name = config.telemetry_worker
        if name not in self.gpu_workers:
            return Executor(config, gpu_backend=FakeGpuBackend(available=False))
        cost = self.gpu_cost_us
        fail = (lambda call: "launch") if name in self.fail_workers else None
        return Executor(config, gpu_backend=FakeGpuBackend(cost_us=(lambda call: cost) if cost else None, fail=fail))


@contextlib.contextmanager
def no_task_runs(client, settle_s=30.0):
    """Asserts the block ran no task on `client`'s cluster (bad input must fail on the client). Earlier
    tests' results are released in the background, so it first waits for the scheduler to hold none."""
    def state(dask_scheduler):
        return len(dask_scheduler.tasks), dask_scheduler.transition_counter

    # a future an earlier test left in a reference cycle (a frame of a traceback pytest.raises kept)
    # holds its task until the collector runs, which in the whole suite may be never before this test:
    # CI saw "the scheduler still holds 10 tasks" after 30 s that a run of tests/dask alone never does
    gc.collect()
    end = time.monotonic() + settle_s
    before = client.run_on_scheduler(state)
    while before[0] and time.monotonic() < end:
        time.sleep(0.05)
        before = client.run_on_scheduler(state)
    assert before[0] == 0, f"the scheduler still holds {before[0]} tasks of earlier tests"
    yield
    assert client.run_on_scheduler(state) == before, "a task ran on the cluster"


def unaligned_copy(block):
    """`block`'s values in a buffer that starts 1 byte past an aligned address: what a chunk that arrived
    inside a pickled message can look like (its items unaligned), made on purpose."""
    import numpy as np
    raw = np.empty(block.nbytes + 1, np.uint8)
    out = np.frombuffer(raw.data, dtype=block.dtype, count=block.size, offset=1).reshape(block.shape)
    out[...] = block
    return out


def tie_nan_corpus(seed, n=3000, d=16):
    """A float32 corpus (n, d) with the cases a merge must order as one machine does: row 2900 equals
    row 7 (a tie far from its twin: the lower index first) and row 1500 holds a NaN (after every number)."""
    import numpy as np
    T = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    T[2900] = T[7]
    T[1500, 3] = np.nan
    return T


def move_chunks(client, keys, src, dst):
    """Moves the chunks `keys` from worker `src` to `dst` (copied there, then deleted on src) behind any
    hipsched cache's back, as a rebalance or a retirement would."""
    keys = list(keys)

    async def move(dask_scheduler, keys=keys, src=src, dst=dst):
        # between the copy and the delete each key has two replicas, and the active memory manager's
        # ReduceReplicas may drop the new one (then the delete loses the key): paused for the move
        amm = dask_scheduler.extensions.get("amm")
        running = amm is not None and amm.running
        if running:
            amm.stop()
        try:
            await dask_scheduler.gather_on_worker(dst, {k: [src] for k in keys})
            await dask_scheduler.delete_worker_data(src, keys, stimulus_id="hipsched-test-move")
        finally:
            if running:
                amm.start()
    client.run_on_scheduler(move)
