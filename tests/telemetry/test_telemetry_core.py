"""Telemetry in memory: event dicts against the schema, scopes, exact counters under threads, the
bounded ring, summaries and the debug table."""
import io
import json
import threading
import time
from enum import Enum

import numpy as np
import pytest
from requires import need

import hipsched as hs
from hipsched.telemetry import BackendStats, Telemetry, parse_ts, schema_path


@pytest.fixture(scope="module")
def validator():
    jsonschema = need("jsonschema", reason="validates events against the schema (test extra)")
    with open(schema_path()) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def rec(tel, op="add", backend="cpu", dur=2.0, size=8, fallback=None, stream=None):
    tel.record(op, backend, "cost_model", size, "float32", size * 12, dur, 1.5, 30.0, stream=stream, fallback=fallback)


def test_event_fields_match_the_schema(validator):
    tel = Telemetry(host="h1", device="gfx90a", run_id="run-a")
    t0 = time.time()
    with tel.scope(phase="search", corpus="wiki"):
        tel.record("cosine_similarity", "gpu", "cost_model", 262144, "float32", 805306368, 812.4, 9100.0, 790.0,
                   stream=1)
    rec(tel, fallback=("gpu", "[oom/hipErrorOutOfMemory] out of memory"))
    a, b = tel.events
    for e in (a, b):
        validator.validate(e)
    assert a["op"] == "cosine_similarity" and a["backend"] == "gpu" and a["size"] == 262144
    assert a["predicted_us"] == {"cpu": 9100.0, "gpu": 790.0} and a["duration_us"] == 812.4
    assert a["phase"] == "search" and a["tags"] == {"corpus": "wiki"} and a["stream"] == 1
    assert (a["run"], a["host"], a["device"], a["v"]) == ("run-a", "h1", "gfx90a", 1)
    assert abs(parse_ts(a["ts"]) - t0) < 5
    assert (a["seq"], b["seq"]) == (0, 1)
    assert b["phase"] is None and b["tags"] == {} and a["fallback"] is None
    assert b["fallback"] == {"backend": "gpu", "error": "[oom/hipErrorOutOfMemory] out of memory"}


def test_a_run_on_a_further_gpu_names_its_device(validator, tmp_path):
    """gpu_device is on the events of GPU runs on an executor's further device, and on no other: the line
    written equals the in-memory event, both validate, and the trace puts the call on that device's track."""
    import json
    from hipsched.telemetry.trace import TraceWriter
    path = tmp_path / "t.jsonl"
    with Telemetry(path=path, host="h", device="d") as tel:
        tel.record("add", "gpu", "gpu_available", 4096, "float32", 49152, 12.5, 30.0, 8.0, gpu_device=1)
        rec(tel, backend="gpu")
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    a, b = tel.events
    assert lines == [a, b] and a["gpu_device"] == 1 and "gpu_device" not in b
    for e in (a, b):
        validator.validate(e)
    out = tmp_path / "trace.json"
    tw = TraceWriter(str(out))
    for e in (a, b):
        tw.add(e)
    tw.close()
    evs = json.load(open(out))["traceEvents"]
    tracks = {m["tid"]: m["args"]["name"] for m in evs if m["name"] == "thread_name"}
    assert sorted(tracks[e["tid"]] for e in evs if e["ph"] == "X") == ["GPU", "GPU:1"]


def test_enum_reasons_and_stream_objects_become_plain_values():
    class Reason(str, Enum):
        COST_MODEL = "cost_model"

    class Stream:
        ptr = 0xABC

    tel = Telemetry()
    tel.record("add", "gpu", Reason.COST_MODEL, 8, "float32", 96, 3.0, None, float("nan"), stream=Stream())
    e = tel.events[0]
    assert e["reason"] == "cost_model" and e["stream"] == 0xABC
    assert e["predicted_us"] == {"cpu": None, "gpu": None}


