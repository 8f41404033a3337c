"""The JSONL writer: lines equal the in-memory events, drops are counted and reported, files rotate,
broken paths and full disks disable the writer with one warning, and exits (normal or SIGKILL) leave
parseable logs."""
import glob
import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hipsched.telemetry import Telemetry


def rec(tel, i=0, fallback=None):
    tel.record("add", "cpu", "cost_model", i + 1, "float32", 12 * (i + 1), 1.25 + i / 7, 2.0 / 3, 40.0,
               fallback=fallback)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_lines_equal_the_in_memory_events(tmp_path):
    path = tmp_path / "t.jsonl"
    with Telemetry(path=path, host="h", device="d") as tel:
        with tel.scope(phase="p", k="v\"q"):
            rec(tel, 0)
        rec(tel, 1, fallback=("gpu", "[launch] bad\nthing"))
        tel.record("top_k", "gpu", "exploring", 10, "float32", 40, 7.5, None, 3.25, stream=2)
        # NumPy scalars (sizes computed from shapes) and non-finite predictions encode as plain JSON
        tel.record("matmul", "cpu", "cost_model", np.int64(1 << 40), "float32", np.int64(96), np.float32(2.5),
                   float("inf"), float("nan"))
    assert read_jsonl(path) == tel.events
    assert tel.events[-1]["size"] == 1 << 40 and tel.events[-1]["predicted_us"] == {"cpu": None, "gpu": None}
    assert tel.path == str(path)


def test_full_queue_drops_are_counted_and_reported(tmp_path):
    path = tmp_path / "t.jsonl"
    # A writer that never wakes on its own: the queue fills deterministically.
    tel = Telemetry(path=path, queue_size=10, flush_interval=3600)
    for i in range(25):
        rec(tel, i)
    assert tel.dropped == 15
    assert tel.stats().dropped_events == 15 and tel.stats().total_operations == 25
    tel.close()
    lines = read_jsonl(path)
    events = [x for x in lines if "event" not in x]
    drops = [x for x in lines if x.get("event") == "dropped"]
    assert [e["seq"] for e in events] == list(range(10))
    assert len(drops) == 1 and drops[0]["dropped"] == 15 and drops[0]["dropped_total"] == 15


def test_files_rotate_by_size_and_keep_every_event(tmp_path):
    path = tmp_path / "t.jsonl"
    tel = Telemetry(path=path, rotate_bytes=3000, rotate_keep=50, flush_interval=3600)
    for i in range(200):
        rec(tel, i)
        if i % 4 == 3:
            tel.flush()
    tel.close()
    files = sorted(glob.glob(str(path) + "*"))
    assert len(files) > 5
    seqs = []
    for f in files:
        assert os.path.getsize(f) <= 3000
        seqs += [e["seq"] for e in read_jsonl(f)]
    assert sorted(seqs) == list(range(200))
    # path.1 is the newest rotated file, path the current one
    assert min(e["seq"] for e in read_jsonl(path)) > max(e["seq"] for e in read_jsonl(f"{path}.1"))


def test_rotation_keeps_at_most_rotate_keep_old_files(tmp_path):
    path = tmp_path / "t.jsonl"
    tel = Telemetry(path=path, rotate_bytes=1000, rotate_keep=2, flush_interval=3600)
    for i in range(100):
        rec(tel, i)
        tel.flush()
    tel.close()
    assert sorted(os.path.basename(f) for f in glob.glob(str(path) + "*")) == ["t.jsonl", "t.jsonl.1", "t.jsonl.2"]


@pytest.mark.parametrize("where", ["unwritable", "full"])
def test_broken_paths_warn_once_and_never_raise(tmp_path, caplog, where):
    if where == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    path = str(blocker / "t.jsonl") if where == "unwritable" else "/dev/full"
    with caplog.at_level(logging.WARNING, logger="hipsched.telemetry"):
        tel = Telemetry(path=path, rotate_bytes=0, flush_interval=3600)
        for i in range(5):
            rec(tel, i)
            tel.flush()
        tel.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "disabled" in warnings[0].getMessage()
    assert isinstance(tel.writer_error, OSError)
    assert tel.stats().total_operations == 5 and len(tel.events) == 5


def _child(code, path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return subprocess.Popen([sys.executable, "-c", code, str(path)], env=env)


def test_interpreter_exit_flushes_without_close(tmp_path):
    path = tmp_path / "t.jsonl"
    code = ("import sys; from hipsched.telemetry import Telemetry\n"
            "t = Telemetry(path=sys.argv[1], flush_interval=3600)\n"
            "for i in range(1000): t.record('add','cpu','cost_model',i,'float32',1,1.0,1.0,2.0)\n")
    assert _child(code, path).wait(timeout=60) == 0
    assert [e["seq"] for e in read_jsonl(path)] == list(range(1000))


def test_sigkill_mid_write_leaves_only_parseable_complete_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    code = ("import sys; from hipsched.telemetry import Telemetry\n"
            "t = Telemetry(path=sys.argv[1], flush_interval=0.001, rotate_bytes=1 << 16, rotate_keep=1000)\n"
            "i = 0\n"
            "while True:\n"
            "    t.record('cosine_similarity','gpu','cost_model',i,'float32',4*i,1.0,9.0,2.0, fallback=None)\n"
            "    i += 1\n")
    p = _child(code, path)
    try:
        deadline = time.time() + 90
        rotated = tmp_path / "t.jsonl.1"
        while time.time() < deadline and not (rotated.exists() and path.exists() and path.stat().st_size > 10_000):
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    files = glob.glob(str(path) + "*")
    assert len(files) >= 2  # it rotated at least once before dying
    n = 0
    for f in files:
        with open(f) as fh:
            data = fh.read()
        complete = data.split("\n")[:-1]  # whatever follows the last newline may be cut
        for line in complete:
            json.loads(line)
        n += len(complete)
    assert n > 1000


def test_a_new_writer_starts_after_a_cut_last_line(tmp_path):
    # A process killed mid-write leaves a fragment with no newline; the next run's first event was glued
    # onto it (one unparseable line, the event lost).
    log = tmp_path / "L"
    log.write_bytes(b'{"v":1,"op":"add"')
    env = dict(os.environ, HIPSCHED_TELEMETRY=str(log))
    subprocess.run([sys.executable, "-c", "import hipsched as hs, numpy as np; hs.add(np.ones(2), np.ones(2))"],
                   env=env, check=True, timeout=120)
    lines = log.read_bytes().split(b"\n")
    assert lines[0] == b'{"v":1,"op":"add"'
    events = [json.loads(line) for line in lines[1:] if line]
    assert any(e.get("op") == "add" for e in events)


def test_appending_to_a_complete_log_adds_no_blank_line(tmp_path):
    log = tmp_path / "L"
    for _ in range(2):
        with Telemetry(path=str(log)) as tel:
            rec(tel, 0)
    lines = log.read_text().split("\n")
    assert lines[-1] == "" and all(lines[:-1])


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_tel_writer.py): Review: the JSONL writer across fork. A child inherits the parent's writer without its thread, maybe
# with its I/O lock held and with the parent's queued events: it must neither hang at exit nor write the
# parent's events a second time.
# ----------------------------------------------------------------------------------------------------
import textwrap


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
