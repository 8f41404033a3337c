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
from requires import missing_tool


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


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_tel_cli.py): Review: CLI commands on bad arguments print a clear error and a non-zero status.
# ----------------------------------------------------------------------------------------------------
import pytest

from hipsched.__main__ import main


def test_compile_into_an_unwritable_cache_dir_fails(tmp_path, capsys):
    from hipsched.errors import GpuError
    from hipsched.gpu.bindings.compilers import get_compiler
    try:
        c = get_compiler("gfx90a")
        if not c.supports("gfx90a"):
            missing_tool("a compiler for gfx90a (hiprtc)", "Debian: apt-get install libamdhip64-dev")
    except GpuError:
        missing_tool("a compiler for gfx90a (hiprtc)", "Debian: apt-get install libamdhip64-dev")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["compile", "--arch", "gfx90a", "--cache-dir", str(blocker / "cache")]) == 1
    assert "cannot write the kernel cache" in capsys.readouterr().err


def test_bench_with_a_wrong_bench_dir_fails(tmp_path, capsys):
    assert main(["bench", "--bench-dir", str(tmp_path / "nope"), "telemetry"]) == 2
    assert "bench" in capsys.readouterr().err


def test_analyze_rejects_a_zero_bandwidth(tmp_path, capsys):
    import json
    p = tmp_path / "a.jsonl"
    rec = {"v": 1, "ts": "2026-11-21T12:00:00.000100Z", "run": "r", "seq": 0, "host": "h", "device": "d",
           "op": "add", "backend": "gpu", "reason": "cost_model", "size": 1024, "dtype": "float32", "bytes": 4096,
           "duration_us": 10.5, "predicted_us": {"cpu": 1.0, "gpu": None}, "stream": None, "phase": None,
           "tags": {}, "fallback": None}
    p.write_text(json.dumps(rec) + "\n")
    for bad in ("0", "-3", "nan"):
        with pytest.raises(SystemExit) as e:
            main(["analyze", str(p), "--pcie-gbps", bad])
        assert e.value.code == 2
    assert "positive" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_tel_demo.py): Review: the demo when the cache dir or the --log path cannot be written (workload stubbed out).
# ----------------------------------------------------------------------------------------------------
from hipsched.cli import demo


class _Tiny:
    def __init__(self, ex, quick, seed):
        import numpy as np
        self.ex, self.checks = ex, []
        self.x = np.ones(64, np.float32)

    def search_steps(self):
        yield "add", lambda: self.ex.add(self.x, self.x)

    def transformer_steps(self):
        return iter(())

    def graph_steps(self):
        return iter(())


def test_default_log_falls_back_when_cache_dir_is_not_writable(tmp_path, monkeypatch):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    log = demo._default_log()
    assert log.startswith(str(tmp_path / "tmp"))


def test_demo_with_unwritable_log_path_does_not_crash(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["demo", "--quick", "--no-progress", "--log", str(blocker / "run.jsonl")]) == 0
    assert "could not be written" in capsys.readouterr().out


def test_demo_stubbed_workload_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    log = tmp_path / "run.jsonl"
    assert main(["demo", "--quick", "--no-progress", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "Per op and backend" in out and "add" in out


def test_demo_negative_seed_is_an_argument_error(monkeypatch, capsys):
    import pytest
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    with pytest.raises(SystemExit) as e:
        main(["demo", "--quick", "--seed", "-1"])
    assert e.value.code == 2 and "seed" in capsys.readouterr().err


def test_demo_writes_where_the_environment_says(tmp_path, monkeypatch, capsys):
    # HIPSCHED_TELEMETRY was ignored: the demo always made its own file under the cache dir
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    env_log = tmp_path / "env.jsonl"
    monkeypatch.setenv("HIPSCHED_TELEMETRY", str(env_log))
    assert main(["demo", "--quick", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert env_log.is_file() and env_log.stat().st_size > 0
    assert f"telemetry -> {env_log}" in out


def test_demo_log_argument_wins_over_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    env_log, arg_log = tmp_path / "env.jsonl", tmp_path / "arg.jsonl"
    monkeypatch.setenv("HIPSCHED_TELEMETRY", str(env_log))
    assert main(["demo", "--quick", "--no-progress", "--log", str(arg_log)]) == 0
    assert arg_log.is_file() and not env_log.exists()
    assert f"telemetry -> {arg_log}" in capsys.readouterr().out
