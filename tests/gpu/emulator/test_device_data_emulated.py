"""Device data through the Executor on the kernel emulator (issue 19): the real GpuBackend times device-data
runs with events on their stream and the Executor learns from them on a later call, without waiting
(items 3); results come back as the caller's own library's arrays, zero copy through its from_dlpack, on
every path (item 5, with tests/support/fake_array_lib.py standing in for torch and CuPy)."""
import collections
import threading
import time

import numpy as np
import pytest

import fake_array_lib
import gpu_emulator
from emulated_executor import emulated_executor
from hipsched.gpu.memory.device_array import DeviceArray, to_device

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

N = 1 << 16


@pytest.fixture(scope="module")
def rt():
    runtime = gpu_emulator.EmuRuntime(32)
    yield runtime
    runtime.close()


@pytest.fixture
def lib(rt, monkeypatch):
    from hipsched.gpu.bindings import detect
    # foreign arrays are wrapped with the process's runtime (the CPU path copies through it)
    monkeypatch.setattr(detect, "get_runtime", lambda: rt)
    yield fake_array_lib.install(rt)
    fake_array_lib.uninstall()


def gpu_samples(ex, op="add"):
    return sum(b[1] for b in ex.performance_tracker.samples(op, "gpu"))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_device_pipeline_stays_on_the_gpu_when_moving_its_data_costs_more(mode, tmp_path):
    """A cold model, 40 adds on device arrays, and a link so slow (5 MB/s) that the CPU's copies alone
    take longer than the emulated kernel: every call runs on the GPU, and every run's time is learned
    from its events (before the fix: 32 of 40 ran on the CPU, and none was learned)."""
    runtime = gpu_emulator.EmuRuntime(32, asynchronous=mode == "async")
    try:
        rng = np.random.default_rng(19)
        a, b = rng.standard_normal((2, N), dtype=np.float32)
        da, db = to_device(a, runtime=runtime), to_device(b, runtime=runtime)
        with emulated_executor(runtime, tmp_path) as ex:
            ex._core.set_transfer(100.0, 0.005, 100.0, 0.005)
            outs = [ex.add(da, db) for _ in range(40)]
            picks = collections.Counter((e["backend"], e["reason"]) for e in ex.events)
            assert collections.Counter(e["backend"] for e in ex.events) == {"gpu": 40}, picks
            np.testing.assert_array_equal(outs[-1].get(), a + b)
            runtime.synchronize()
            ex.add(da, db)
            assert gpu_samples(ex) >= 40
    finally:
        runtime.close()


def test_a_device_run_is_learned_on_a_later_call_without_waiting(tmp_path):
    """The caller is not made to wait for the timing: the call returns with its work still queued (the
    runtime holds its queue until the call has returned: a call that waited would never return),
    nothing is learned yet, and a call after the work has run learns its time (each item 0.3 s late)."""
    runtime = gpu_emulator.EmuRuntime(32, asynchronous=True, delay=0.3)
    try:
        a = np.arange(N, dtype=np.float32)
        da = to_device(a, runtime=runtime)
        with emulated_executor(runtime, tmp_path) as ex:
            ex.add(da, da)                              # the kernel compiled, its run left queued
            assert gpu_samples(ex) == 0
            runtime.synchronize()
            done = []
            with runtime.held():
                caller = threading.Thread(target=lambda: done.append(ex.add(da, da)), daemon=True)
                caller.start()
                caller.join(60)
                assert done, "the call waited for its queued work"
                # it learned the run before it, which had run, and not its own, which cannot have
                assert ex.events[-1]["backend"] == "gpu" and gpu_samples(ex) == 1
            out = done[0]
            runtime.synchronize()
            ex.add(da, da)
            assert gpu_samples(ex) == 2
            # the device time spans the queued items' delays: it is the work's, not the launch's
            assert ex.performance_tracker.samples("add", "gpu")[0][3] >= 0.3e6
            np.testing.assert_array_equal(out.get(), a + a)
    finally:
        runtime.close()


def test_device_data_moves_to_the_cpu_when_the_gpu_is_slower(tmp_path):
    """On a device whose kernels take 20 ms (the CPU's round trip well under one) the GPU side is
    learned from events and the calls move to the CPU.

    A GPU run is learned on a later call once its work has run, never waited for. On the asynchronous
    emulator (HIPSCHED_EMU_ASYNC=1) 30 calls are queued in about 50 ms, before the first kernel ends:
    none is learned, so all stay where the data lives (the rule for device data with a side unknown),
    which is right, not what this test is about. So the queue catches up once, after the first few calls,
    as a pipeline that reads a result would make it (a no-op on the synchronous emulator); the calls
    after that learn the GPU's times and move."""
    rt = gpu_emulator.EmuRuntime(32, kernel_seconds=0.02)
    try:
        a = np.arange(N, dtype=np.float32)
        da = to_device(a, runtime=rt)
        with emulated_executor(rt, tmp_path) as ex:
            outs = []
            for i in range(30):
                outs.append(ex.add(da, da))
                if i == 3:
                    rt.synchronize()
            assert ex.events[0]["backend"] == "gpu"            # cold: where the data is
            assert [e["backend"] for e in ex.events[-10:]] == ["cpu"] * 10, [(e["backend"], e["reason"])
                                                                             for e in ex.events]
            assert gpu_samples(ex) >= 1
            assert all(isinstance(o, DeviceArray) for o in outs)
            np.testing.assert_array_equal(outs[-1].get(), a + a)
    finally:
        rt.close()


