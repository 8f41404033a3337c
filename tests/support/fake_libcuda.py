"""The no-op CUDA driver of fake_libcuda.c, compiled and put under hipsched's real ctypes binding.

Unlike fake_cuda_driver.py (a Python object in place of the library, for testing the binding's rules),
this is a real shared library that the binding opens through HIPSCHED_CUDA_LIBRARY, with C functions
that return at once: a benchmark of one GPU call then measures hipsched's host time alone, and a
compiled call path can take the driver's entry points by address as it would from libcuda.

In pytest:

    import fake_libcuda
    backend = fake_libcuda.backend(monkeypatch)          # a GpuBackend on it, `available`
    fake_libcuda.reset(); ...; fake_libcuda.launches()   # cuLaunchKernel calls since reset()

In a script (no monkeypatch), before hipsched looks for a GPU:

    fake_libcuda.install_env()
    rt = fake_libcuda.make_runtime()
    backend = GpuBackend({"kernel_cache_dir": fake_libcuda.kernel_cache_dir()}, runtime=rt)

Kernels "compile" with fake_cuda_driver.fake_nvrtc to stub CUBINs, which this driver loads and never
runs: the values a kernel should have written are garbage."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_libcuda.c")
FLAGS = ["-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-pthread"]
MISSING_LIBRARY = "/nonexistent/hipsched-fake-libcuda/libamdhip64.so"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def available() -> bool:
    """Whether a C compiler is there to build the fake with."""
    cc = _compiler()
    return bool(cc) and shutil.which(cc[0]) is not None


def _cache_dir() -> str:
    root = os.environ.get("HIPSCHED_TEST_CACHE")
    if root:
        os.makedirs(root, exist_ok=True)
        return root
    # Per user and private: a shared library found in a shared temporary folder is code we run, so one
    # that another user could have put there is not loaded.
    path = os.path.join(tempfile.gettempdir(), f"hipsched-test-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{path} is not a private folder of this user; set HIPSCHED_TEST_CACHE to one")
    return path


def _digest() -> str:
    h = hashlib.sha256()
    with open(SOURCE, "rb") as f:
        h.update(f.read())
    h.update("\0".join(_compiler() + FLAGS).encode())
    return h.hexdigest()[:16]


def build() -> str:
    """Compile fake_libcuda.c once per source version (and compiler and flags); returns the .so path."""
    folder = _cache_dir()
    out = os.path.join(folder, f"fake_libcuda-{_digest()}.so")
    if os.path.exists(out):
        return out
    if not available():
        raise RuntimeError(f"no C compiler ({' '.join(_compiler())}) to build {SOURCE}; set CC")
    # Compiled to a name of its own and renamed: parallel test workers may build at once, and a reader
    # must never open a half-written file.
    fd, tmp = tempfile.mkstemp(prefix=".fake_libcuda-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        cmd = _compiler() + FLAGS + ["-o", tmp, SOURCE]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"building the fake libcuda failed: {' '.join(cmd)}: {e}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"building the fake libcuda failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                               f"{(proc.stderr or proc.stdout).strip()}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def kernel_cache_dir() -> str:
    """Where backends on the fake keep their kernels: never the user's real kernel cache, whose keys
    ("nvrtc 13.0 libnvrtc.so.13", "cuda-driver 13000") a stub CUBIN of fake_nvrtc(13, 0) would share."""
    path = os.path.join(_cache_dir(), f"fake_libcuda-kernels-{_digest()}")
    os.makedirs(path, exist_ok=True)
    return path


def _environment(path: str) -> dict[str, str]:
    return {
        "HIPSCHED_CUDA_LIBRARY": path,
        # so that detection (auto: hip-python, hip, cuda) finds no HIP beside it
        "HIPSCHED_HIP_LIBRARY": MISSING_LIBRARY,
        # hip-python loads the real HIP itself, whatever HIPSCHED_HIP_LIBRARY says
        "HIPSCHED_GPU_RUNTIME": "cuda",
        # a vendor BLAS would talk to the real driver, with our "device" pointers that are host memory
        "HIPSCHED_BLAS": "none",
    }


def use(monkeypatch) -> str:
    """Build the fake and point hipsched at it for this test; returns the library's path."""
    path = build()
    for key, value in _environment(path).items():
        monkeypatch.setenv(key, value)
    return path


def install_env() -> str:
    """`use` for scripts without pytest: sets os.environ for good; returns the library's path. Call it
    before hipsched's detection first runs (or call hipsched.gpu.bindings.detect.reset() after)."""
    path = build()
    os.environ.update(_environment(path))
    return path


def make_runtime():
    """A CtypesRuntime("cuda") on the fake (the environment must point at it: use or install_env),
    with a stub NVRTC 13.0 whose CUBINs the fake loads."""
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime

    from fake_cuda_driver import fake_nvrtc
    rt = CtypesRuntime("cuda")
    rt._compiler = fake_nvrtc(13, 0)
    return rt


def runtime(monkeypatch):
    use(monkeypatch)
    return make_runtime()


def backend(monkeypatch, **config):
    """A GpuBackend on the fake; raises AssertionError with its reason if it is not available."""
    from hipsched.backends.gpu import GpuBackend
    config.setdefault("kernel_cache_dir", kernel_cache_dir())
    be = GpuBackend(config, runtime=runtime(monkeypatch))
    assert be.available, f"GpuBackend on the fake libcuda is not available: {be.unavailable_reason}"
    return be


def _lib() -> ctypes.CDLL:
    from hipsched.gpu.bindings import libs
    lib, path = libs.open_library("cuda")
    if not hasattr(lib, "fake_libcuda_launches"):
        raise RuntimeError(f"the CUDA library hipsched opens is {path}, not the fake: call use() or install_env()")
    lib.fake_libcuda_launches.restype = ctypes.c_longlong
    lib.fake_libcuda_launches.argtypes = []
    lib.fake_libcuda_reset.restype = None
    lib.fake_libcuda_reset.argtypes = []
    lib.fake_libcuda_last_function.restype = ctypes.c_void_p
    lib.fake_libcuda_last_function.argtypes = []
    lib.fake_libcuda_function_name.restype = ctypes.c_char_p
    lib.fake_libcuda_function_name.argtypes = [ctypes.c_void_p]
    return lib


def launches() -> int:
    """cuLaunchKernel calls that succeeded since the library loaded or reset()."""
    return _lib().fake_libcuda_launches()


def reset() -> None:
    _lib().fake_libcuda_reset()


def last_kernel() -> str | None:
    """The name of the kernel launched last (None when none since reset())."""
    lib = _lib()
    f = lib.fake_libcuda_last_function()
    name = lib.fake_libcuda_function_name(f) if f else None
    return name.decode() if name else None
