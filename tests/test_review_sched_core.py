"""Review: the scheduler core's bucket index and samples for sizes/durations that are not finite."""
import math
import subprocess
import sys
import textwrap

import pytest

from hipsched import _sched


def _run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("size", ["float('inf')", "float('nan')", "1e300"])
def test_non_finite_size_stays_in_bounds(size):
    # bucket_of(inf/nan) cast log2 to int (INT_MIN on x86): a write far outside the bucket array
    r = _run(f"""
        from hipsched import _sched
        c = _sched.SchedCore(window=4)
        s = c.slot("add", "float32")
        for _ in range(50):
            c.record(s, 0, {size}, 10.0)
            c.record(s, 1, {size}, 10.0)
        c.decide(s, {size}, flags=_sched.F_GPU_PRESENT | _sched.F_GPU_SUPPORTS | _sched.F_FITS)
        print("ok", [b[0] for b in c.buckets(s, 0)])
        """)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_infinite_duration_is_not_learned():
    c = _sched.SchedCore(window=8)
    s = c.slot("add", "float32")
    for _ in range(3):
        c.record(s, 0, 1000, 10.0)
    c.record(s, 0, 1000, float("inf"))
    c.record(s, 0, 1000, float("inf"))
    c.record(s, 0, 1000, float("inf"))
    c.record(s, 0, 1000, float("inf"))
    assert all(math.isfinite(b[3]) for b in c.buckets(s, 0))
    assert math.isfinite(c.predict(s, 0, 1000))
    # counts still count the call
    assert c.counters()["total_operations"] == 7


def test_import_rejects_non_finite_samples():
    c = _sched.SchedCore(window=8)
    with pytest.raises(ValueError):
        c.import_samples({("add", "float32"): [[(1000.0, float("inf"))], []]})


def test_set_transfer_rejects_nan():
    c = _sched.SchedCore()
    with pytest.raises(ValueError):
        c.set_transfer(float("nan"), 12.0, 10.0, 12.0)
    with pytest.raises(ValueError):
        c.set_transfer(10.0, float("nan"), 10.0, 12.0)
