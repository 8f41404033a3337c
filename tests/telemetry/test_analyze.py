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
from requires import need

from hipsched.__main__ import main
from hipsched.telemetry import analysis
from hipsched.telemetry.quantiles import LogHistogram
from telemetry_synth import CROSSOVER, SIZES, write_filler_log, write_known_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    need("matplotlib")
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


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_tel_robust.py): Review: telemetry readers, analyzer, trace, monitor and demo on edge inputs.
# ----------------------------------------------------------------------------------------------------
from hipsched.telemetry import Telemetry, analysis
from hipsched.telemetry.follow import Follower


def _ev(seq, run="r1", dur=10.0, **kw):
    d = {"v": 1, "ts": "2026-11-21T12:00:00.%06dZ" % (seq + 100), "run": run, "seq": seq, "host": "h",
         "device": "cpu", "op": "add", "backend": "cpu", "reason": "cost_model", "size": 1024,
         "dtype": "float32", "bytes": 4096, "duration_us": dur, "predicted_us": {"cpu": 1.0, "gpu": None},
         "stream": None, "phase": None, "tags": {}, "fallback": None}
    d.update(kw)
    return d


def _write(path, records, raw=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in raw:
            f.write(line + "\n")


def test_unknown_service_records_are_not_counted_as_events(tmp_path):
    p = tmp_path / "a.jsonl"
    svc = {"v": 1, "ts": "2026-11-21T12:00:00.000000Z", "run": "r1", "host": "h", "device": "cpu",
           "event": "calibrated"}
    _write(p, [_ev(0), svc, _ev(1)])
    res = analysis.analyze([str(p)])
    assert [(r["op"], r["count"]) for r in res["ops"]] == [("add", 2)]
    assert res["runs"][0]["events"] == 2
    assert None not in res["reasons"]


def test_trace_skips_duplicate_events(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    recs = [_ev(i) for i in range(5)]
    _write(a, recs)
    _write(b, recs)            # a copy of the same run
    out = tmp_path / "t.json"
    res = analysis.analyze([str(a), str(b)], trace=str(out))
    assert res["duplicates_skipped"] == 5
    tr = json.load(open(out))
    assert sum(1 for e in tr["traceEvents"] if e["ph"] == "X") == 5


def test_dropped_counted_once_across_copies(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    drop = {"v": 1, "ts": "2026-11-21T12:00:01.000000Z", "run": "r1", "host": "h", "device": "cpu",
            "event": "dropped", "dropped": 7, "dropped_total": 7}
    _write(a, [_ev(0), drop])
    _write(b, [_ev(0), drop])
    res = analysis.analyze([str(a), str(b)])
    assert res["dropped_events"] == 7


@pytest.mark.parametrize("bad", ['NaN', 'Infinity', '-Infinity', '"12"', '[1]', 'true'])
def test_bad_duration_is_malformed_not_a_crash(tmp_path, bad):
    p = tmp_path / "a.jsonl"
    good = json.dumps(_ev(0))
    line = json.dumps(_ev(1)).replace('"duration_us": 10.0', '"duration_us": ' + bad)
    assert bad in line
    _write(p, [], raw=[good, line])
    res = analysis.analyze([str(p)], trace=str(tmp_path / "t.json"))
    assert res["inputs"]["malformed_lines"] == 1
    assert res["ops"][0]["count"] == 1
    json.load(open(tmp_path / "t.json"))


@pytest.mark.parametrize("field,value", [("size", "big"), ("size", None), ("fallback", "oops"),
                                         ("predicted_us", [1, 2]), ("bytes", "x"), ("tags", 3)])
def test_wrong_typed_fields_are_malformed(tmp_path, capsys, field, value):
    p = tmp_path / "a.jsonl"
    _write(p, [_ev(0), _ev(1, **{field: value})])
    res = analysis.analyze([str(p)], trace=str(tmp_path / "t.json"))
    assert res["inputs"]["malformed_lines"] == 1
    assert main(["monitor", str(p)]) == 0
    assert main(["monitor", str(p), "--summary"]) == 0
    assert main(["analyze", str(p)]) == 0


def test_bad_dropped_record_is_malformed(tmp_path):
    p = tmp_path / "a.jsonl"
    drop = {"v": 1, "ts": "2026-11-21T12:00:01.000000Z", "run": "r1", "host": "h", "device": "cpu",
            "event": "dropped", "dropped": "many", "dropped_total": "x"}
    _write(p, [_ev(0), drop])
    assert main(["monitor", str(p)]) == 0
    res = analysis.analyze([str(p)])
    assert res["dropped_events"] == 0


def test_monitor_on_directory_or_unreadable_prints_error(tmp_path, capsys):
    assert main(["monitor", str(tmp_path)]) == 2
    assert "hipsched monitor" in capsys.readouterr().err


def test_analyze_unwritable_plot_dir_prints_error(tmp_path, capsys):
    p = tmp_path / "a.jsonl"
    _write(p, [_ev(0)])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["analyze", str(p), "--plot", str(blocker / "sub")])
    cap = capsys.readouterr()
    assert rc in (0, 2)
    assert "plot" in (cap.out + cap.err).lower()


def test_follower_reads_a_file_created_after_it_started_from_the_start(tmp_path):
    p = tmp_path / "late.jsonl"
    f = Follower(str(p), last_lines=2, poll=0.01)
    assert f.poll_once() == []        # not there yet
    _write(p, [_ev(i) for i in range(20)])
    got = f.poll_once()
    f.close()
    assert [d["seq"] for d in got] == list(range(20))


def test_fallback_errors_with_addresses_fold_and_stay_bounded(tmp_path):
    p = tmp_path / "a.jsonl"
    recs = []
    for i in range(3000):
        err = f"[runtime] illegal address at 0x7f{i:08x}ab ({'abcdefgh'[i % 8]}{i}q)"
        recs.append(_ev(i, fallback={"backend": "gpu", "error": err}))
    _write(p, recs)
    an = analysis.Analyzer()
    from hipsched.telemetry.reader import iter_records
    an.feed(iter_records([str(p)]))
    assert sum(an.fallbacks.values()) == 3000
    assert len(an.fallbacks) <= 300
    keys = {k[2] for k in an.fallbacks}
    assert any("0xN" in k for k in keys)


def test_analyze_accepts_a_single_path(tmp_path):
    p = tmp_path / "a.jsonl"
    _write(p, [_ev(0), _ev(1)])
    assert analysis.analyze(str(p))["runs"][0]["events"] == 2
    assert analysis.analyze(p)["runs"][0]["events"] == 2


def test_half_precision_calls_have_their_own_rows_and_crossover():
    """A float16 call reads half the bytes: the analyzer keeps its costs apart (`op[float16]`), while
    float32 and quantized calls keep the plain op name and GPU health stays per op."""
    an = analysis.Analyzer(min_samples=1)
    recs = []
    for i, (dtype, backend, dur) in enumerate([("float32", "cpu", 10.0), ("float32", "gpu", 20.0),
                                               ("float16", "cpu", 6.0), ("float16", "gpu", 3.0),
                                               ("bfloat16", "cpu", 7.0), ("q8_0", "cpu", 5.0)]):
        recs.append({"v": 1, "run": "r", "seq": i, "ts": "2026-11-22T10:00:00.000000Z", "op": "add",
                     "backend": backend, "reason": "cost_model", "size": 4096, "dtype": dtype, "bytes": 1,
                     "duration_us": dur, "fallback": None})
    # qmatmul's dtype is its (quant type, x dtype) pair: a half x has its own rows, float32 x the op's
    for i, dtype in enumerate(["q8_0", "q8_0/float16", "q4_0/bfloat16"]):
        recs.append(dict(recs[-1], seq=10 + i, op="qmatmul", dtype=dtype))
    res = an.feed(recs).result()
    rows = {(r["op"], r["backend"]): r["count"] for r in res["ops"]}
    assert rows == {("add", "cpu"): 2, ("add", "gpu"): 1, ("add[float16]", "cpu"): 1, ("add[float16]", "gpu"): 1,
                    ("add[bfloat16]", "cpu"): 1, ("qmatmul", "cpu"): 1, ("qmatmul[float16]", "cpu"): 1,
                    ("qmatmul[bfloat16]", "cpu"): 1}
    speed = {r["op"]: r["speedup"] for r in res["speedup"]}
    assert speed["add"] < 1 < speed["add[float16]"]
    assert [h["op"] for h in res["gpu_health"]] == ["add"]


def _split_ev(seq, dur, cpu_us, gpu_us, share=0.5, rows=1000, balance=None):
    cut = rows - int(share * rows)
    if balance is None:
        balance = (rows / (cut / cpu_us + (rows - cut) / gpu_us)) / dur
    return _ev(seq, op="top_k", backend="split", reason="split", size=1 << 20, dur=dur,
               split={"shares": {"cpu": 1 - share, "gpu": share},
                      "parts": [{"backend": "cpu", "rows": [0, cut], "duration_us": cpu_us},
                                {"backend": "gpu", "rows": [cut, rows], "duration_us": gpu_us}],
                      "predicted_us": dur, "balance": balance})


def test_split_calls_are_tabulated_judged_and_traced(tmp_path):
    """Splits get their own table (calls, GPU share, balance); routing counts a split right when it beats
    the faster side's median; the trace puts each part on its backend's track, from the call's start."""
    recs = [_ev(i, op="top_k", size=1 << 20, dur=1000.0, reason="exploring") for i in range(3)]        # CPU alone
    recs += [_ev(10 + i, op="top_k", backend="gpu", size=1 << 20, dur=800.0, reason="exploring") for i in range(3)]
    recs += [_split_ev(20 + i, 480.0, 470.0, 460.0) for i in range(4)]                                 # better
    recs += [_split_ev(30, 3000.0, 2990.0, 400.0, balance=0.3)]
    path = tmp_path / "s.jsonl"
    _write(path, recs)
    trace = tmp_path / "t.json"
    res = analysis.analyze([str(path)], trace=str(trace))
    (row,) = res["splits"]
    assert row["op"] == "top_k" and row["calls"] == 5 and row["mean_gpu_share"] == pytest.approx(0.5)
    assert row["min_balance"] == pytest.approx(0.3) and 0.3 < row["mean_balance"] < 1.0
    ro = {r["op"]: r for r in res["routing"]["per_op"]}["top_k"]
    # 5 cost-model decisions, all splits; the bucket's split median (480 us) beats the GPU's 800 us
    assert ro["judged"] == 5 and ro["correct"] == 5
    # regret, as for either side: the splits' time beyond what the faster side's median would have taken
    assert ro["regret_us"] == pytest.approx(4 * 480.0 + 3000.0 - 5 * 800.0)
    from hipsched.telemetry.report import render
    assert "Split calls" in render(res)
    evs = json.load(open(trace))["traceEvents"]
    tracks = {m["tid"]: m["args"]["name"] for m in evs if m["name"] == "thread_name"}
    parts = [e for e in evs if e["ph"] == "X" and "split_of" in e["args"]]
    assert len(parts) == 10
    split = next(e for e in evs if e["ph"] == "X" and e["cat"] == "split" and e["args"]["seq"] == 30)
    mine = [e for e in parts if e["args"]["split_of"] == 30]
    assert {tracks[e["tid"]].split(" #")[0] for e in mine} == {"CPU", "GPU"}
    assert all(e["ts"] == split["ts"] for e in mine) and split["args"]["balance"] == 0.3
