"""The hip-python binding: against the real hip-python package and Debian's HIP runtime (no AMD GPU in
CI, so it must say "no device" the way the ctypes path does, and unwrap hip-python's (err, value...)
tuples with its real enum types), and against a fake for the per-thread device (hipSetDevice is per
host thread, so a runtime set to device 1 must still allocate/launch on device 1 from another thread).

hip-python versions tried (docs/design/gpu-runtime.md): 10.0.0.0.1.2 (the test extra), 7.2.2.562.43, 6.2.0.499.16, each
with ROCm 5.2's libamdhip64 from Debian 12."""
import importlib.util
import os
import subprocess
import sys
import threading

import pytest

from hipsched.errors import GpuError
from hipsched.gpu.bindings import hip_python
from requires import missing_tool, need


def _real_hip():
    need("hip")
    try:
        return hip_python._import_hip()
    except GpuError as e:
        missing_tool(f"a loadable hip-python ({e})", "pip install -e '.[test]'; Debian: apt-get install libamdhip64-dev")


def _hip_library_present():
    import ctypes.util
    return any(os.path.exists(p) for p in ("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5", "/opt/rocm/lib/libamdhip64.so")) \
        or ctypes.util.find_library("amdhip64") is not None


def test_real_hip_python_reports_no_device_like_the_ctypes_path():
    _real_hip()
    if not _hip_library_present():
        missing_tool("the HIP runtime library", "Debian: apt-get install libamdhip64-dev")
    with pytest.raises(GpuError) as info:
        hip_python.HipPythonRuntime()
    assert info.value.kind == "unavailable" and info.value.name == "hipErrorNoDevice"


def test_real_hip_python_detect_and_info_say_why(tmp_path):
    _real_hip()
    if not _hip_library_present():
        missing_tool("the HIP runtime library", "Debian: apt-get install libamdhip64-dev")
    env = dict(os.environ, HIPSCHED_GPU_RUNTIME="hip-python")
    r = subprocess.run([sys.executable, "-m", "hipsched", "info"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("hip-python"))
    assert "hipErrorNoDevice" in line


def test_unwrap_against_the_real_api():
    hip = _real_hip()
    rt = hip_python.HipPythonRuntime.__new__(hip_python.HipPythonRuntime)
    # success with one value: (hipSuccess, int)
    version = rt._unwrap("hipRuntimeGetVersion", hip.hipRuntimeGetVersion())
    assert isinstance(version, int) and version > 0
    # an error: the enum's own name reaches the GpuError, and the kind is classified from it
    with pytest.raises(GpuError) as info:
        rt._unwrap("hipGetDeviceCount", hip.hipGetDeviceCount())
    assert info.value.name == "hipErrorNoDevice" and info.value.kind == "unavailable"
    # the error enum behaves as an int where hip-python returns it alone
    assert int(hip.hipError_t.hipSuccess) == 0


def test_both_module_layouts_give_the_binding():
    hip = _real_hip()
    assert callable(hip.hipGetDeviceCount)
    if importlib.util.find_spec("rocm") is not None:
        from rocm.bindings import hip as rocm_hip
        assert rocm_hip.hipGetDeviceCount is not None


def test_import_falls_back_to_the_rocm_bindings_layout(monkeypatch):
    # a hip-python whose `hip` shim is gone: the rocm.bindings module is used
    import types
    fake = types.SimpleNamespace(hipGetDeviceCount=lambda: (0, 0))
    rocm, bindings = types.ModuleType("rocm"), types.ModuleType("rocm.bindings")
    bindings.hip = fake
    rocm.bindings = bindings
    monkeypatch.setitem(sys.modules, "hip", None)            # import hip -> ImportError
    monkeypatch.setitem(sys.modules, "rocm", rocm)
    monkeypatch.setitem(sys.modules, "rocm.bindings", bindings)
    assert hip_python._import_hip() is fake


def test_missing_hip_python_is_unavailable_with_both_reasons(monkeypatch):
    for name in ("hip", "rocm", "rocm.bindings"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(GpuError) as info:
        hip_python._import_hip()
    assert info.value.kind == "unavailable" and info.value.name == "hip-python-missing"
    assert "import of hip " in str(info.value) and "import of rocm.bindings" in str(info.value)


class FakeHip:
    def __init__(self):
        self.tls = threading.local()
        self.calls = []

    def _dev(self):
        return getattr(self.tls, "device", 0)

    def hipGetDeviceCount(self):
        return (0, 2)

    def hipSetDevice(self, index):
        self.tls.device = index
        return (0,)

    def hipMalloc(self, nbytes):
        self.calls.append(("malloc", self._dev()))
        return (0, 4096)

    def hipFree(self, ptr):
        self.calls.append(("free", self._dev()))
        return (0,)

    def hipStreamCreateWithFlags(self, flags):
        self.calls.append(("stream", self._dev()))
        return (0, 8)


@pytest.fixture
def rt(monkeypatch):
    fake = FakeHip()
    monkeypatch.setattr(hip_python, "_import_hip", lambda: fake)
    r = hip_python.HipPythonRuntime()
    r.set_device(1)
    return r, fake


def test_other_thread_uses_selected_device(rt):
    r, fake = rt

    def work():
        r.free(r.malloc(16))
        r.stream_create()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert fake.calls == [("malloc", 1), ("free", 1), ("stream", 1)]


def test_same_thread_unchanged(rt):
    r, fake = rt
    r.malloc(16)
    assert fake.calls == [("malloc", 1)]
