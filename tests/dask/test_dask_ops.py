"""hipsched.dask on a 2-process LocalCluster (the session's dask_client): one Executor per worker built by
the plugin, the lookup tasks use, GPU pinning, the persisted model per worker's hardware, and top_k /
cosine_similarity equal to the single-machine ops.

Equality: the CPU kernel scores each (query, row) pair on its own, so a row's score does not depend on
which chunk it sits in for q with at most 12 rows (hipsched/cpu/_similarity.pyx, FUSED_MAX_QUERIES):
there the results must be bit-identical. Above 12 queries the kernel may score through BLAS, whose
summation order can change with the chunk's row count; there each score must be within the float32 bound
for a cosine of d terms, |err| <= 2 (d + 2) 2^-24 (dot and both norms each accumulate at most d
roundings, relative to |q| |t| by Cauchy-Schwarz, plus the division and the scaling)."""
import os

import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
import dask  # noqa: E402

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from dask_support import FakeGpuFactory  # noqa: E402


def f32_bound(d):
    return 2 * (d + 2) * 2.0 ** -24


@pytest.fixture(scope="module")
def job(dask_client, tmp_path_factory):
    # worker "0" has a (fake) GPU, worker "1" none: every op still gives the same numbers
    return hd.setup(dask_client, executor_factory=FakeGpuFactory(gpu_workers=("0",)), persist_model=False,
                    telemetry_dir=str(tmp_path_factory.mktemp("dask-ops-logs")), job="ops")


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(7)
    T = rng.standard_normal((3001, 24)).astype(np.float32)
    T[1500] = T[10]          # equal scores in different chunks: the lower index must win
    T[2999] = T[10]
    T[700] = 0.0             # a zero row scores 0
    T[1234, 3] = np.nan      # a NaN score ranks after every number
    T[2000] = 2 * T[11]      # equal cosine through a different norm
    return T


def chunked(T, rows=137):
    return da.from_array(T, chunks=(rows, T.shape[1]))


def test_tasks_run_on_the_workers_executors(dask_client, job):
    info = dask_client.run(hd.worker_info)
    assert sorted(i["worker"] for i in info.values()) == ["0", "1"]
    assert all(i["job"] == "ops" for i in info.values())
    assert {i["worker"]: i["gpu_available"] for i in info.values()} == {"0": True, "1": False}
    # the lookup inside a task gives the plugin's executor, tagged with its worker
    futs = [dask_client.submit(lambda i: (hd.executor().config.telemetry_worker, hd.executor().config.telemetry_job),
                               i, pure=False, workers=[addr]) for i, addr in enumerate(sorted(info))]
    got = {w for w, _ in dask_client.gather(futs)}
    assert got == {"0", "1"} and {j for _, j in dask_client.gather(futs)} == {"ops"}


def test_lookup_without_a_cluster_is_the_default_executor():
    assert hd.executor() is hs.default_executor()
    same = dask.delayed(lambda: hd.executor() is hs.default_executor())()
    assert same.compute(scheduler="threads") and same.compute(scheduler="synchronous")


@pytest.mark.parametrize("shape_q", [(24,), (1, 24), (5, 24), (12, 24)])
@pytest.mark.parametrize("k", [1, 10, 200])
def test_top_k_is_bit_identical(dask_client, job, corpus, shape_q, k):
    q = np.random.default_rng(k).standard_normal(shape_q).astype(np.float32)
    q.reshape(-1, 24)[0] = corpus[10]    # the duplicated rows tie at the top
    idx, val = dask.compute(*hd.top_k(q, chunked(corpus), k))
    ref_idx, ref_val = hs.top_k(q, corpus, k)
    assert idx.dtype == np.int64 and val.dtype == np.float32 and idx.shape == ref_idx.shape
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val)   # NaN == NaN here, as in the single-machine op


def test_top_k_ties_and_nan_order(dask_client, job, corpus):
    q = corpus[10].copy()
    idx, val = dask.compute(*hd.top_k(q, chunked(corpus, 50), 3001))
    top = list(idx[:3])
    assert top == [10, 1500, 2999]               # equal scores across chunks: ascending index
    assert idx[-1] == 1234 and np.isnan(val[-1])  # NaN last
    assert sorted(idx.tolist()) == list(range(3001))


