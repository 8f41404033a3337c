"""GPU runtime detection, bindings and error mapping, against the real vendor libraries on a machine
without a GPU (libamdhip64 answers hipErrorNoDevice, libcuda is absent). GPU-only checks are marked."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from hipsched.errors import GpuError
from hipsched.gpu.bindings import detect, libs
from hipsched.gpu.bindings.status import classify, gpu_error
from requires import missing_tool, need


def _lib_present(kind):
    try:
        libs.open_library(kind)
        return True
    except libs.LibraryNotFound:
        return False


needs_hip_lib = pytest.mark.skipif(not _lib_present("hip"), reason="libamdhip64 not installed")


@pytest.fixture
def fresh_detect(monkeypatch):
    """Clear the cached probe before and after, so env changes take effect and do not leak."""
    detect.reset()
    yield monkeypatch
    detect.reset()


def _by_name(attempts):
    return {a.name: a for a in attempts}


@needs_hip_lib
def test_no_device_reasons_from_real_libraries(fresh_detect):
    if detect.gpu_available():
        pytest.skip("a GPU is present")
    fresh_detect.setenv("HIPSCHED_GPU_RUNTIME", "auto")
    detect.reset()
    attempts = detect.attempts()
    assert [a.name for a in attempts] == ["hip-python", "hip", "cuda"]
    by = _by_name(attempts)
    assert not any(a.ok for a in attempts)
    assert "hipErrorNoDevice" in by["hip"].reason
    if not _lib_present("cuda"):
        assert "libcuda" in by["cuda"].reason
    assert detect.get_runtime() is None
    assert detect.gpu_available() is False
    reason = detect.unavailable_reason()
    assert "hip: hipErrorNoDevice" in reason and "cuda:" in reason


@needs_hip_lib
def test_ctypes_hip_runtime_raises_gpu_error_with_name():
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    if detect.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(GpuError) as info:
        CtypesRuntime("hip")
    assert info.value.kind == "unavailable"
    assert info.value.name == "hipErrorNoDevice"


def test_cuda_runtime_missing_driver_is_unavailable(monkeypatch):
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    monkeypatch.setenv("HIPSCHED_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
    with pytest.raises(GpuError) as info:
        CtypesRuntime("cuda")
    assert info.value.kind == "unavailable"
    assert "/nonexistent/libcuda.so.1" in str(info.value)


def test_runtime_none_and_single_choice(fresh_detect):
    fresh_detect.setenv("HIPSCHED_GPU_RUNTIME", "none")
    detect.reset()
    assert detect.get_runtime() is None
    assert "disabled" in detect.unavailable_reason()
    fresh_detect.setenv("HIPSCHED_GPU_RUNTIME", "cuda")
    fresh_detect.setenv("HIPSCHED_CUDA_LIBRARY", "/nonexistent/libcuda.so")
    detect.reset()
    assert [a.name for a in detect.attempts()] == ["cuda"]
    assert detect.attempts()[0].ok is False


def test_bogus_runtime_choice_is_a_clear_reason(fresh_detect):
    fresh_detect.setenv("HIPSCHED_GPU_RUNTIME", "opencl")
    detect.reset()
    assert detect.gpu_available() is False
    (attempt,) = detect.attempts()
    assert "'opencl' is not one of" in attempt.reason and "hip-python" in attempt.reason


def test_probe_survives_a_binding_that_raises_anything(fresh_detect):
    def broken(name):
        raise RuntimeError("binding bug")
    fresh_detect.setattr(detect, "_construct", broken)
    fresh_detect.setenv("HIPSCHED_GPU_RUNTIME", "auto")
    attempts, runtime = detect.probe()
    assert runtime is None
    assert all("init error: RuntimeError: binding bug" in a.reason for a in attempts)


def test_import_hipsched_without_any_gpu_library():
    # Every library pointed at a missing file: importing and probing must still work.
    env = dict(os.environ, HIPSCHED_HIP_LIBRARY="/nonexistent/libamdhip64.so",
               HIPSCHED_HIPRTC_LIBRARY="/nonexistent/libhiprtc.so", HIPSCHED_CUDA_LIBRARY="/nonexistent/libcuda.so",
               HIPSCHED_NVRTC_LIBRARY="/nonexistent/libnvrtc.so", HIPSCHED_GPU_RUNTIME="hip")
    code = ("import hipsched\nfrom hipsched.gpu.bindings import detect\n"
            "from hipsched.gpu.bindings.compilers import get_compiler\n"
            "from hipsched.errors import GpuError\nprint(detect.gpu_available(), detect.unavailable_reason())\n"
            "try:\n    get_compiler('gfx90a')\nexcept GpuError as e:\n    print(e.kind)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False hip: ") and "/nonexistent/libamdhip64.so" in r.stdout
    assert r.stdout.strip().endswith("unavailable")


@pytest.mark.parametrize("name,kind", [
    ("hipErrorOutOfMemory", "oom"), ("CUDA_ERROR_OUT_OF_MEMORY", "oom"), ("hipErrorMemoryAllocation", "oom"),
    ("hipErrorNoDevice", "unavailable"), ("CUDA_ERROR_NO_DEVICE", "unavailable"),
    ("hipErrorInsufficientDriver", "unavailable"), ("CUDA_ERROR_NOT_INITIALIZED", "unavailable"),
    ("hipErrorLaunchTimeOut", "timeout"), ("CUDA_ERROR_LAUNCH_TIMEOUT", "timeout"),
    ("hipErrorIllegalAddress", "lost"), ("CUDA_ERROR_LAUNCH_FAILED", "lost"), ("hipErrorLaunchFailure", "lost"),
    ("hipErrorLaunchOutOfResources", "launch"), ("CUDA_ERROR_INVALID_CONFIGURATION", "launch"),
    ("hipErrorInvalidImage", "compile"), ("CUDA_ERROR_NO_BINARY_FOR_GPU", "compile"),
    ("HIPRTC_ERROR_COMPILATION", "compile"), ("NVRTC_ERROR_INVALID_OPTION", "compile"),
    ("hipErrorInvalidValue", "runtime"), (None, "runtime"),
])
def test_error_names_map_to_kinds(name, kind):
    assert classify(name) == kind
    err = gpu_error(name, "hipSomething", 7)
    assert isinstance(err, GpuError) and err.kind == kind and err.name == name


def test_gpu_error_survives_pickling():
    err = gpu_error("hipErrorOutOfMemory", "hipMalloc", 2)
    back = pickle.loads(pickle.dumps(err))
    assert (back.kind, back.name, str(back)) == (err.kind, err.name, str(err))


def test_info_command_reports_runtimes_and_cache(tmp_path):
    env = dict(os.environ, HIPSCHED_CACHE_DIR=str(tmp_path / "kc"))
    r = subprocess.run([sys.executable, "-m", "hipsched", "info", "--json"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json
    info = json.loads(r.stdout)
    assert info["kernel_cache_dir"] == str(tmp_path / "kc")
    assert [a["name"] for a in info["runtimes"]] == ["hip-python", "hip", "cuda"]
    assert set(info["compilers"]) == {"amd", "nvidia"}
    assert "simd" in info["cpu"] or "error" in info["cpu"]


# ---------------------------------------------------------------------- on a real GPU
@pytest.mark.gpu
def test_runtime_round_trip_and_launch(tmp_path):
    import ctypes
    from hipsched.gpu.compilation.kernels import KernelCache
    rt = detect.get_runtime()
    info = rt.device_info(rt.current_device())
    assert info.total_memory > 0 and info.arch
    free, total = rt.mem_info()
    assert 0 < free <= total
    src = 'extern "C" __global__ void twice(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x;' \
          ' if (i < n) x[i] *= 2.0f; }'
    cache = KernelCache(rt.compiler, tmp_path, sources={"t.hip": src})
    fn = cache.function(rt, "t.hip", "twice")
    host = np.arange(1000, dtype=np.float32)
    ptr = rt.malloc(host.nbytes)
    try:
        s = rt.stream_create()
        start, end = rt.event_create(), rt.event_create()
        rt.memcpy_htod(ptr, host.ctypes.data, host.nbytes, s)
        rt.event_record(start, s)
        rt.launch(fn, (4, 1, 1), (256, 1, 1), (ctypes.c_void_p(ptr), ctypes.c_int32(host.size)), 0, s)
        rt.event_record(end, s)
        out = np.empty_like(host)
        rt.memcpy_dtoh(out.ctypes.data, ptr, host.nbytes, s)
        rt.stream_synchronize(s)
        assert rt.event_elapsed_ms(start, end) >= 0
        np.testing.assert_array_equal(out, host * 2)
        rt.event_destroy(start), rt.event_destroy(end), rt.stream_destroy(s)
    finally:
        rt.free(ptr)


@pytest.mark.gpu
def test_out_of_memory_is_a_gpu_error():
    rt = detect.get_runtime()
    with pytest.raises(GpuError) as info:
        rt.malloc(1 << 50)
    assert info.value.kind == "oom"


def test_hip_python_hiprtc_pointed_at_libamdhip64():
    # hip-python looks for libhiprtc.so, which ROCm 5.x does not ship; point_hiprtc_at redirects it
    # to the library that holds hiprtc, and hip-python's own hiprtc then compiles. Own process: the
    # redirection is process-wide and must happen before hip-python's first hiprtc call.
    import importlib.util
    need("hip")
    from hipsched.gpu.bindings.compilers import get_compiler
    try:
        path = get_compiler("amd").library_path
    except GpuError as e:
        missing_tool(f"hiprtc ({e})", "Debian: apt-get install libamdhip64-dev")
    code = ("import sys\nfrom hipsched.gpu.bindings.hip_python import point_hiprtc_at\npoint_hiprtc_at(sys.argv[1])\n"
            "from hip import hiprtc\n"
            "err, prog = hiprtc.hiprtcCreateProgram(b'extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }',"
            " b'k.hip', 0, [], [])\nassert int(err) == 0, err\n"
            "(err,) = hiprtc.hiprtcCompileProgram(prog, 1, [b'--gpu-architecture=gfx906'])\nassert int(err) == 0, err\n"
            "err, n = hiprtc.hiprtcGetCodeSize(prog)\nprint(int(err), n)\n")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    err, size = map(int, r.stdout.split())
    assert err == 0 and size > 1000


def test_kernel_params_pack_ctypes_scalars_only():
    import ctypes
    from hipsched.gpu.bindings.runtime import pack_kernel_params
    args = (ctypes.c_void_p(0x1000), ctypes.c_int32(7), ctypes.c_float(2.5), ctypes.c_int64(-3))
    params = pack_kernel_params(args)
    assert len(params) == 4
    assert ctypes.c_int32.from_address(params[1]).value == 7
    assert ctypes.c_float.from_address(params[2]).value == 2.5
    assert ctypes.c_void_p.from_address(params[0]).value == 0x1000
    with pytest.raises(GpuError) as info:
        pack_kernel_params((ctypes.c_int32(1), 5))
    assert info.value.kind == "launch" and "argument 1" in str(info.value)


def test_probe_runs_once_under_concurrent_first_use(fresh_detect):
    import threading
    calls = []

    def counting(name):
        calls.append(name)
        raise GpuError("unavailable", "no device", name="hipErrorNoDevice")
    fresh_detect.setattr(detect, "_construct", counting)
    fresh_detect.setenv("HIPSCHED_GPU_RUNTIME", "hip")
    detect.reset()
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        results.append((detect.gpu_available(), len(detect.attempts())))
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(False, 1)] * 8
    assert calls == ["hip"]
    assert detect.attempts()[0].reason == "hipErrorNoDevice (no device)"
