"""Telemetry of a distributed job: the optional `worker` and `job` fields (absent on single-machine runs),
one log per worker in a folder per job, and the merged view of those logs (analyzer, trace, monitor)."""
import glob
import json
import os

import numpy as np
import pytest

from hipsched.telemetry import Telemetry, schema_path

jsonschema = pytest.importorskip("jsonschema")


def _lines(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def test_worker_and_job_fields_only_when_given(tmp_path):
    validator = jsonschema.Draft202012Validator(json.load(open(schema_path())))
    plain, tagged = tmp_path / "plain.jsonl", tmp_path / "tagged.jsonl"
    with Telemetry(path=str(plain)) as a, Telemetry(path=str(tagged), worker=3, job="j-1") as b:
        for t in (a, b):
            t.record("add", "cpu", "cost_model", 8, "float32", 96, 1.5, 1.0, None)
        mem_a, mem_b = a.events, b.events
    (la,), (lb,) = _lines(plain), _lines(tagged)
    assert "worker" not in la and "job" not in la and "worker" not in mem_a[0]
    assert (lb["worker"], lb["job"]) == ("3", "j-1") and lb == mem_b[0]
    # right after `device`, the rest unchanged: single-machine lines are what they were
    assert list(lb)[:8] == ["v", "ts", "run", "host", "device", "worker", "job", "seq"]
    assert {k: v for k, v in lb.items() if k not in ("worker", "job", "ts", "run")} == \
        {k: v for k, v in la.items() if k not in ("ts", "run")}
    for d in (la, lb):
        validator.validate(d)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(dict(lb, worker=3))


def test_executor_passes_the_config_tags():
    from hipsched import Executor
    with Executor(telemetry_worker="w7", telemetry_job="nightly", persist_model=False) as ex:
        ex.add(np.ones(4, np.float32), np.ones(4, np.float32))
        (e,) = ex.events
    assert (e["worker"], e["job"]) == ("w7", "nightly")


# ------------------------------------------------------------------------------------ on the cluster
dask = pytest.importorskip("dask", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
pytest.importorskip("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
import dask.array as da  # noqa: E402

import hipsched.dask as hd  # noqa: E402
from dask_support import FakeGpuFactory  # noqa: E402


@pytest.fixture(scope="module")
def job_dir(dask_client, tmp_path_factory):
    """One job: worker "0" has a fast fake GPU, worker "1" has a fake GPU whose every launch fails (so its
    calls fall back to its CPU), gpu_preferred so both try their GPU on every chunk."""
    root = tmp_path_factory.mktemp("dask-job")
    job = hd.setup(dask_client, executor_factory=FakeGpuFactory(gpu_workers=("0", "1"), fail_workers=("1",)),
                   persist_model=False, strategy="gpu_preferred", breaker_failures=10 ** 6,
                   health_min_samples=100, telemetry_dir=str(root), job="tel-job")
    rng = np.random.default_rng(5)
    T = rng.standard_normal((4000, 32)).astype(np.float32)
    q = rng.standard_normal(32).astype(np.float32)
    Td = da.from_array(T, chunks=(100, 32))
    idx, _ = dask.compute(*hd.top_k(q, Td, 5))
    import hipsched as hs
    assert np.array_equal(idx, hs.top_k(q, T, 5)[0])   # fallbacks or not, the same answer
    hd.flush_telemetry(dask_client)
    yield os.path.join(str(root), job)
    hd.teardown(dask_client)


def test_one_log_per_worker_with_worker_and_job(job_dir):
    validator = jsonschema.Draft202012Validator(json.load(open(schema_path())))
    files = sorted(glob.glob(os.path.join(job_dir, "*.jsonl")))
    assert [os.path.basename(f) for f in files] == ["0.jsonl", "1.jsonl"]
    by_worker = {}
    for f in files:
        for d in _lines(f):
            validator.validate(d)
            assert d["job"] == "tel-job" and d["worker"] == os.path.basename(f)[:-6]
            by_worker.setdefault(d["worker"], []).append(d)
    assert sum(len(v) for v in by_worker.values()) == 40     # one event per chunk
    assert set(by_worker) == {"0", "1"}
    # the same op at the same size, decided differently by different hardware
    assert {(d["backend"], d["fallback"] is None) for d in by_worker["0"]} == {("gpu", True)}
    assert {(d["backend"], d["reason"]) for d in by_worker["1"]} == {("cpu", "cpu_fallback")}
    assert all(d["fallback"]["backend"] == "gpu" and "scripted launch" in d["fallback"]["error"]
               for d in by_worker["1"])