def test_top_k_k_beyond_n_and_a_query_given_as_dask(dask_client, job, corpus):
    q = da.from_array(np.ones((2, 24), np.float32), chunks=(1, 12))   # chunked query: sent as one block
    idx, val = dask.compute(*hd.top_k(q, chunked(corpus[:90], 40), 500))
    ref_idx, ref_val = hs.top_k(np.ones((2, 24), np.float32), corpus[:90], 500)
    assert idx.shape == (2, 90)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(val, ref_val)


def test_top_k_many_queries_within_float32_bound(dask_client, job, corpus):
    d = corpus.shape[1]
    q = np.random.default_rng(3).standard_normal((20, d)).astype(np.float32)
    k = 15
    idx, val = dask.compute(*hd.top_k(q, chunked(corpus, 400), k))
    ref_idx, ref_val = hs.top_k(q, corpus, k)
    np.testing.assert_allclose(val, ref_val, rtol=0, atol=f32_bound(d))
    exact = hs.cosine_similarity(q.astype(np.float64), corpus.astype(np.float64))
    for r in range(q.shape[0]):
        # each returned index's score is its true cosine within the bound
        np.testing.assert_allclose(val[r], exact[r, idx[r]], rtol=0, atol=f32_bound(d) + 1e-6)
        # where the k-th and (k+1)-th scores are apart by more than twice the bound, the sets agree
        s = np.sort(np.nan_to_num(exact[r], nan=-2))[::-1]
        if s[k - 1] - s[k] > 2 * f32_bound(d):
            assert set(idx[r]) == set(ref_idx[r])


@pytest.mark.parametrize("shape_q", [(24,), (4, 24)])
def test_cosine_similarity_is_bit_identical(dask_client, job, corpus, shape_q):
    q = np.random.default_rng(1).standard_normal(shape_q).astype(np.float32)
    out = hd.cosine_similarity(q, chunked(corpus))
    assert out.shape == hs.cosine_similarity(q, corpus).shape and out.chunks[-1] == chunked(corpus).chunks[0]
    np.testing.assert_array_equal(out.compute(), hs.cosine_similarity(q, corpus))


def test_cosine_similarity_many_queries_within_bound(dask_client, job, corpus):
    q = np.random.default_rng(2).standard_normal((30, 24)).astype(np.float32)
    got = hd.cosine_similarity(q, chunked(corpus, 1000)).compute()
    np.testing.assert_allclose(got, hs.cosine_similarity(q, corpus), rtol=0, atol=f32_bound(24))


def test_bad_input_fails_on_the_client_before_any_task(dask_client, job, corpus):
    T = chunked(corpus)
    q = np.ones(24, np.float32)
    with pytest.raises(ValueError, match=r"top_k: shapes do not match: q \(23,\) vs T \(3001, 24\)"):
        hd.top_k(np.ones(23, np.float32), T, 3)
    with pytest.raises(ValueError, match=r"chunked along d .*rechunk\(\{1: -1\}\)"):
        hd.top_k(q, da.from_array(corpus, chunks=(500, 12)), 3)
    with pytest.raises(ValueError, match=r"chunked along d"):
        hd.cosine_similarity(q, da.from_array(corpus, chunks=(500, 12)))
    for k in (0, -1):
        with pytest.raises(ValueError, match="top_k: k"):
            hd.top_k(q, T, k)
    with pytest.raises(TypeError, match="top_k: k must be an integer"):
        hd.top_k(q, T, 2.5)
    with pytest.raises(TypeError, match="must be a dask array"):
        hd.top_k(q, corpus, 3)
    with pytest.raises(TypeError, match="argument 'T' has dtype complex64"):
        hd.cosine_similarity(q, T.astype(np.complex64))
    with pytest.raises(ValueError, match="argument 'q' must be 1-d or 2-d"):
        hd.top_k(np.ones((1, 1, 24), np.float32), T, 3)
    with pytest.raises(ValueError, match="split_every"):
        hd.top_k(q, T, 3, split_every=1)


def test_pinned_device_from_the_visible_devices_variables():
    assert hd.pinned_device({})["variable"] is None
    p = hd.pinned_device({"CUDA_VISIBLE_DEVICES": "3,1"})
    assert (p["variable"], p["device"], p["gpu_device_id"], p["force_cpu"]) == ("CUDA_VISIBLE_DEVICES", "3", 0, False)
    p = hd.pinned_device({"HIP_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0"})   # HIP's own variable first
    assert (p["variable"], p["device"]) == ("HIP_VISIBLE_DEVICES", "2")
    assert hd.pinned_device({"ROCR_VISIBLE_DEVICES": "5"})["device"] == "5"
    for none in ("", "-1", " , "):
        assert hd.pinned_device({"CUDA_VISIBLE_DEVICES": none})["force_cpu"]


