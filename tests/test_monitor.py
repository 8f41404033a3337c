"""The monitor CLI: event line format, filters, --summary, and following a file that another thread is
appending to (partial last lines, malformed lines, rotation)."""
import argparse
import os
import threading
import time


from hipsched.cli import monitor
from hipsched.telemetry import Telemetry
from hipsched.telemetry.follow import Follower
from telemetry_synth import write_known_log


def run_monitor(argv, capsys):
    p = argparse.ArgumentParser()
    monitor.add_arguments(p)
    rc = monitor.run(p.parse_args(argv))
    return rc, capsys.readouterr().out.splitlines()


def test_event_line_format():
    d = {"op": "cosine_similarity", "backend": "gpu", "stream": 1, "size": 262144, "duration_us": 812.4,
         "predicted_us": {"cpu": 9100.0, "gpu": 790.0}, "reason": "cost_model", "phase": None, "fallback": None}
    assert monitor.format_event(d).startswith("[cosine_similarity][GPU][stream=1] n=262144 | 0.81 ms (cpu est 9.1 ms)")
    d.update(backend="cpu", stream=None, duration_us=12.5, phase="search",
             fallback={"backend": "gpu", "error": "[oom] out of memory"})
    line = monitor.format_event(d)
    assert line.startswith("[cosine_similarity][CPU][search] n=262144 | 12.5 us (gpu est 0.79 ms)")
    assert line.endswith("FALLBACK from gpu: [oom] out of memory")


def test_filters_and_summary(tmp_path, capsys):
    path = tmp_path / "k.jsonl"
    write_known_log(path)
    rc, lines = run_monitor([str(path), "--op", "attention", "--backend", "cpu", "--phase", "transformer"], capsys)
    assert rc == 0 and len(lines) == 18 and all(x.startswith("[attention][CPU][transformer]") for x in lines)
    assert sum("FALLBACK" in x for x in lines) == 10
    rc, lines = run_monitor([str(path), "--summary"], capsys)
    rows = {tuple(x.split()[:3]) for x in lines}
    assert ("attention", "gpu", "52") in rows and ("attention", "cpu", "18") in rows
    assert lines[-1].startswith("0 malformed lines")
    att_cpu = next(x for x in lines if x.startswith("attention") and " cpu " in x)
    assert att_cpu.split()[-1] == "10"  # fallbacks column
    assert run_monitor([str(tmp_path / "nope.jsonl")], capsys)[0] == 2


def test_follows_a_file_being_appended_with_rotation_and_bad_lines(tmp_path):
    path = tmp_path / "live.jsonl"
    path.write_text("")
    n = 300

    def writer():
        tel = Telemetry(path=path, rotate_bytes=20000, rotate_keep=100, flush_interval=0.005)
        for i in range(n):
            tel.record("add", "gpu" if i % 2 else "cpu", "cost_model", i + 1, "float32", 12, 1.0, 2.0, 3.0)
            if i == 100:
                tel.flush()
                with open(path, "a") as f:     # a malformed line, then a line written in two pieces
                    f.write("this is not json\n")
                    f.write('{"v":1,"ts":"2026-11-21T00:00:00.000000Z","run":"m","host":"h","device":"d",')
                    f.flush()
                    time.sleep(0.3)            # the follower polls meanwhile and must hold the cut line
                    f.write('"seq":0,"op":"split","backend":"cpu","reason":"r","size":1,"dtype":"float32",'
                            '"bytes":1,"duration_us":1.0,"predicted_us":{"cpu":1,"gpu":2},"stream":null,'
                            '"phase":null,"tags":{},"fallback":null}\n')
            if i % 20 == 0:
                time.sleep(0.01)
        tel.close()

    f = Follower(path, last_lines=0, poll=0.01)
    t = threading.Thread(target=writer)
    t.start()
    got = []
    try:
        for d in f.follow(timeout=60, stop=lambda: len(got) >= n + 1):
            got.append(d)
    finally:
        t.join()
        f.close()
    sizes = [d["size"] for d in got if d["op"] == "add"]
    assert sizes == list(range(1, n + 1))  # every event once, in order, across rotations
    assert [d["op"] for d in got].count("split") == 1
    assert f.stats.malformed == 1
    assert f.rotations >= 2 and os.path.exists(f"{path}.2")


def test_tail_cli_stops_at_max_events(tmp_path, capsys):
    path = tmp_path / "k.jsonl"
    write_known_log(path)
    rc, lines = run_monitor([str(path), "--tail", "-n", "5", "--max-events", "3", "--timeout", "10"], capsys)
    assert rc == 0 and len(lines) == 3 and all(x.startswith("[attention]") for x in lines)
    rc, lines = run_monitor([str(path), "--tail", "-n", "0", "--timeout", "0.2"], capsys)
    assert rc == 0 and lines == []


def test_summary_counts_each_runs_drops_once(tmp_path, capsys):
    """A drop record read twice (two copies of a log) counts once: the highest dropped_total per run."""
    import json as _json

    from hipsched.__main__ import main as cli
    rec = {"v": 1, "ts": "2026-11-21T12:00:00.000000Z", "run": "r1", "event": "dropped", "dropped": 7,
           "dropped_total": 7}
    later = dict(rec, dropped=3, dropped_total=10)
    other = dict(rec, run="r2", dropped=2, dropped_total=2)
    log = tmp_path / "d.jsonl"
    log.write_text("".join(_json.dumps(r) + "\n" for r in (rec, rec, later, other)))
    assert cli(["monitor", str(log), "--summary"]) == 0
    assert "12 events dropped by the writer" in capsys.readouterr().out
