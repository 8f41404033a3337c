"""An executor with two emulated GPUs (tests/support/gpu_emulator.py, EmuRuntime(devices=2)) given device
arrays that live on its second device: the call runs there, through that device's own backend, and its
result stays there; a failed run there reruns on the CPU, with that device's health (not the first's)
taking the failure; an executor with one GPU still takes such a call to the CPU, as before."""
import numpy as np
import pytest

import gpu_emulator
from hipsched import Executor
from hipsched.backends.gpu import GpuBackend
from hipsched.faults import FaultInjectingBackend
from hipsched.gpu.memory.device_array import DeviceArray, to_device

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

N = 4096


@pytest.fixture(scope="module")
def rt2():
    runtime = gpu_emulator.EmuRuntime(32, devices=2)
    yield runtime
    runtime.close()


def _backends(rt2, tmp_path):
    first = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt2)
    second = first.for_device(1)
    assert first.available and second.available, (first.unavailable_reason, second.unavailable_reason)
    assert (first.device_index, second.device_index) == (0, 1)
    return first, second


def _executor(gpus, tmp_path, **overrides):
    overrides.setdefault("gpu_min_batch_size", 1)
    return Executor(gpu_backend=gpus, persist_model=False, cache_dir=str(tmp_path), **overrides)


def _count_cpu_device_runs(ex, monkeypatch):
    """A list that grows by one for every CPU run of device data (a download, a CPU kernel, an upload)."""
    runs, real = [], ex._cpu.run_device_data

    def counted(call):
        runs.append(call.op)
        return real(call)
    monkeypatch.setattr(ex._cpu, "run_device_data", counted)
    return runs


def _data(rt2, second):
    rng = np.random.default_rng(31)
    a, b = rng.standard_normal((2, N), dtype=np.float32)
    return a, b, to_device(a, runtime=second._ctx.rt), to_device(b, runtime=second._ctx.rt)


def test_a_call_on_the_second_devices_arrays_runs_on_that_device(rt2, tmp_path, monkeypatch):
    first, second = _backends(rt2, tmp_path)
    a, b, a1, b1 = _data(rt2, second)
    assert a1.device[1] == 1
    with _executor([first, second], tmp_path) as ex:
        cpu_runs = _count_cpu_device_runs(ex, monkeypatch)
        assert ex.select_backend("add", args=(a1, b1)).backend == "gpu"
        for _ in range(3):   # the first call and the ones after it (the compiled path takes none of them)
            out = ex.add(a1, b1)
            assert isinstance(out, DeviceArray) and out.device == a1.device
            np.testing.assert_array_equal(out.get(), a + b)
            ev = ex.events[-1]
            assert (ev["backend"], ev["gpu_device"], ev["fallback"]) == ("gpu", 1, None), ev
        assert cpu_runs == []                                        # nothing went down to the host
        second_core = ex._fast.splitter.others[0].core               # the device's own, shared with splits
        assert second_core.health("add")["successes"] == 3
        assert ex.gpu_health("add")["successes"] == 0                # the first device ran nothing
        assert ex.stats().gpu_operations == 3
        # the executor's own device: unchanged, its events name no device
        a0 = to_device(a, runtime=first._ctx.rt)
        out = ex.add(a0, a0)
        assert out.device == a0.device and "gpu_device" not in ex.events[-1]
        np.testing.assert_array_equal(out.get(), a + a)
        # backend="cpu" still means the CPU, which copies the data down and the result back to device 1
        out = ex.add(a1, b1, backend="cpu")
        assert ex.events[-1]["backend"] == "cpu" and out.device == a1.device and cpu_runs == ["add"]
        np.testing.assert_array_equal(out.get(), a + b)


def test_a_failing_run_on_the_second_device_reruns_on_the_cpu_exactly(rt2, tmp_path, monkeypatch):
    first, second = _backends(rt2, tmp_path)
    a, b, a1, b1 = _data(rt2, second)
    with _executor([first, FaultInjectingBackend(second, "launch=1.0,seed=5")], tmp_path) as ex:
        cpu_runs = _count_cpu_device_runs(ex, monkeypatch)
        out = ex.add(a1, b1)
        ev = ex.events[-1]
        assert (ev["backend"], ev["reason"]) == ("cpu", "cpu_fallback") and "gpu_device" not in ev
        assert ev["fallback"]["backend"] == "gpu" and ev["fallback"]["error"].startswith("gpu:1: "), ev
        assert cpu_runs == ["add"] and out.device == a1.device
        np.testing.assert_array_equal(out.get(), ex.add(a, b, backend="cpu"))   # the CPU's own answer
        assert ex._fast.splitter.others[0].core.health("add")["failures"] == 1
        assert ex.gpu_health("add")["failures"] == 0
    first, second = _backends(rt2, tmp_path)   # (the executor closed its backends)
    with _executor([first, FaultInjectingBackend(second, "launch=1.0,seed=5")], tmp_path,
                   allow_fallback=False) as ex:
        with pytest.raises(Exception, match="hipErrorLaunchFailure|launch"):
            ex.add(a1, b1)