def test_scopes_nest_and_stay_in_their_thread():
    tel = Telemetry()
    seen = {}
    with tel.scope(phase="outer", a=1):
        with tel.scope(b=2):
            rec(tel)
        with tel.scope(phase="inner", a=3):
            rec(tel)
        t = threading.Thread(target=lambda: (rec(tel), seen.setdefault("ok", True)))
        t.start()
        t.join()
    rec(tel)
    ev = tel.events
    assert (ev[0]["phase"], ev[0]["tags"]) == ("outer", {"a": 1, "b": 2})
    assert (ev[1]["phase"], ev[1]["tags"]) == ("inner", {"a": 3})
    assert (ev[2]["phase"], ev[2]["tags"]) == (None, {})  # a new thread starts with an empty context
    assert (ev[3]["phase"], ev[3]["tags"]) == (None, {})


def test_counters_are_exact_under_many_threads():
    tel = Telemetry(ring_size=100)
    n_threads, per = 8, 3000

    def work(i):
        for j in range(per):
            if j % 3 == 0:
                rec(tel, op="softmax", backend="gpu", dur=4.0)
            elif j % 100 == 1:
                rec(tel, op="add", backend="cpu", dur=1.0, fallback=("gpu", "launch"))
            else:
                rec(tel, op="add", backend="cpu", dur=1.0)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    gpu_per = len(range(0, per, 3))
    fb_per = len([j for j in range(per) if j % 3 and j % 100 == 1])
    s = tel.stats()
    assert s.total_operations == n_threads * per
    assert s.gpu_operations == n_threads * gpu_per
    assert s.cpu_operations == n_threads * (per - gpu_per)
    assert s.fallback_operations == n_threads * fb_per
    assert s.gpu_time_us == pytest.approx(4.0 * n_threads * gpu_per)
    assert s.cpu_time_us == pytest.approx(1.0 * n_threads * (per - gpu_per))
    assert len(tel.events) == 100  # the ring is bounded, the counters are not
    assert sorted({e["seq"] for e in tel.events}) == list(range(n_threads * per - 100, n_threads * per))
    summ = tel.summary()
    assert summ.per_op["softmax"]["gpu"].count == n_threads * gpu_per
    assert summ.fallback_errors == {("add", "launch"): n_threads * fb_per}
    by = tel.operations_by_type("add")
    assert by["gpu"]["count"] == 0 and by["cpu"]["fallbacks"] == n_threads * fb_per
    assert by["cpu"]["mean_us"] == pytest.approx(1.0)


def test_ring_keeps_the_most_recent_events():
    tel = Telemetry(ring_size=10)
    for i in range(25):
        rec(tel, size=i + 1)
    assert [e["size"] for e in tel.events] == list(range(16, 26))
    assert tel.stats().total_operations == 25


def test_empty_and_cleared_summaries_do_not_divide_by_zero():
    tel = Telemetry()
    buf = io.StringIO()
    tel.print_debug_summary(file=buf)
    assert "no operations" in buf.getvalue()
    s = tel.stats()
    assert s == BackendStats() and s.gpu_fraction == 0.0 and s.fallback_rate == 0.0
    assert tel.operations_by_type("add")["cpu"] == {"count": 0, "time_us": 0.0, "mean_us": 0.0, "fallbacks": 0}
    rec(tel, op="add", backend="cpu", dur=3.0)
    rec(tel, op="add", backend="gpu", dur=1.0)
    buf = io.StringIO()
    tel.print_debug_summary(file=buf)
    out = buf.getvalue()
    assert "add" in out and "50%" in out
    tel.clear()
    assert tel.events == [] and tel.stats().total_operations == 0


def test_disabled_telemetry_records_nothing():
    tel = Telemetry(enabled=False)
    rec(tel)
    assert tel.events == [] and tel.stats().total_operations == 0


def test_bad_sizes_are_rejected_with_the_value():
    with pytest.raises(ValueError, match="ring_size"):
        Telemetry(ring_size=-1)
    with pytest.raises(ValueError, match="queue_size"):
        Telemetry(path="/tmp/never-used.jsonl", queue_size=0)


