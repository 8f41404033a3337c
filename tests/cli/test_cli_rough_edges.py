"""What a first user of the commands met: monitor and analyze with no LOG (they read $HIPSCHED_TELEMETRY,
else the last demo log, and say which), output piped into `head` (no BrokenPipeError traceback),
tools/analyze.py's usage line naming itself, and the demo's report (one per-op table, a node count as a
number, one bullet per GPU runtime)."""
import argparse
import os
import subprocess
import sys

import pytest

from telemetry_synth import write_known_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k != "HIPSCHED_TELEMETRY"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=ROOT, TMPDIR=str(tmp_path / "tmp"), **extra)
    os.makedirs(tmp_path / "tmp", exist_ok=True)
    return env


@pytest.mark.parametrize("cmd", [["-m", "hipsched", "monitor", "--summary"], ["tools/analyze.py"]])
def test_no_log_reads_the_environments_then_the_last_demo_log(tmp_path, cmd):
    env = _env(tmp_path)
    r = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no LOG given" in r.stderr and "hipsched demo" in r.stderr
    logs = tmp_path / "cache" / "hipsched" / "logs"
    logs.mkdir(parents=True)
    write_known_log(logs / "demo-20250101T000000.jsonl", run_id="old")
    write_known_log(logs / "demo-20250102T000000.jsonl", run_id="new")
    os.utime(logs / "demo-20250101T000000.jsonl", (1, 1))
    r = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"reading the last demo log, {logs / 'demo-20250102T000000.jsonl'}" in r.stderr
    assert "matmul" in r.stdout
    mine = tmp_path / "mine.jsonl"
    write_known_log(mine)
    r = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=dict(env, HIPSCHED_TELEMETRY=str(mine)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"reading $HIPSCHED_TELEMETRY, {mine}" in r.stderr


@pytest.mark.parametrize("cmd", [["-m", "hipsched", "monitor"], ["tools/analyze.py"]])
def test_piped_into_head_no_traceback(tmp_path, cmd):
    log = tmp_path / "run.jsonl"
    write_known_log(log)
    p = subprocess.Popen([sys.executable, *cmd, str(log)], cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    # the reader goes away before the first write, as `head` does once it has its lines: closing only after
    # a first line let the rest (46 KB) fit in the pipe's buffer, and the writer then never saw the break
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_analyze_script_usage_names_itself(tmp_path):
    r = subprocess.run([sys.executable, "tools/analyze.py", "--no-such-option"], cwd=ROOT, env=_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("usage: analyze.py ") and "hipsched analyze" not in r.stderr


def test_demo_report_reads_once(tmp_path, capsys):
    from hipsched.cli import demo
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    rc = demo.run(p.parse_args(["--quick", "--no-progress", "--log", str(tmp_path / "d.jsonl")]))
    out = capsys.readouterr().out
    assert (rc[0] if isinstance(rc, tuple) else rc) == 0
    # one per-op table (the analyzer's), not the in-memory summary's as well
    assert out.count("fallbacks") == 1 and "mean us" not in out
    count = next(line for line in out.splitlines() if "active nodes" in line).rsplit(":", 1)[1].strip()
    assert count.isdigit()


def test_gpu_reasons_are_one_line_per_runtime():
    from hipsched.executor import _reason_lines
    reason = ("hip-python: cannot load libamdhip64.so; is ROCm installed?; hip: hipErrorNoDevice (no device); "
              "cuda: libcuda.so.1 not found")
    assert _reason_lines(reason) == ("hip-python: cannot load libamdhip64.so; is ROCm installed?",
                                     "hip: hipErrorNoDevice (no device)", "cuda: libcuda.so.1 not found")


class _Terminal:
    """A stream that says it is a terminal, as a user's stderr does."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_is_tqdms_on_a_terminal_and_silent_elsewhere():
    import io
    from tqdm import tqdm
    from hipsched.progress import progress
    tty = _Terminal()
    bar = progress(4, "calibrating", file=tty)
    assert isinstance(bar, tqdm)
    for _ in range(4):
        bar.update(1)
    bar.set_postfix_str("scale size=64")
    bar.close()
    assert "calibrating" in tty.text and "4/4" in tty.text and "\r" in tty.text
    for stream, enabled in ((io.StringIO(), True), (_Terminal(), False)):
        bar = progress(4, "calibrating", enabled=enabled, file=stream)
        bar.update(4)
        bar.close()
        assert (stream.getvalue() if isinstance(stream, io.StringIO) else stream.text) == ""
