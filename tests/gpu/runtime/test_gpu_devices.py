"""Two devices in one process: each GPU backend owns its device. A second backend on another device
must not retarget the first one's work (the device, or CUDA context, is current per thread and the
binding makes its own current before every call, whoever changed it since), and an array that lives
on another device than the backend's is refused with an error naming both (its pointers mean nothing
in this device's context: CUDA_ERROR_ILLEGAL_ADDRESS, which kills the context).

The driver is tests/support/fake_cuda_driver.py (two devices) under the real ctypes binding: it keeps the
current context per thread, and a launch with another device's pointer is ILLEGAL_ADDRESS."""
import ctypes
import threading

import numpy as np
import pytest

import hipsched
from hipsched.backends.gpu import GpuBackend
from hipsched.errors import GpuError
from hipsched.gpu.bindings import detect
from hipsched.gpu.memory import dlpack
from hipsched.gpu.memory.device_array import DeviceArray, to_device

from fake_cuda_driver import FakeCudaDriver, fake_nvrtc, install


@pytest.fixture
def two(monkeypatch, tmp_path):
    """(runtime, driver, backend on GPU 0, backend on GPU 1, executor of each), the second created
    after the first, as a user adding a second Executor would."""
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    driver = install(monkeypatch, FakeCudaDriver(version=13000, devices=2))
    rt = CtypesRuntime("cuda")
    rt._compiler = fake_nvrtc(13, 0)
    monkeypatch.setattr(detect, "get_runtime", lambda: rt)   # what from_external wraps foreign arrays with
    backends, executors = [], []
    for device in (0, 1):
        b = GpuBackend({"gpu_device_id": device, "kernel_cache_dir": str(tmp_path)}, runtime=rt)
        assert b.available, b.unavailable_reason
        backends.append(b)
        executors.append(hipsched.Executor(gpu_backend=b, strategy="gpu_preferred", gpu_min_batch_size=1,
                                           allow_fallback=False, telemetry_enabled=False))
    yield rt, driver, backends, executors
    for ex in executors:
        ex.close()


def _launches_of(driver, fn):
    before = len(driver.launches)
    fn()
    return {device for device, _ in driver.launches[before:]}


def test_second_backend_does_not_retarget_the_first(two):
    rt, driver, (b0, b1), (ex0, ex1) = two
    x = np.arange(1024, dtype=np.float32)
    d0, d1 = to_device(x, runtime=b0._ctx.rt), to_device(x, runtime=b1._ctx.rt)
    assert driver.device_of(d0.ptr) == 0 and driver.device_of(d1.ptr) == 1
    assert _launches_of(driver, lambda: ex0.add(d0, d0, backend="gpu")) == {0}
    assert _launches_of(driver, lambda: ex1.add(d1, d1, backend="gpu")) == {1}
    assert _launches_of(driver, lambda: ex0.add(d0, d0, backend="gpu")) == {0}
    # another library on this thread (PyTorch on GPU 1, say) makes its context current in between
    driver.cuCtxSetCurrent(ctypes.c_void_p(driver.ctx_of(1)))
    assert _launches_of(driver, lambda: ex0.scale(d0, 2.0, backend="gpu")) == {0}
    assert rt.current_device() == 0 and not driver.dead


def test_two_backends_on_two_threads(two):
    rt, driver, backends, executors = two
    x = np.arange(512, dtype=np.float32)
    errors, barrier = [], threading.Barrier(2)

    def work(device):
        try:
            d = to_device(x, runtime=backends[device]._ctx.rt)
            barrier.wait()
            for _ in range(20):
                executors[device].add(d, d, backend="gpu")
                executors[device].scale(d, 3.0, backend="gpu")
        except Exception as e:   # reported below, with the device
            errors.append((device, e))
    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not driver.dead
    per_device = [sum(1 for dev, _ in driver.launches if dev == i) for i in (0, 1)]
    assert per_device[0] == per_device[1] >= 40


