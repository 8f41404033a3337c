"""Review: telemetry readers, analyzer, trace, monitor and demo on edge inputs."""
import json
import os
import sys

import pytest

from hipsched.__main__ import main
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
