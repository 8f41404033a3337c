"""The analyzer on generated logs with known answers: crossover, routing accuracy and regret, fallback
counts, GPU health, merging by run id, malformed lines, the Chrome trace format, the CLIs, and memory
that stays bounded as the log grows."""
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from hipsched.__main__ import main
from hipsched.telemetry import analysis
from hipsched.telemetry.quantiles import LogHistogram
from telemetry_synth import CROSSOVER, SIZES, write_filler_log, write_known_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    path = tmp_path_factory.mktemp("known") / "k.jsonl"
    expected = write_known_log(path)
    return str(path), expected


def test_quantiles_match_numpy_within_the_bin_width():
    x = np.random.default_rng(3).lognormal(4.0, 1.5, 20000)
    h = LogHistogram()
    for v in x:
        h.add(float(v))
    for q in (0.5, 0.95, 0.99):
        assert h.quantile(q) == pytest.approx(np.quantile(x, q), rel=0.011)
    assert h.count == len(x) and h.total == pytest.approx(x.sum())
    small = LogHistogram()
    for v in (1.0, 2.0, 4000.0):
        small.add(v)
    assert small.quantile(0.5) == pytest.approx(2.0, rel=0.011)   # nearest rank: the middle value
    assert small.quantile(0.95) == 4000.0 and small.quantile(0.0) == 1.0  # clamped to the observed extremes
    assert LogHistogram().quantile(0.5) is None


def test_crossover_is_found_within_its_bracket(known):
    res = analysis.analyze([known[0]])
    c = {c["op"]: c for c in res["crossover"]}["matmul"]
    assert c["status"] == "crossover" and c["monotone"]
    assert c["low"] < CROSSOVER < c["high"]
    # adjacent log2 buckets around the true value, and the interpolation lands close to it
    assert c["low"] == pytest.approx(max(s for s in SIZES if s < CROSSOVER))
    assert c["high"] == pytest.approx(min(s for s in SIZES if s > CROSSOVER))
    assert c["size"] == pytest.approx(CROSSOVER, rel=0.05)
    sp = {round(r["size"]): r["speedup"] for r in res["speedup"] if r["op"] == "matmul"}
    for s in SIZES:
        assert sp[s] == pytest.approx((0.01 * s) / (150 + 0.001 * s), rel=1e-6)


def test_routing_accuracy_and_regret_are_exact(known):
    res = analysis.analyze([known[0]])
    exp = known[1]
    m = {r["op"]: r for r in res["routing"]["per_op"]}["matmul"]
    assert m["judged"] == exp["judged"]
    assert m["accuracy"] == pytest.approx(exp["accuracy"])
    assert m["regret_us"] == pytest.approx(exp["regret_us"], rel=1e-6)
    a = {r["op"]: r for r in res["routing"]["per_op"]}["attention"]
    assert a["accuracy"] == 1.0  # gpu_unhealthy decisions are forced, not judged


def test_fallbacks_health_and_advice(known):
    res = analysis.analyze([known[0]])
    exp = known[1]
    fb = {(f["op"], f["error"].split("]")[0] + "]"): f["count"] for f in res["fallbacks"]}
    assert fb == {("attention", "[oom/hipErrorOutOfMemory]"): exp["oom"], ("attention", "[launch]"): exp["launch"]}
    h = {x["op"]: x for x in res["gpu_health"]}["attention"]
    assert (h["gpu_ok"], h["gpu_failed"], h["breaker_opened"]) == (exp["gpu_ok"], exp["gpu_failed"], exp["breaker"])
    rate = exp["gpu_ok"] / (exp["gpu_ok"] + exp["gpu_failed"])
    assert any(a.startswith(f"GPU success rate {rate:.0%} for attention: breaker opened 2 times") for a in res["advice"])
    ops = {(r["op"], r["backend"]): r for r in res["ops"]}
    assert ops[("attention", "cpu")]["fallbacks"] == exp["oom"] + exp["launch"]
    assert sum(r["count"] for r in res["ops"]) == exp["events"]


def test_logs_merge_by_run_and_duplicates_count_once(tmp_path, known):
    other = tmp_path / "other.jsonl"
    exp2 = write_known_log(other, run_id="run-two", host="h2")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"v": 2, "op": "add"}\n[1, 2]\n{"v":1,"ts":"2026-01-01T00:00:00.000000Z","run":"x",'
                   '"host":"h","device":"d","event":"dropped","dropped":7,"dropped_total":7}\n{"v":1,"op":')
    copy = tmp_path / "copy.jsonl"  # the same run's events under another name (e.g. fetched twice)
    copy.write_bytes(open(known[0], "rb").read())
    res = analysis.analyze([known[0], other, copy, known[0], bad])
    assert sorted(r["run"] for r in res["runs"]) == ["run-known", "run-two"]
    assert res["duplicates_skipped"] == known[1]["events"]
    assert sum(r["count"] for r in res["ops"]) == known[1]["events"] + exp2["events"]
    assert res["inputs"]["malformed_lines"] == 4
    assert res["dropped_events"] == 7
    assert any("7 events were dropped" in a for a in res["advice"])