def test_with_one_gpu_the_second_devices_arrays_still_take_the_cpu(rt2, tmp_path, monkeypatch):
    first, second = _backends(rt2, tmp_path)
    a, b, a1, b1 = _data(rt2, second)
    try:
        with _executor(first, tmp_path) as ex:
            cpu_runs = _count_cpu_device_runs(ex, monkeypatch)
            out = ex.add(a1, b1)
            ev = ex.events[-1]
            assert ev["backend"] == "cpu" and "wrong-device" in ev["fallback"]["error"] and "gpu_device" not in ev
            assert cpu_runs == ["add"] and out.device == a1.device
            np.testing.assert_array_equal(out.get(), a + b)
    finally:
        second.close()


def test_inputs_on_two_devices_take_the_cpu_as_before(rt2, tmp_path, monkeypatch):
    first, second = _backends(rt2, tmp_path)
    a, b, a1, _ = _data(rt2, second)
    b0 = to_device(b, runtime=first._ctx.rt)
    with _executor([first, second], tmp_path) as ex:
        cpu_runs = _count_cpu_device_runs(ex, monkeypatch)
        ex.add(a1, b0)
        assert ex.events[-1]["backend"] == "cpu" and "gpu_device" not in ex.events[-1]
        assert cpu_runs == ["add"]


@pytest.mark.parametrize("setting", [{"strategy": "cpu_preferred"}, {"force_cpu_mode": True},
                                     {"gpu_min_batch_size": 2 * N}])
def test_settings_that_keep_calls_on_the_cpu_keep_the_second_devices_calls_there(rt2, tmp_path, setting):
    first, second = _backends(rt2, tmp_path)
    a, b, a1, b1 = _data(rt2, second)
    with _executor([first, second], tmp_path, **setting) as ex:
        out = ex.add(a1, b1)
        assert ex.events[-1]["backend"] == "cpu" and out.device == a1.device
        np.testing.assert_array_equal(out.get(), a + b)
        # backend="gpu" overrides a strategy or the size floor (not force_cpu_mode), as for any call
        out = ex.add(a1, b1, backend="gpu")
        forced = "force_cpu_mode" in setting
        assert ex.events[-1]["backend"] == ("cpu" if forced else "gpu"), ex.events[-1]
        assert ex.events[-1].get("gpu_device") == (None if forced else 1) and out.device == a1.device
        np.testing.assert_array_equal(out.get(), a + b)


def test_without_splitting_the_listed_devices_still_run_their_own_data(rt2, tmp_path, monkeypatch):
    """split=False splits nothing, but a device gpu_devices names is opened for the data that lives on
    it; with gpu_devices left to 'all' only the executor's own device is opened, as before."""
    from hipsched.gpu.bindings import detect
    monkeypatch.setattr(detect, "get_runtime", lambda: rt2)
    for var in ("HIPSCHED_SPLIT", "HIPSCHED_GPU_DEVICES", "HIPSCHED_GPU_DEVICE_ID", "HIPSCHED_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HIPSCHED_CACHE_DIR", str(tmp_path / "kernels"))
    kw = dict(persist_model=False, cache_dir=str(tmp_path), gpu_min_batch_size=1, split=False)
    with Executor(**kw) as ex:
        assert [d["index"] for d in ex.gpu_devices] == [0]
    with Executor(gpu_devices=[0, 1], **kw) as ex:
        assert [d["index"] for d in ex.gpu_devices] == [0, 1] and ex._fast.splitter is None
        a, b, a1, b1 = _data(rt2, ex._other_gpus[0])
        out = ex.add(a1, b1)
        assert (ex.events[-1]["backend"], ex.events[-1]["gpu_device"]) == ("gpu", 1)
        np.testing.assert_array_equal(out.get(), a + b)
