"""An Executor whose GPU backend runs on a given emulated runtime (tests/support/gpu_emulator.py), its
kernel cache and model files under the test's tmp_path, its model not persisted."""
from hipsched import Executor
from hipsched.backends.gpu import GpuBackend


def emulated_executor(rt, tmp_path, gpu_config=None, **executor_options):
    """`gpu_config`: more of the GPU backend's configuration (resident_bytes, say), which an Executor given
    a backend does not pass on to it."""
    gpu = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels"), **(gpu_config or {})}, runtime=rt)
    assert gpu.available, gpu.unavailable_reason
    return Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), **executor_options)