def test_counts_of_ended_threads_survive_and_clear_resets_them():
    tel = Telemetry()
    for round_ in range(3):  # many short threads: their shards are folded, not lost
        ts = [threading.Thread(target=lambda: [rec(tel, op="scale") for _ in range(50)]) for _ in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert tel.stats().total_operations == 500 * (round_ + 1)
    rec(tel, op="scale")
    assert tel.operations_by_type("scale")["cpu"]["count"] == 1501
    tel.clear()
    assert tel.stats().total_operations == 0
    rec(tel, op="scale")
    assert tel.stats().total_operations == 1


@pytest.mark.parametrize("value,expected", [("/tmp/x.jsonl", "/tmp/x.jsonl"), ("", None), ("off", None), ("0", None)])
def test_path_from_env(monkeypatch, value, expected):
    from hipsched.telemetry import path_from_env
    monkeypatch.setenv("HIPSCHED_TELEMETRY", value)
    assert path_from_env() == expected


def test_nvtx_ranges_are_safe_with_or_without_a_profiler_library():
    from hipsched.telemetry import nvtx
    opened = nvtx.push("hipsched:test")
    assert opened == nvtx.available()
    if opened:
        nvtx.pop()
    with nvtx.annotate("block"):
        pass
    tel = Telemetry()
    with tel.scope(phase="profiled"):
        rec(tel)
    assert tel.events[0]["phase"] == "profiled"


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_tel_events.py): Review: events from numpy scalars, non-string phases and odd tag values validate against the schema,
# in the JSONL lines and in Telemetry.events.
# ----------------------------------------------------------------------------------------------------
import numpy as np

from hipsched.telemetry import Telemetry, schema_path



def test_numpy_stream_and_non_string_phase_validate(tmp_path):
    v = need("jsonschema").Draft202012Validator(json.load(open(schema_path())))
    p = tmp_path / "l.jsonl"
    tel = Telemetry(path=str(p), flush_interval=3600)
    with tel.scope(phase=5, x=np.float32(1.5), y=np.int64(2)):
        tel.record("add", "gpu", "cost_model", np.int64(5), "float32", np.int64(20), np.float32(1.5),
                   np.float64("nan"), None, stream=np.int64(3))
    tel.close()
    line = json.loads(p.read_text().splitlines()[0])
    assert line["stream"] == 3
    d = tel.events[0]
    assert d["stream"] == 3 and d["phase"] == "5"
    for rec in (line, json.loads(json.dumps(d))):
        assert not list(v.iter_errors(rec)), rec


def test_record_with_missing_or_nan_duration_keeps_counters_finite(tmp_path):
    import math
    v = need("jsonschema").Draft202012Validator(json.load(open(schema_path())))
    p = tmp_path / "l.jsonl"
    tel = Telemetry(path=str(p), flush_interval=3600)
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, 5.0, 1.0, None)
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, None, 1.0, None)        # schema: null allowed
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, float("nan"), 1.0, None)
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, float("inf"), 1.0, None)
    tel.close()
    st = tel.stats()
    assert st.cpu_operations == 4 and st.cpu_time_us == 5.0 and math.isfinite(st.cpu_time_us)
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    assert [x["duration_us"] for x in lines] == [5.0, None, None, None]
    for rec in lines + [json.loads(json.dumps(d)) for d in tel.events]:
        assert not list(v.iter_errors(rec)), rec


def test_telemetry_doc_names_every_op():
    """docs/guide/telemetry.md's `op` field lists the values a log can hold: every public op (it had left out
    rms_norm), read from the op specs so a new op is listed or this fails."""
    import os
    import re
    import hipsched
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "guide", "telemetry.md")) as f:
        row = next(line for line in f if line.startswith("| `op` |"))
    assert set(re.findall(r"`(\w+)`", row.split("|")[3])) == set(hipsched.OPS)


def test_a_common_path_event_is_stamped_when_its_call_ended(rng):
    """The compiled common path's events take their wall time from the run's own end reading (one clock
    read fewer): each lies between the wall clock read before and after its call, and in seq order."""
    a = rng.standard_normal(8).astype(np.float32)
    with hs.Executor(persist_model=False) as ex:
        bounds = []
        for _ in range(50):
            before = time.time()
            ex.add(a, a)
            bounds.append((before, time.time()))
        ev = ex.events[-50:]
    assert [e["reason"] for e in ev] and all(e["backend"] == "cpu" for e in ev)
    ts = [parse_ts(e["ts"]) for e in ev]
    for t, (lo, hi) in zip(ts, bounds):
        assert lo - 1e-3 <= t <= hi + 1e-3   # (the anchor's two reads are ns apart; ts keeps us)
    assert ts == sorted(ts)
