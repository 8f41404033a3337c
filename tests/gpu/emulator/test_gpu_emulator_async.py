"""The kernel emulator's asynchronous mode (tests/support/gpu_emulator.py): streams run late on worker threads,
the legacy default stream orders with blocking streams only, events order streams, and freed memory is
poisoned at once with memcheck finding later uses. These are the behaviours the lifetime and
stream-order tests (test_gpu_lifetimes.py) rely on to fail on wrong code, so each is pinned here."""
import ctypes

import numpy as np
import pytest

import gpu_emulator
from hipsched.errors import GpuError

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

@pytest.fixture
def rt():
    runtime = gpu_emulator.EmuRuntime(32, asynchronous=True, delay=0.005)
    yield runtime
    runtime.close()


def upload(rt, host, stream=0):
    ptr = rt.malloc(host.nbytes)
    rt.memcpy_htod(ptr, host.ctypes.data, host.nbytes, stream)
    return ptr


def download(rt, ptr, like, stream=0):
    out = np.zeros_like(like)
    rt.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes, stream)
    rt.stream_synchronize(stream)
    return out


def test_copies_land_only_when_the_stream_gets_there(rt):
    host = np.arange(8, dtype=np.float32)
    ptr = upload(rt, host)
    host[:] = -1                      # staged at the call: the device still gets 0..7
    out = np.zeros(8, np.float32)
    rt.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes, 0)
    assert (out == 0).all()           # queued: nothing written yet without a synchronisation
    rt.stream_synchronize(0)
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32))
    rt.free(ptr)


def test_non_blocking_streams_need_an_event(rt):
    host = np.arange(8, dtype=np.float32)
    producer, consumer = rt.stream_create(), rt.stream_create()
    ptr = rt.malloc(host.nbytes)
    rt.stall(producer, 0.2)           # a long producer kernel
    rt.memcpy_htod(ptr, host.ctypes.data, host.nbytes, producer)
    unordered = download(rt, ptr, host, consumer)
    assert np.isnan(unordered).all()  # the consumer ran first: never-written (poisoned) memory
    rt.stall(producer, 0.2)
    rt.memcpy_htod(ptr, (host * 2).ctypes.data, host.nbytes, producer)
    ev = rt.event_create()
    rt.event_record(ev, producer)
    assert not rt.event_query(ev)
    rt.stream_wait_event(consumer, ev)
    np.testing.assert_array_equal(download(rt, ptr, host, consumer), host * 2)
    assert rt.event_query(ev)
    rt.event_destroy(ev)
    rt.free(ptr)


def test_legacy_stream_orders_with_blocking_streams_only(rt):
    host = np.arange(4, dtype=np.float32)
    blocking, free_running = rt.stream_create(blocking=True), rt.stream_create()
    a, b = rt.malloc(host.nbytes), rt.malloc(host.nbytes)
    rt.stall(blocking, 0.2)
    rt.memcpy_htod(a, host.ctypes.data, host.nbytes, blocking)
    rt.stall(free_running, 0.8)
    rt.memcpy_htod(b, host.ctypes.data, host.nbytes, free_running)
    np.testing.assert_array_equal(download(rt, a, host, 0), host)    # the null stream waited for it
    assert np.isnan(download(rt, b, host, 0)).all()                   # ... and not for this one
    rt.synchronize()
    rt.free(a)
    rt.free(b)


