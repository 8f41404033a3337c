"""select_backend answers as a real call would: a call below gpu_min_batch_size is `below_min_batch`,
never `memory_constraint`, since a real call that small never queries device memory."""
from hipsched import Executor
from hipsched.scheduling import SelectionReason

from fake_gpu import FakeGpuBackend


def test_small_call_is_below_min_batch_even_when_memory_is_short():
    gpu = FakeGpuBackend(ops=("add",), free_memory=1000)
    with Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None, gpu_min_batch_size=64) as ex:
        small = ex.select_backend("add", size=8, nbytes=10_000)
        assert small.backend_id == "cpu" and small.reason == SelectionReason.BELOW_MIN_BATCH
        big = ex.select_backend("add", size=1 << 20, nbytes=10_000)
        assert big.backend_id == "cpu" and big.reason == SelectionReason.MEMORY_CONSTRAINT