def test_rotated_siblings_are_read_oldest_first(tmp_path):
    path = tmp_path / "r.jsonl"
    from hipsched.telemetry import Telemetry
    tel = Telemetry(path=path, rotate_bytes=4000, rotate_keep=100, flush_interval=3600)
    for i in range(300):
        tel.record("add", "cpu", "cost_model", 8, "float32", 96, 1.0, 1.0, 2.0)
        if i % 5 == 4:
            tel.flush()
    tel.close()
    assert os.path.exists(f"{path}.1")
    res = analysis.analyze([path])
    assert len(res["inputs"]["files"]) > 2 and res["inputs"]["files"][-1] == str(path)
    assert res["runs"][0]["events"] == 300 and res["duplicates_skipped"] == 0
    only_live = analysis.analyze([path], rotated=False)
    assert only_live["runs"][0]["events"] < 300


def test_trace_follows_the_trace_event_format(tmp_path, known):
    out = tmp_path / "trace.json"
    analysis.analyze([known[0]], trace=out)
    with open(out) as f:
        trace = json.load(f)
    evs = trace["traceEvents"]
    xs = [e for e in evs if e["ph"] == "X"]
    ms = [e for e in evs if e["ph"] == "M"]
    assert len(xs) == known[1]["events"]
    for e in xs:
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    tracks = {e["args"]["name"] for e in ms if e["name"] == "thread_name"}
    assert {t.split(" #")[0] for t in tracks} == {"CPU", "GPU stream 1", "GPU stream 2"}
    assert all(e["tid"] in {m["tid"] for m in ms if m["name"] == "thread_name"} for e in xs)
    # slices on one track must nest for Perfetto: calls that overlap in time sit on separate lanes
    by_tid = {}
    for e in xs:
        by_tid.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:]))
    assert any(e["name"] == "attention (fallback from gpu)" and "error" in e["args"] for e in xs)


def test_cli_json_and_report(tmp_path, known, capsys):
    assert main(["analyze", known[0], "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["routing"]["overall"]["judged"] > 0 and res["crossover"]
    text = analysis.report([known[0]])
    for heading in ("Per op and backend", "Crossover", "Routing", "Fallbacks by error", "Advice"):
        assert heading in text
    assert main(["analyze", str(tmp_path / "missing.jsonl")]) == 2


def test_tools_script_runs(known, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "analyze.py"), known[0], "--trace",
                        str(tmp_path / "t.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "matmul" in r.stdout and "trace written" in r.stdout and os.path.exists(tmp_path / "t.json")


def test_plots_are_written_when_matplotlib_is_present(known, tmp_path):
    pytest.importorskip("matplotlib")
    from hipsched.telemetry.plots import write_plots
    notes = write_plots(analysis.analyze([known[0]]), tmp_path)
    assert (tmp_path / "matmul.png").stat().st_size > 1000 and any("matmul.png" in n for n in notes)


def test_memory_stays_bounded_as_the_log_grows(tmp_path):
    peaks = {}
    for n in (2000, 20000):
        path = tmp_path / f"f{n}.jsonl"
        write_filler_log(path, n, run_id=f"run{n}")
        tracemalloc.start()
        res = analysis.analyze([path])
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert sum(r["count"] for r in res["ops"]) == n
    assert os.path.getsize(tmp_path / "f20000.jsonl") > 10 * peaks[20000] / 4  # the file dwarfs what is kept
    assert peaks[20000] < 1.5 * peaks[2000] + 256 * 1024


def test_trace_lanes_for_overlapping_calls_stay_few(tmp_path):
    """Two threads whose calls overlap get two lanes, with no overlap inside a lane; a log read newest
    first does not open a lane per call."""
    from hipsched.telemetry.trace import MAX_LANES, TraceWriter

    def ev(end_s, dur_us):
        whole = int(end_s)
        return {"ts": "2026-11-21T12:00:%02d.%06dZ" % (whole, round((end_s - whole) * 1e6)), "duration_us": dur_us,
                "op": "add", "backend": "cpu", "stream": None, "host": "h", "run": "r"}

    def lanes(events):
        tw = TraceWriter(tmp_path / "t.json")
        for e in events:
            tw.add(e)
        tw.close()
        with open(tmp_path / "t.json") as f:
            evs = json.load(f)["traceEvents"]
        by_tid = {}
        for e in evs:
            if e["ph"] == "X":
                by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
        return by_tid

    # thread A runs [1+0.1i, 1.08+0.1i], thread B [1.05+0.1i, 1.13+0.1i]; logged in completion order
    interleaved = []
    for i in range(25):
        interleaved += [ev(1.08 + 0.1 * i, 80_000.0), ev(1.13 + 0.1 * i, 80_000.0)]
    by_tid = lanes(interleaved)
    assert len(by_tid) == 2
    for spans in by_tid.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:]))
    reversed_log = [ev(1.0, 900_000.0)] + [ev(59 - 0.01 * k, 5_000.0) for k in range(3000)]
    assert len(lanes(reversed_log)) == 2 < MAX_LANES  # newest first: each call fits before its lane's span
