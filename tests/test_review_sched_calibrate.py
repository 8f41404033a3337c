"""Review: calibration must not report a CPU fallback's time as the GPU's."""
from hipsched import Executor

from fake_gpu import FakeGpuBackend


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
