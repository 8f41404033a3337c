"""Telemetry of a distributed job: the optional `worker` and `job` fields (absent on single-machine runs),
one log per worker in a folder per job, and the merged view of those logs (analyzer, trace, monitor)."""
import glob
import json
import os

import numpy as np
import pytest
from requires import need

from hipsched.telemetry import Telemetry, schema_path

jsonschema = need("jsonschema")


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
dask = need("dask", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
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


def test_analyzer_merges_the_job_folder_per_worker(job_dir, tmp_path):
    from hipsched.telemetry.analysis import analyze, report
    res = analyze([job_dir], trace=str(tmp_path / "trace.json"))
    assert res["inputs"]["events"] == 40 and len(res["inputs"]["files"]) == 2
    workers = {w["worker"]: w for w in res["workers"]}
    assert set(workers) == {"0", "1"} and all(w["jobs"] == ["tel-job"] for w in workers.values())
    assert workers["0"]["devices"] == ["FakeGPU 1"]
    assert [(r["backend"], r["fallbacks"]) for r in workers["0"]["ops"]] == [("gpu", 0)]
    assert workers["0"]["fallbacks"] == []
    (fb,) = workers["1"]["fallbacks"]
    assert (fb["op"], fb["backend"], fb["count"]) == ("top_k", "gpu", workers["1"]["events"])
    assert workers["0"]["events"] + workers["1"]["events"] == 40
    text = report([job_dir])
    assert "Per worker, op and backend" in text and "Fallbacks by worker" in text
    # Perfetto: one process per worker
    trace = json.load(open(tmp_path / "trace.json"))
    names = sorted(e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name")
    assert names == ["hipsched worker 0 (vm, FakeGPU 1)".replace("vm", os.uname().nodename),
                     "hipsched worker 1 (vm, FakeGPU 1)".replace("vm", os.uname().nodename)]
    assert len({e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}) == 2


def test_monitor_summary_on_a_job_folder_being_written(job_dir, tmp_path, capsys):
    import shutil
    from hipsched.__main__ import main
    live = tmp_path / "live"
    shutil.copytree(job_dir, live)
    with open(live / "1.jsonl", "a") as fh:   # a writer caught mid-line: skipped, not fatal
        fh.write('{"v":1,"ts":"2026-')
    assert main(["monitor", str(live), "--summary"]) == 0
    out = capsys.readouterr().out
    assert "top_k  gpu" in out and "top_k  cpu" in out and "1 malformed lines skipped" in out
    assert main(["monitor", str(live), "--tail"]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_crossover_per_worker_hardware(tmp_path):
    """Two workers, the same op and sizes: the GPU wins from 2^12 on one and from 2^20 on the other."""
    from hipsched.telemetry.analysis import analyze
    for name, cross in (("fast-gpu", 12), ("slow-gpu", 20)):
        with Telemetry(path=str(tmp_path / f"{name}.jsonl"), worker=name, job="j", device=name) as t:
            for b in range(8, 25, 2):
                size = 1 << b
                cpu_us, gpu_us = float(size) / 100, float(size) / 100 * (0.5 if b > cross else 2.0)
                for _ in range(3):
                    t.record("cosine_similarity", "cpu", "exploring", size, "float32", 4 * size, cpu_us, None, None)
                    t.record("cosine_similarity", "gpu", "exploring", size, "float32", 4 * size, gpu_us, None, None)
    res = analyze([str(tmp_path)])
    got = {w["worker"]: w["crossover"][0] for w in res["workers"]}
    assert got["fast-gpu"]["status"] == got["slow-gpu"]["status"] == "crossover"
    assert (got["fast-gpu"]["low"], got["fast-gpu"]["high"]) == pytest.approx((1 << 12, 1 << 14), rel=0.01)
    assert (got["slow-gpu"]["low"], got["slow-gpu"]["high"]) == pytest.approx((1 << 20, 1 << 22), rel=0.01)