# ---------------------------------------------------------------- results in the caller's array type

@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_foreign_arrays_in_give_the_same_library_arrays_out(rt, lib, tmp_path, backend):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 300), dtype=np.float32)
    with emulated_executor(rt, tmp_path) as ex:
        out = ex.add(lib.tensor(a), lib.tensor(b), backend=backend)
        assert type(out) is fake_array_lib.Tensor
        np.testing.assert_array_equal(out.numpy(), a + b)
        converted, stream = lib.calls[-1]
        assert isinstance(converted, DeviceArray) and stream == 1   # the legacy default stream's handshake
        assert out.ptr == converted.ptr                             # zero copy


def test_a_fallback_on_foreign_arrays_gives_the_same_library_arrays(rt, lib, tmp_path):
    a = np.arange(300, dtype=np.float32)
    with emulated_executor(rt, tmp_path, fault_inject="launch=1.0") as ex:
        out = ex.scale(lib.tensor(a), 2.0, backend="gpu")
        assert ex.events[-1]["reason"] == "cpu_fallback"
        assert type(out) is fake_array_lib.Tensor
        np.testing.assert_array_equal(out.numpy(), 2 * a)


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_tuple_results_are_converted_item_by_item(rt, lib, tmp_path, backend):
    rng = np.random.default_rng(6)
    q = rng.standard_normal(16, dtype=np.float32)
    T = rng.standard_normal((200, 16), dtype=np.float32)
    with emulated_executor(rt, tmp_path) as ex:
        idx, scores = ex.top_k(lib.tensor(q), lib.tensor(T), 5, backend=backend)
        want_idx, want_scores = ex.top_k(q, T, 5, backend="cpu")
        assert type(idx) is type(scores) is fake_array_lib.Tensor
        assert idx.dtype == np.int64 and scores.dtype == np.float32
        np.testing.assert_array_equal(idx.numpy(), want_idx)
        np.testing.assert_allclose(scores.numpy(), want_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_hipsched_device_arrays_in_give_device_arrays_out(rt, lib, tmp_path, backend):
    a = np.arange(300, dtype=np.float32)
    with emulated_executor(rt, tmp_path) as ex:
        out = ex.add(to_device(a, runtime=rt), to_device(a, runtime=rt), backend=backend)
        assert type(out) is DeviceArray and not lib.calls
        np.testing.assert_array_equal(out.get(), a + a)


def test_the_consumers_stream_is_ordered_after_the_call(lib, tmp_path, monkeypatch):
    """The library converts on its own current stream, not the call's: DeviceArray.__dlpack__ makes that
    stream wait for the call's kernels (an event, the host does not wait), so a read queued there sees
    the result. On the asynchronous emulator an unordered read finds never-written (NaN) memory."""
    from hipsched.gpu.bindings import detect
    runtime = gpu_emulator.EmuRuntime(32, asynchronous=True, delay=0.02)
    monkeypatch.setattr(detect, "get_runtime", lambda: runtime)
    lib.runtime = runtime
    try:
        a = np.arange(300, dtype=np.float32)
        with emulated_executor(runtime, tmp_path) as ex:
            lib.current_stream = consumer = runtime.stream_create()
            out = ex.add(lib.tensor(a), lib.tensor(a), backend="gpu")
            assert lib.calls[-1][1] == consumer
            host = np.zeros_like(a)
            runtime.memcpy_dtoh(host.ctypes.data, out.ptr, host.nbytes, consumer)
            runtime.stream_synchronize(consumer)
            np.testing.assert_array_equal(host, a + a)
    finally:
        runtime.close()


def test_numpy_does_not_take_a_device_array_silently(rt):
    d = to_device(np.ones(3, np.float32), runtime=rt)
    with pytest.raises(TypeError, match=r"\.get\(\)"):
        np.asarray(d)
    np.testing.assert_array_equal(d.get(), np.ones(3, np.float32))


def test_a_library_that_refuses_the_result_gets_a_device_array_and_a_warning(rt, lib, tmp_path, caplog,
                                                                              monkeypatch):
    from hipsched.gpu.memory import device_array

    def refuse(x):
        raise BufferError("fake: no such dtype")
    monkeypatch.setattr(lib, "from_dlpack", refuse)
    monkeypatch.setattr(device_array, "_unconvertible", set())
    a = np.arange(300, dtype=np.float32)
    with emulated_executor(rt, tmp_path) as ex, caplog.at_level("WARNING", logger="hipsched"):
        out = ex.add(lib.tensor(a), lib.tensor(a), backend="gpu")
        assert type(out) is DeviceArray and ex.events[-1]["backend"] == "gpu"   # not a GPU failure
        np.testing.assert_array_equal(out.get(), a + a)
    assert "refused a result" in caplog.text and "BufferError" in caplog.text
