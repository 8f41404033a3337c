"""An Executor whose GPU backend runs on a given emulated runtime (tests/support/gpu_emulator.py), its
kernel cache and model files under the test's tmp_path, its model not persisted."""
from hipsched import Executor
from hipsched.backends.gpu import GpuBackend


def emulated_executor(rt, tmp_path, **executor_options):
    gpu = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt)
    assert gpu.available, gpu.unavailable_reason
    return Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), **executor_options)
