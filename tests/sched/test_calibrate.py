"""Calibration: the sweep feeds both sides of the model and saves it; the CLI command works end to end."""
import os
import subprocess
import sys

import pytest
from requires import need

from hipsched import Executor

from fake_gpu import FakeGpuBackend


def test_calibrate_measures_both_sides_and_saves(tmp_path):
    gpu = FakeGpuBackend()
    ex = Executor(gpu_backend=gpu, cache_dir=str(tmp_path), telemetry_path=None)
    table = ex.calibrate(ops=["scale", "softmax"], progress=False, repeats=2)
    assert set(table) == {"scale", "softmax"}
    for op in table:
        sizes = [row[0] for row in table[op]]
        assert sizes == sorted(sizes) and len(sizes) >= 5
        assert all(c is not None and g is not None for _, c, g in table[op])
        cpu_buckets = ex.performance_tracker.samples(op, "cpu")
        gpu_buckets = ex.performance_tracker.samples(op, "gpu")
        assert len(cpu_buckets) == len(gpu_buckets) == len(sizes)
    assert gpu.ok_runs == 2 * (len(table["scale"]) + len(table["softmax"]))
    assert list(tmp_path.glob("model-*.json"))
    assert {e["phase"] for e in ex.events} == {"calibrate"}
    with pytest.raises(ValueError, match="unknown op"):
        ex.calibrate(ops=["nope"], progress=False)
    ex.close()


def test_calibrate_command(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    r = subprocess.run([sys.executable, "-m", "hipsched", "calibrate", "--ops", "scale", "--repeats", "1",
                        "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "scale" in r.stdout and "model saved:" in r.stdout
    assert list((tmp_path / "hipsched").glob("model-*.json"))
    bad = subprocess.run([sys.executable, "-m", "hipsched", "calibrate", "--ops", "nope", "--no-progress"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown op" in bad.stderr


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_sched_calibrate.py): Review: calibration must not report a CPU fallback's time as the GPU's.
# ----------------------------------------------------------------------------------------------------
def test_gpu_column_is_none_when_every_gpu_run_fell_back():
    gpu = FakeGpuBackend(ops=("add",), fail=lambda call: "launch")
    ex = Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None, breaker_failures=1000,
                  health_min_samples=100, gpu_success_rate_threshold=0.0)
    table = ex.calibrate(ops=["add"], progress=False, repeats=1)
    rows = table["add"]
    assert rows and all(c is not None for _, c, _ in rows)
    assert all(g is None for _, _, g in rows), rows
    ex.close()


def test_gpu_column_kept_when_gpu_works():
    gpu = FakeGpuBackend(ops=("add",))
    ex = Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None)
    table = ex.calibrate(ops=["add"], progress=False, repeats=1)
    assert all(g is not None for _, _, g in table["add"])
    ex.close()


def test_half_dtypes_are_swept_under_their_own_name_and_model_slot():
    """dtypes=... sweeps each op's half dtypes as arrays of that dtype (the model keys by dtype); a GPU
    without the dtype gets no GPU column (a forced run would have run on the CPU)."""
    need("ml_dtypes")
    gpu = FakeGpuBackend(dtypes=("float32",))
    ex = Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None)
    table = ex.calibrate(ops=["scale"], progress=False, repeats=1, dtypes=("float32", "float16", "bfloat16"))
    assert set(table) == {"scale", "scale[float16]", "scale[bfloat16]"}
    assert all(g is not None for _, _, g in table["scale"])
    for name, dtype in (("scale[float16]", "float16"), ("scale[bfloat16]", "bfloat16")):
        assert table[name] and all(c is not None and g is None for _, c, g in table[name])
        assert {e["dtype"] for e in ex.events if e["op"] == "scale"} >= {dtype}
        assert len(ex.performance_tracker.samples("scale", "cpu", dtype=dtype)) == len(table[name])
    with pytest.raises(ValueError, match="dtypes must be"):
        ex.calibrate(ops=["scale"], progress=False, dtypes=("float64",))
    ex.close()


def test_calibrate_command_tells_the_quantization_types_apart(tmp_path):
    """`calibrate --ops qmatmul` printed each size twice (one row per quantization type) with nothing to
    tell them apart: each type has its own rows, with a dtype column."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    r = subprocess.run([sys.executable, "-m", "hipsched", "calibrate", "--ops", "dequantize", "--repeats", "1",
                        "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["op", "dtype", "size"]
    rows = [tuple(line.split()[:3]) for line in lines[1:] if line.startswith("dequantize ")]
    assert {d for _, d, _ in rows} == {"q8_0", "q4_0"}
    assert len(rows) == len(set(rows)) and len(rows) >= 8