def test_array_on_another_device_is_refused_naming_both(two):
    rt, driver, (b0, b1), (ex0, ex1) = two
    x = np.arange(256, dtype=np.float32)
    d1 = to_device(x, runtime=b1._ctx.rt)
    before = len(driver.launches)
    with pytest.raises(GpuError) as info:
        ex0.add(d1, d1, backend="gpu")
    e = info.value
    assert e.kind == "unsupported" and e.name == "wrong-device"
    assert "GPU 1" in str(e) and "GPU 0" in str(e) and "gpu_device_id=1" in str(e)
    assert len(driver.launches) == before and not driver.dead


class Cai:
    """A foreign array exposing only __cuda_array_interface__ (no device id in it, as CAI has none)."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


class DlpackOnly:
    """A foreign array exposing only DLPack."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, stream=None, **kwargs):
        return self._arr.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_foreign_arrays_know_their_device(two):
    rt, driver, (b0, b1), (ex0, ex1) = two
    x = np.arange(64, dtype=np.float32)
    on1 = to_device(x, runtime=b1._ctx.rt)
    cai = DeviceArray.from_external(Cai(on1.ptr, 64))        # the pointer's device comes from the driver
    assert cai.device == (dlpack.kDLCUDA, 1) and cai.runtime.current_device() == 1
    np.testing.assert_array_equal(cai.get(), x)              # copied in its own device's context
    dl = DeviceArray.from_external(DlpackOnly(on1))
    assert dl.device == (dlpack.kDLCUDA, 1) and dl.runtime.current_device() == 1
    on0 = to_device(x, runtime=b0._ctx.rt)
    assert DeviceArray.from_external(Cai(on0.ptr, 64)).device == (dlpack.kDLCUDA, 0)
    for foreign in (Cai(on1.ptr, 64), DlpackOnly(on1)):
        with pytest.raises(GpuError) as info:
            ex0.add(foreign, foreign, backend="gpu")
        assert info.value.name == "wrong-device" and "GPU 1" in str(info.value) and "GPU 0" in str(info.value)
    assert not driver.dead


def test_with_fallback_an_array_on_another_device_is_computed_on_the_cpu_where_it_lives(two):
    rt, driver, (b0, b1), _ = two
    ex = hipsched.Executor(gpu_backend=b0, strategy="gpu_preferred", gpu_min_batch_size=1, telemetry_enabled=True)
    x = np.arange(128, dtype=np.float32)
    on1 = to_device(x, runtime=b1._ctx.rt)
    foreign = Cai(on1.ptr, 128)
    out = ex.add(foreign, foreign)
    assert out.device == (dlpack.kDLCUDA, 1) and driver.device_of(out.ptr) == 1
    np.testing.assert_array_equal(out.get(), x + x)
    (event,) = ex.events
    assert event["backend"] == "cpu" and "GPU 1" in event["fallback"]["error"]
    assert not driver.dead
    ex.close()


def test_hip_python_views_make_their_own_device_current(monkeypatch):
    from hipsched.gpu.bindings import hip_python

    class FakeHip:
        def __init__(self):
            self.tls, self.mallocs = threading.local(), []

        def hipGetDeviceCount(self):
            return (0, 2)

        def hipGetDevice(self):
            return (0, getattr(self.tls, "device", 0))

        def hipSetDevice(self, index):
            self.tls.device = index
            return (0,)

        def hipMalloc(self, nbytes):
            self.mallocs.append(getattr(self.tls, "device", 0))
            return (0, 4096)

    fake = FakeHip()
    monkeypatch.setattr(hip_python, "_import_hip", lambda: fake)
    r0 = hip_python.HipPythonRuntime()
    r1 = r0.for_device(1)
    r0.malloc(8), r1.malloc(8), r0.malloc(8)
    fake.hipSetDevice(1)                       # someone else on this thread
    r0.malloc(8)
    assert fake.mallocs == [0, 1, 0, 0] and r0.current_device() == 0 and r1.current_device() == 1
