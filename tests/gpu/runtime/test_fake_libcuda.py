"""The no-op C driver of tests/support/fake_libcuda.c under the real ctypes binding: that it is what the
benchmarks need (the binding initialises on it, copies round-trip, a GpuBackend on it is available and
one GPU add is one launch) and that its entry points can be called by address, as a compiled call path
will call them."""
import ctypes
import gc
import os
import threading

import numpy as np
import pytest

import fake_libcuda
from requires import missing_tool

if not fake_libcuda.available():
    missing_tool("a C compiler to build the fake libcuda with", "set CC, or apt-get install gcc", allow_module_level=True)

import hipsched  # noqa: E402
from hipsched.gpu.memory.device_array import DeviceArray, to_device  # noqa: E402

CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE = 3, 201, 400


@pytest.fixture
def rt(monkeypatch):
    return fake_libcuda.runtime(monkeypatch)


def test_binding_initialises_on_it(rt):
    assert rt.library_path == os.path.realpath(fake_libcuda.build())
    assert rt.driver_version() == 13000 and rt.device_count() == 1
    info = rt.device_info(0)
    assert (info.multiprocessors, info.arch, info.warp_size) == (132, "sm_90", 32)
    assert info.name == "Fake CUDA Device" and info.total_memory == 80 << 30
    assert rt.mem_info() == (64 << 30, 80 << 30)


def test_version_and_device_count_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FAKE_LIBCUDA_VERSION", "12080")
    monkeypatch.setenv("FAKE_LIBCUDA_DEVICES", "2")
    rt = fake_libcuda.runtime(monkeypatch)
    assert rt.driver_version() == 12080 and rt.device_count() == 2
    assert rt.for_device(1).device_info(1).arch == "sm_90"


def test_copies_round_trip(rt):
    host = np.arange(1000, dtype=np.float64)
    ptr = rt.malloc(host.nbytes)
    assert ptr % 256 == 0
    rt.memcpy_htod(ptr, host.ctypes.data, host.nbytes)
    other = rt.malloc(host.nbytes)
    rt.memcpy_dtod(other, ptr, host.nbytes)
    back = np.empty_like(host)
    rt.memcpy_dtoh(back.ctypes.data, other, back.nbytes)
    rt.synchronize()
    np.testing.assert_array_equal(back, host)
    rt.memset(other, 0, host.nbytes)
    rt.memcpy_dtoh(back.ctypes.data, other, back.nbytes)
    assert not back.any()
    rt.free(ptr)
    rt.free(other)
    assert rt.pointer_device(rt.malloc(16)) == 0


def test_streams_events_and_pools(rt):
    s = rt.stream_create()
    a, b = rt.event_create(), rt.event_create()
    rt.event_record(a, s)
    rt.event_record(b, s)
    rt.stream_wait_event(s, b)
    assert rt.event_query(b) is True
    assert rt.event_elapsed_ms(a, b) == pytest.approx(0.001)
    rt.event_destroy(a)
    rt.event_destroy(b)
    rt.stream_destroy(s)
    ptr = rt._pool_malloc(4096, 0)   # the stream-ordered path: pool found, release threshold set
    assert ptr and rt._pools.get(0)
    rt.free_async(ptr, 0)
    rt.trim_pool(synchronize=True)


def test_gpu_backend_is_available_and_one_add_is_one_launch(monkeypatch):
    backend = fake_libcuda.backend(monkeypatch)
    rt = backend._ctx.rt
    assert backend.device_arch == "sm_90"
    a = to_device(np.arange(4096, dtype=np.float32), runtime=rt)
    b = to_device(np.ones(4096, dtype=np.float32), runtime=rt)
    ex = hipsched.Executor(gpu_backend=backend)
    try:
        for _ in range(2):   # the first call also loads the kernels, which launches nothing
            before = fake_libcuda.launches()
            out = ex.add(a, b, backend="gpu")
            # kernels do not run: the values are garbage, only the launch is real
            assert isinstance(out, DeviceArray) and out.shape == (4096,) and out.dtype == np.float32
            assert fake_libcuda.launches() == before + 1
        assert "add" in fake_libcuda.last_kernel()
    finally:
        ex.close()
        backend.close()


def test_reset_zeroes_the_launch_counter(monkeypatch):
    fake_libcuda.use(monkeypatch)
    fake_libcuda.reset()
    assert fake_libcuda.launches() == 0 and fake_libcuda.last_kernel() is None


def _fn(lib, name, restype, argtypes):
    """The entry point called through its address, as compiled code would call it, not by ctypes name."""
    address = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    assert address
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


def test_entry_points_work_by_address(rt):
    from hipsched.gpu.bindings import libs
    lib = libs.open_library("cuda")[0]
    vp = ctypes.c_void_p
    module, function = rt.module_load(b"any image\0"), vp()
    get_function = _fn(lib, "cuModuleGetFunction", ctypes.c_int, [ctypes.POINTER(vp), vp, ctypes.c_char_p])
    assert get_function(ctypes.byref(function), module, b"k") == 0
    again = vp()
    assert get_function(ctypes.byref(again), module, b"k") == 0 and again.value == function.value
    launch = _fn(lib, "cuLaunchKernel", ctypes.c_int, [vp] + [ctypes.c_uint] * 7 + [vp, vp, vp])
    fake_libcuda.reset()
    assert launch(function, 1, 1, 1, 32, 1, 1, 0, None, None, None) == 0
    assert fake_libcuda.launches() == 1 and fake_libcuda.last_kernel() == "k"
    assert launch(vp(12345), 1, 1, 1, 32, 1, 1, 0, None, None, None) == CUDA_ERROR_INVALID_HANDLE
    rt.module_unload(module)
    assert launch(function, 1, 1, 1, 32, 1, 1, 0, None, None, None) == CUDA_ERROR_INVALID_HANDLE
    assert fake_libcuda.launches() == 1


def test_a_thread_without_a_context_is_refused(rt):
    from hipsched.gpu.bindings import libs
    lib = libs.open_library("cuda")[0]
    alloc = _fn(lib, "cuMemAlloc_v2", ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t])
    result, out = [], ctypes.c_uint64()
    # A garbage collection on the new thread would run earlier tests' finalizers there, and one that
    # frees device memory through the binding sets the context on that thread (seen once in CI).
    gc.collect()
    gc.disable()
    try:
        t = threading.Thread(target=lambda: result.append(alloc(ctypes.byref(out), 64)))
        t.start()
        t.join()
    finally:
        gc.enable()
    assert result == [CUDA_ERROR_INVALID_CONTEXT]
    rt.free(rt.malloc(64))   # the binding sets the context on every thread it runs on


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_after_fork_every_call_but_error_names_is_not_initialized(rt):
    from hipsched.gpu.bindings import libs
    lib = libs.open_library("cuda")[0]
    sync = _fn(lib, "cuCtxSynchronize", ctypes.c_int, [])
    name = _fn(lib, "cuGetErrorName", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])
    assert sync() == 0
    pid = os.fork()
    if pid == 0:   # the child: only ctypes calls, then out without running the parent's cleanup
        out = ctypes.c_char_p()
        ok = sync() == CUDA_ERROR_NOT_INITIALIZED and name(3, ctypes.byref(out)) == 0 and \
            out.value == b"CUDA_ERROR_NOT_INITIALIZED"
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sync() == 0   # the parent keeps its driver