def test_free_poisons_at_once_and_free_async_in_stream_order(rt):
    host = np.arange(4, dtype=np.float32)
    s = rt.stream_create()
    ptr = upload(rt, host, s)
    rt.stream_synchronize(s)
    rt.stall(s, 0.2)
    out = np.zeros_like(host)
    rt.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes, s)
    rt.free_async(ptr, s)             # after the copy: fine
    rt.stream_synchronize(s)
    np.testing.assert_array_equal(out, host)
    assert ptr not in rt.live and not rt.memcheck_errors

    ptr = upload(rt, host, s)
    rt.stream_synchronize(s)
    rt.stall(s, 0.2)
    rt.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes, s)
    rt.free(ptr)                      # before the queued copy ran: poisoned, and memcheck says so
    with pytest.raises(GpuError) as info:
        rt.stream_synchronize(s)
    assert info.value.kind == "lost"
    assert np.isnan(out).all()
    errors = rt.take_memcheck_errors()
    assert len(errors) == 1 and "memcpy_dtoh" in errors[0] and "freed block" in errors[0]


def test_memcheck_double_free_and_destroyed_stream(rt):
    ptr = rt.malloc(16)
    rt.free(ptr)
    with pytest.raises(GpuError):
        rt.free(ptr)
    with pytest.raises(GpuError):     # sticky since the double free
        rt.stream_create()
    errors = rt.take_memcheck_errors()
    assert "already freed" in errors[0]
    s = rt.stream_create()
    rt.stream_destroy(s)
    q = rt.malloc(4)
    rt.memset(q, 0, 4, s)
    assert any("after stream_destroy" in e for e in rt.take_memcheck_errors())
    rt.synchronize()


def test_close_reports_what_memcheck_found():
    rt = gpu_emulator.EmuRuntime(32, asynchronous=True, delay=0)
    ptr = rt.malloc(8)
    rt.free(ptr)
    rt.memset(ptr, 0, 8, 0)
    with pytest.raises(GpuError):
        rt.synchronize()
    with pytest.raises(AssertionError, match="memset"):
        rt.close()


KERNEL = """
__global__ void bump(float* p, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1.0f;
}
"""


def test_launch_on_freed_memory_is_found_and_arguments_are_captured(rt):
    fn = rt.module_function(rt.module_load(rt.compiler.compile(KERNEL, "bump.hip", "sm_90")), "bump")
    host = np.zeros(32, np.float32)
    s = rt.stream_create()
    ptr = upload(rt, host, s)
    rt.stall(s, 0.1)
    n = ctypes.c_int64(32)
    rt.launch(fn, (1, 1, 1), (32, 1, 1), (ctypes.c_void_p(ptr), n), 0, s)
    n.value = 0                       # the launch took its arguments at the call
    np.testing.assert_array_equal(download(rt, ptr, host, s), host + 1)
    rt.stall(s, 0.1)
    rt.launch(fn, (1, 1, 1), (32, 1, 1), (ctypes.c_void_p(ptr), ctypes.c_int64(32)), 0, s)
    rt.free(ptr)
    with pytest.raises(GpuError):
        rt.stream_synchronize(s)
    assert "bump" in rt.take_memcheck_errors()[0]
    with pytest.raises(GpuError, match="block shape"):
        rt.launch(fn, (1, 1, 1), (33, 1, 1), (ctypes.c_void_p(0), ctypes.c_int64(0)), 0, s)


def test_synchronous_mode_runs_at_once_and_still_checks():
    rt = gpu_emulator.EmuRuntime(32, asynchronous=False)
    host = np.arange(4, dtype=np.float32)
    ptr = upload(rt, host)
    out = np.zeros_like(host)
    rt.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes, 0)
    np.testing.assert_array_equal(out, host)
    rt.free(ptr)
    with pytest.raises(GpuError):
        rt.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes, 0)
    assert rt.take_memcheck_errors()
    rt.close()


def test_environment_selects_the_mode(monkeypatch):
    monkeypatch.setenv("HIPSCHED_EMU_ASYNC", "1")
    monkeypatch.setenv("HIPSCHED_EMU_DELAY", "0.25")
    rt = gpu_emulator.EmuRuntime(32)
    assert rt.asynchronous and rt.delay == 0.25
    rt.close()
    monkeypatch.setenv("HIPSCHED_EMU_ASYNC", "0")
    assert not gpu_emulator.EmuRuntime(32).asynchronous
