"""The device memory pool: what a call allocates for a stream comes from the device's stream-ordered
pool (cuMemAllocAsync), which is told to keep freed memory for reuse (HIPSCHED_GPU_POOL_KEEP); an
allocation it cannot serve hands the cache back and tries once more; a driver or device without pools,
and memory made for no stream, get the synchronous malloc.

The driver is tests/support/fake_cuda_driver.py with pools=True under the real ctypes binding: freed
memory stays in its pool until trimmed, and memory in use plus the cache is bounded by device_bytes."""
import gc

import numpy as np
import pytest

from hipsched.errors import GpuError
from hipsched.gpu.memory.device_array import DeviceArray, to_device
from hipsched.gpu.bindings.runtime import pool_keep_bytes

from fake_cuda_driver import FakeCudaDriver, install

GIB = 1 << 30


def _runtime(monkeypatch, **driver_options):
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    driver = install(monkeypatch, FakeCudaDriver(version=13000, devices=1, **driver_options))
    return CtypesRuntime("cuda"), driver


def test_a_freed_result_is_reused_from_the_pool_without_malloc(monkeypatch):
    monkeypatch.delenv("HIPSCHED_GPU_POOL_KEEP", raising=False)
    rt, driver = _runtime(monkeypatch, pools=True)
    a = DeviceArray.empty((1024,), np.float32, runtime=rt, stream=0)
    first = a.ptr
    del a
    gc.collect()
    b = DeviceArray.empty((512,), np.float32, runtime=rt, stream=0)
    assert b.ptr == first                               # the pool's cached block, not a new one
    assert driver.calls.count("cuMemAllocAsync") == 2 and "cuMemAlloc_v2" not in driver.calls
    assert "cuMemFreeAsync" in driver.calls             # freed in stream order, into the pool
    assert driver.pool_threshold == {0: 16 * GIB // 4}  # a quarter of the fake's 16 GiB by default


def test_memory_made_for_no_stream_uses_malloc(monkeypatch):
    rt, driver = _runtime(monkeypatch, pools=True)
    DeviceArray.empty((16,), np.float32, runtime=rt, stream=None)
    assert driver.calls.count("cuMemAlloc_v2") == 1 and "cuMemAllocAsync" not in driver.calls


def test_a_driver_without_pools_gets_malloc(monkeypatch):
    rt, driver = _runtime(monkeypatch, pools=False)
    x = to_device(np.arange(8, dtype=np.float32), runtime=rt)
    assert np.array_equal(x.get(), np.arange(8, dtype=np.float32))
    assert "cuMemAlloc_v2" in driver.calls and "cuMemAllocAsync" not in driver.calls


def test_pool_copies_round_trip(monkeypatch):
    rt, _ = _runtime(monkeypatch, pools=True)
    host = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert np.array_equal(to_device(host, runtime=rt).get(), host)


def test_an_allocation_the_pool_cannot_serve_trims_the_cache_once_then_succeeds(monkeypatch):
    rt, driver = _runtime(monkeypatch, pools=True, device_bytes=1 << 20)
    a = DeviceArray.empty((600 << 10,), np.uint8, runtime=rt, stream=0)
    del a
    gc.collect()                                        # 600 KiB now cached by the pool
    calls_before = len(driver.calls)
    b = DeviceArray.empty((700 << 10,), np.uint8, runtime=rt, stream=0)   # cache + 700 KiB > 1 MiB
    assert b.ptr and driver.trims == 1
    tail = [c for c in driver.calls[calls_before:] if c.startswith(("cuMem", "cuCtxSynchronize"))]
    # the failed try, the device's queued frees, the trim, the second try
    assert tail == ["cuMemAllocAsync", "cuCtxSynchronize", "cuMemPoolTrimTo", "cuMemAllocAsync"]


def test_an_allocation_larger_than_the_device_is_oom_after_one_trim(monkeypatch):
    rt, driver = _runtime(monkeypatch, pools=True, device_bytes=1 << 20)
    with pytest.raises(GpuError) as e:
        DeviceArray.empty((2 << 20,), np.uint8, runtime=rt, stream=0)
    assert e.value.kind == "oom" and "cuMemAllocAsync" in str(e.value) and driver.trims == 1


@pytest.mark.parametrize("value, expected", [("all", (1 << 64) - 1), ("0", 0), ("123456", 123456),
                                             ("2e9", 2_000_000_000), (" ALL ", (1 << 64) - 1)])
def test_pool_keep_setting(monkeypatch, value, expected):
    monkeypatch.setenv("HIPSCHED_GPU_POOL_KEEP", value)
    assert pool_keep_bytes(16 * GIB) == expected


@pytest.mark.parametrize("value", ["-1", "lots", "1.5.2", "0x10"])
def test_a_malformed_pool_keep_setting_is_an_error_naming_it(monkeypatch, value):
    monkeypatch.setenv("HIPSCHED_GPU_POOL_KEEP", value)
    with pytest.raises(ValueError, match="HIPSCHED_GPU_POOL_KEEP"):
        pool_keep_bytes(16 * GIB)


def test_the_pool_keep_setting_reaches_the_driver(monkeypatch):
    monkeypatch.setenv("HIPSCHED_GPU_POOL_KEEP", "all")
    rt, driver = _runtime(monkeypatch, pools=True)
    DeviceArray.empty((4,), np.float32, runtime=rt, stream=0)
    assert driver.pool_threshold == {0: (1 << 64) - 1}