class _Worker:   # what the plugin reads of a distributed.Worker
    def __init__(self, name):
        self.name = name
        self.plugins = {}


def test_plugin_pins_the_executor_with_the_variables_set(monkeypatch, tmp_path):
    from hipsched.dask.workers import HipschedWorkerPlugin, client_settings
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    plugin = HipschedWorkerPlugin(client_settings({"persist_model": False}), "pin", str(tmp_path))
    plugin.setup(_Worker("gpu-3"))
    try:
        ex = plugin.executor
        assert ex.config.gpu_device_id == 0 and not ex.config.force_cpu_mode
        assert plugin.info["pin"]["device"] == "3"
        assert plugin.info["telemetry_path"] == os.path.join(str(tmp_path), "pin", "gpu-3.jsonl")
    finally:
        plugin.teardown(None)
    # an explicit gpu_device_id from the client is an index into the visible list, for every worker
    plugin = HipschedWorkerPlugin(client_settings({"gpu_device_id": 1}), "pin")
    assert plugin.worker_config("w", env={"CUDA_VISIBLE_DEVICES": "3,1"})[0].gpu_device_id == 1
    # its own device alone, though it sees both: the other is another worker's
    assert plugin.worker_config("w", env={"CUDA_VISIBLE_DEVICES": "3,1"})[0].gpu_devices == [1]
    assert HipschedWorkerPlugin(client_settings({}), "pin").worker_config(
        "w", env={"CUDA_VISIBLE_DEVICES": "2,3,0,1"})[0].gpu_devices == [0]
    assert HipschedWorkerPlugin(client_settings({"gpu_devices": [0, 1]}), "pin").worker_config(
        "w", env={"CUDA_VISIBLE_DEVICES": "2,3"})[0].gpu_devices == [0, 1]
    # no device visible: everything on the CPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    plugin = HipschedWorkerPlugin(client_settings({"persist_model": False}), "pin")
    plugin.setup(_Worker("cpu-only"))
    try:
        assert plugin.executor.config.force_cpu_mode
        assert plugin.executor.select_backend("top_k", 10 ** 9).backend == "cpu"
    finally:
        plugin.teardown(None)


def test_setup_rejects_bad_or_per_worker_settings_on_the_client(dask_client):
    with pytest.raises(hs.ConfigError, match="strategy"):
        hd.setup(dask_client, strategy="fastest")
    with pytest.raises(hs.ConfigError, match="set per worker"):
        hd.setup(dask_client, telemetry_path="/tmp/x.jsonl")


def test_each_worker_loads_the_model_of_its_hardware(dask_client, tmp_path):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
    from fake_gpu import FakeGpuBackend
    # a model saved on this host for the fake GPU's device: the worker with that device must load it
    with hs.Executor(gpu_backend=FakeGpuBackend(), cache_dir=str(tmp_path), telemetry_enabled=False) as ex:
        for _ in range(5):
            ex.performance_tracker.record_gpu_success("top_k", 40.0, size=1 << 20)
            ex.performance_tracker.record_cpu_latency("top_k", 900.0, size=1 << 20)
    try:
        hd.setup(dask_client, executor_factory=FakeGpuFactory(gpu_workers=("0",)), cache_dir=str(tmp_path),
                 persist_model=True, job="model")

        def gpu_samples(dask_worker):
            ex = hd.worker_info(dask_worker) and dask_worker.plugins[hd.PLUGIN_NAME].executor
            return ex.config.telemetry_worker, sum(b[1] for b in ex.performance_tracker.samples("top_k", "gpu"))

        got = dict(dask_client.run(gpu_samples).values())
        assert got == {"0": 5, "1": 0}
        decisions = dict(dask_client.run(lambda dask_worker: (
            dask_worker.plugins[hd.PLUGIN_NAME].executor.config.telemetry_worker,
            dask_worker.plugins[hd.PLUGIN_NAME].executor.select_backend("top_k", 1 << 20).backend)).values())
        # same op, same size, different hardware: different decisions
        assert decisions == {"0": "gpu", "1": "cpu"}
    finally:
        hd.teardown(dask_client)


def test_import_hipsched_does_not_import_dask():
    import subprocess
    import sys
    code = ("import sys, hipsched, hipsched.telemetry.analysis; hipsched.Executor; hipsched.top_k\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
