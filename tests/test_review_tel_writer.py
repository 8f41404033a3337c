"""Review: the JSONL writer across fork. A child inherits the parent's writer without its thread, maybe
with its I/O lock held and with the parent's queued events: it must neither hang at exit nor write the
parent's events a second time."""
import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, sys
    from hipsched.telemetry import Telemetry
    path = sys.argv[1]
    tel = Telemetry(path=path, flush_interval=3600, run_id="parent")
    for i in range(5):
        tel.record("add", "cpu", "cost_model", 10, "float32", 40, 1.0, 1.0, 1.0)
    w = tel._writer
    hold = sys.argv[2] == "hold"
    if hold:
        w._io_lock.acquire()        # as if the writer thread were mid-flush at the fork
    pid = os.fork()
    if pid == 0:
        tel.record("add", "cpu", "cost_model", 10, "float32", 40, 1.0, 1.0, 1.0)
        tel.flush()
        sys.exit(0)                 # normal exit: atexit runs
    if hold:
        w._io_lock.release()
    _, status = os.waitpid(pid, 0)
    tel.close()
    print("child", os.WEXITSTATUS(status))
""")


@pytest.mark.parametrize("mode", ["free", "hold"])
def test_forked_child_neither_hangs_nor_duplicates(tmp_path, mode):
    script = tmp_path / "f.py"
    script.write_text(SCRIPT)
    log = tmp_path / "l.jsonl"
    r = subprocess.run([sys.executable, str(script), str(log), mode], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and "child 0" in r.stdout, r.stdout + r.stderr
    seqs = [json.loads(line)["seq"] for line in log.read_text().splitlines()]
    assert sorted(seqs) == list(range(5)), seqs


def test_rotation_after_the_live_log_was_deleted_keeps_writing(tmp_path):
    import os

    from hipsched.telemetry import Telemetry
    p = tmp_path / "l.jsonl"
    tel = Telemetry(path=str(p), flush_interval=3600, rotate_bytes=2000, run_id="R")
    rec = ("add", "cpu", "cost_model", 10, "float32", 40, 1.0, 1.0, 1.0)
    for _ in range(5):
        tel.record(*rec)
    tel.flush()
    os.unlink(p)                     # someone removed the live log
    for _ in range(3):
        for _ in range(10):
            tel.record(*rec)
        tel.flush()                  # a batch that does not fit forces a rotation
    assert tel.writer_error is None
    tel.close()
    assert p.exists() and p.read_text().count("\n") > 0
