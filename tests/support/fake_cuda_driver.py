"""A fake libcuda for the real ctypes CUDA binding (hipsched.gpu.bindings.ctypes_api.CtypesRuntime), for tests
only. It keeps the rules of the driver that the binding must respect, so a test fails where a real GPU
would:

- the current context is per thread (cuCtxSetCurrent), and memory, modules and functions belong to
  the context current when they were made;
- a launch whose function belongs to another context fails (CUDA_ERROR_INVALID_HANDLE), and one that
  passes a pointer of another device's memory is CUDA_ERROR_ILLEGAL_ADDRESS, after which that context
  answers every call with it (sticky, as on a real GPU);
- cuModuleLoadData refuses a CUBIN whose ELF ABI version is newer than the driver's CUDA major knows
  (NVRTC 13 writes 8, NVRTC 12 writes 7) and PTX whose `.version` is newer than the driver;
- after fork() every call answers CUDA_ERROR_NOT_INITIALIZED;
- with `pools=True`, stream-ordered allocation (cuMemAllocAsync, cuMemFreeAsync, the default pool's
  release threshold and trim): freed memory stays cached in the pool and is reused; `device_bytes`
  bounds what memory in use plus the pool's cache may hold (CUDA_ERROR_OUT_OF_MEMORY beyond).

Device memory is host memory, so copies work; kernels do not run. Install it with `install(monkeypatch)`,
which makes libs.open_library("cuda") return it."""
from __future__ import annotations

import ctypes
import os
import re
import threading
import time

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_INITIALIZED, INVALID_IMAGE, INVALID_CONTEXT = 0, 1, 2, 3, 200, 201
UNSUPPORTED_PTX_VERSION, INVALID_HANDLE, ILLEGAL_ADDRESS = 222, 400, 700
NAMES = {SUCCESS: b"CUDA_SUCCESS", INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE", OUT_OF_MEMORY: b"CUDA_ERROR_OUT_OF_MEMORY",
         NOT_INITIALIZED: b"CUDA_ERROR_NOT_INITIALIZED", INVALID_IMAGE: b"CUDA_ERROR_INVALID_IMAGE",
         INVALID_CONTEXT: b"CUDA_ERROR_INVALID_CONTEXT", UNSUPPORTED_PTX_VERSION: b"CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
         INVALID_HANDLE: b"CUDA_ERROR_INVALID_HANDLE", ILLEGAL_ADDRESS: b"CUDA_ERROR_ILLEGAL_ADDRESS"}
_NAME_BUFFERS = {code: ctypes.create_string_buffer(name) for code, name in NAMES.items()}
ELF_ABI_CUDA_MAJOR = {7: 12, 8: 13}   # the CUDA major whose drivers first load a CUBIN of this ABI version


def _v(x):
    """The Python value behind what the binding passes (byref() objects, ctypes scalars, ints)."""
    obj = getattr(x, "_obj", None)
    if obj is not None:
        return obj
    return x.value if isinstance(x, ctypes._SimpleCData) else x


def _out(ref, value):
    ref._obj.value = value


class _Fn:
    """A plain callable the binding may set restype/argtypes on, as it does on ctypes functions."""

    def __init__(self, name, impl, driver):
        self.__name__, self._impl, self._driver = name, impl, driver

    def __call__(self, *args):
        d = self._driver
        with d.lock:
            d.calls.append(self.__name__)
            if d.forked and self.__name__ != "cuGetErrorName":   # a table lookup: works uninitialised
                d.calls_after_fork += 1
                return NOT_INITIALIZED
        return self._impl(*args)


class FakeCudaDriver:
    def __init__(self, version=13000, devices=2, cc=(9, 0), pools=False, device_bytes=1 << 40):
        self.version, self.devices, self.cc = version, devices, cc
        self.device_bytes = device_bytes
        self.pool_threshold: dict[int, int] = {}            # device -> release threshold set
        self.pool_cache: dict[int, list] = {}               # device -> freed (size, buffer) kept for reuse
        self.trims = 0
        self.lock = threading.RLock()
        self.calls: list[str] = []
        self.forked = False
        self.calls_after_fork = 0
        self.tls = threading.local()
        self.memory: dict[int, tuple[int, object]] = {}     # ptr -> (device, host buffer)
        self.modules: dict[int, int] = {}                   # module -> context
        self.functions: dict[int, tuple[int, str]] = {}     # function -> (context, name)
        self.launches: list[tuple[int, str]] = []           # (device current at launch, kernel name)
        self.module_loads: list[tuple[int, int]] = []       # (device, status)
        self.dead: set[int] = set()                         # contexts hit by a sticky error
        self.event_times: dict[int, float] = {}             # event -> perf_counter() when last recorded
        self._next = 1
        for name in dir(self):
            if name.startswith("cu") and callable(getattr(self, name)):
                setattr(self, name, _Fn(name, getattr(self, name), self))
        if pools:
            for name in dir(self):
                if name.startswith("_pool_cu"):
                    setattr(self, name[6:], _Fn(name[6:], getattr(self, name), self))
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self):
        self.forked = True
        self.lock = threading.RLock()

    # helpers
    @staticmethod
    def ctx_of(device):
        return 0x1000 + device

    def _current(self):
        return getattr(self.tls, "ctx", None)

    def current_device(self):
        ctx = self._current()
        return None if ctx is None else ctx - 0x1000

    def _handle(self):
        self._next += 1
        return 0x5000 + self._next * 16

    def device_of(self, ptr):
        for base, (dev, buf) in self.memory.items():
            if base <= ptr < base + ctypes.sizeof(buf):
                return dev
        return None

    def _needs_ctx(self):
        ctx = self._current()
        if ctx is None:
            return INVALID_CONTEXT
        if ctx in self.dead:
            return ILLEGAL_ADDRESS
        return SUCCESS

    # init, versions, errors
    def cuInit(self, flags):
        return SUCCESS

    def cuDriverGetVersion(self, out):
        _out(out, self.version)
        return SUCCESS

    def cuGetErrorName(self, code, out):
        buf = _NAME_BUFFERS.get(_v(code))
        if buf is None:
            return INVALID_VALUE
        _v(out).value = buf.value
        return SUCCESS

    # devices
    def cuDeviceGetCount(self, out):
        _out(out, self.devices)
        return SUCCESS

    def cuDeviceGet(self, out, index):
        if not 0 <= _v(index) < self.devices:
            return INVALID_VALUE
        _out(out, _v(index))
        return SUCCESS

    def cuDeviceGetName(self, buf, n, dev):
        ctypes.memmove(buf, f"FakeGPU {_v(dev)}".encode() + b"\0", 10)
        return SUCCESS

    def cuDeviceTotalMem_v2(self, out, dev):
        _out(out, 16 << 30)
        return SUCCESS

    def cuDeviceGetAttribute(self, out, attr, dev):
        _out(out, {75: self.cc[0], 76: self.cc[1], 16: 4, 10: 32}.get(_v(attr), 0))
        return SUCCESS

    def cuDevicePrimaryCtxRetain(self, out, dev):
        _out(out, self.ctx_of(_v(dev)))
        return SUCCESS

    def cuCtxGetCurrent(self, out):
        _out(out, self._current())
        return SUCCESS

    def cuCtxSetCurrent(self, ctx):
        self.tls.ctx = _v(ctx) or None
        return SUCCESS

    def cuCtxSynchronize(self):
        return self._needs_ctx()

    def cuMemGetInfo_v2(self, free, total):
        if self._needs_ctx():
            return self._needs_ctx()
        _out(free, 8 << 30)
        _out(total, 16 << 30)
        return SUCCESS

    # memory
    def cuMemAlloc_v2(self, out, nbytes):
        status = self._needs_ctx()
        if status:
            return status
        buf = ctypes.create_string_buffer(max(int(_v(nbytes)), 1))
        ptr = ctypes.addressof(buf)
        self.memory[ptr] = (self.current_device(), buf)
        _out(out, ptr)
        return SUCCESS

    def cuMemFree_v2(self, ptr):
        return SUCCESS if self.memory.pop(_v(ptr), None) is not None else INVALID_VALUE

    # stream-ordered allocation (pools=True): frees are complete at once (kernels do not run here)
    def _held_bytes(self, device):
        return sum(ctypes.sizeof(b) for d, b in self.memory.values() if d == device) + \
            sum(n for n, _ in self.pool_cache.get(device, []))

    def _pool_cuMemAllocAsync(self, out, nbytes, stream):
        status = self._needs_ctx()
        if status:
            return status
        n, dev = max(int(_v(nbytes)), 1), self.current_device()
        cache = self.pool_cache.setdefault(dev, [])
        hit = next((i for i, (size, _) in enumerate(cache) if size >= n), None)
        if hit is not None:
            buf = cache.pop(hit)[1]
        elif self._held_bytes(dev) + n > self.device_bytes:
            return OUT_OF_MEMORY
        else:
            buf = ctypes.create_string_buffer(n)
        self.memory[ctypes.addressof(buf)] = (dev, buf)
        _out(out, ctypes.addressof(buf))
        return SUCCESS

    def _pool_cuMemFreeAsync(self, ptr, stream):
        entry = self.memory.pop(_v(ptr), None)
        if entry is None:
            return INVALID_VALUE
        dev, buf = entry
        self.pool_cache.setdefault(dev, []).append((ctypes.sizeof(buf), buf))
        return SUCCESS

    def _pool_cuDeviceGetDefaultMemPool(self, out, dev):
        _out(out, 0x9000 + _v(dev))
        return SUCCESS

    def _pool_cuMemPoolSetAttribute(self, pool, attr, value):
        if _v(attr) != 4:   # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, the only one the binding sets
            return INVALID_VALUE
        self.pool_threshold[_v(pool) - 0x9000] = _v(value).value
        return SUCCESS

    def _pool_cuMemPoolTrimTo(self, pool, keep):
        self.trims += 1
        self.pool_cache[_v(pool) - 0x9000] = []
        return SUCCESS

    def _copy(self, dst, src, n):
        status = self._needs_ctx()
        if status:
            return status
        ctypes.memmove(_v(dst), _v(src), _v(n))
        return SUCCESS

    def cuMemcpyHtoDAsync_v2(self, dst, src, n, stream):
        return self._copy(dst, src, n)

    def cuMemcpyDtoHAsync_v2(self, dst, src, n, stream):
        return self._copy(dst, src, n)

    def cuMemcpyDtoDAsync_v2(self, dst, src, n, stream):
        return self._copy(dst, src, n)

    def cuMemsetD8Async(self, dst, value, n, stream):
        status = self._needs_ctx()
        if status:
            return status
        ctypes.memset(_v(dst), _v(value), _v(n))
        return SUCCESS

    def cuPointerGetAttribute(self, out, attr, ptr):
        dev = self.device_of(_v(ptr))
        if _v(attr) != 9 or dev is None:
            return INVALID_VALUE
        _out(out, dev)
        return SUCCESS

    # streams and events
    def _new(self, out):
        status = self._needs_ctx()
        if status:
            return status
        _out(out, self._handle())
        return SUCCESS

    def cuStreamCreate(self, out, flags):
        return self._new(out)

    def cuEventCreate(self, out, flags):
        return self._new(out)

    def _on_ctx(self, *args):
        return self._needs_ctx()

    cuStreamDestroy_v2 = cuStreamSynchronize = cuStreamWaitEvent = cuEventDestroy_v2 = _on_ctx
    cuEventSynchronize = cuEventQuery = cuModuleUnload = _on_ctx

    def cuEventRecord(self, event, stream):
        status = self._needs_ctx()
        if not status:   # kernels do not run here: the work before an event is done when it is recorded
            self.event_times[_v(event)] = time.perf_counter()
        return status

    def cuEventElapsedTime(self, out, start, end):
        status = self._needs_ctx()
        if status:
            return status
        a, b = self.event_times.get(_v(start)), self.event_times.get(_v(end))
        if a is None or b is None:   # as the driver says of an event never recorded
            return INVALID_HANDLE
        _out(out, (b - a) * 1e3)
        return SUCCESS

    # modules and launches
    def _loadable(self, image: bytes) -> int:
        if image[:4] == b"\x7fELF":
            need = ELF_ABI_CUDA_MAJOR.get(image[8], 99)
            return SUCCESS if need <= self.version // 1000 else INVALID_IMAGE
        m = re.search(rb"\.version\s+(\d+)\.(\d+)", image)
        if not m:
            return INVALID_IMAGE
        major, minor = int(m.group(1)), int(m.group(2))
        return SUCCESS if (major + 4) * 1000 + minor * 10 <= self.version else UNSUPPORTED_PTX_VERSION

    def cuModuleLoadData(self, out, image):
        status = self._needs_ctx() or self._loadable(bytes(_v(image)))
        self.module_loads.append((self.current_device(), status))
        if status:
            return status
        handle = self._handle()
        self.modules[handle] = self._current()
        _out(out, handle)
        return SUCCESS

    def cuModuleGetFunction(self, out, module, name):
        ctx = self.modules.get(_v(module))
        if ctx is None:
            return INVALID_HANDLE
        handle = self._handle()
        self.functions[handle] = (ctx, bytes(_v(name)).decode())
        _out(out, handle)
        return SUCCESS

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        status = self._needs_ctx()
        if status:
            return status
        ctx = self._current()
        owner, name = self.functions.get(_v(f), (None, None))
        if owner != ctx:
            return INVALID_HANDLE
        for i in range(len(params)):
            address = params[i]
            value = ctypes.c_void_p.from_address(address).value if address else None
            dev = self.device_of(value) if value else None
            if dev is not None and dev != self.current_device():
                self.dead.add(ctx)
                return ILLEGAL_ADDRESS
        self.launches.append((self.current_device(), name))
        return SUCCESS


def install(monkeypatch, driver: FakeCudaDriver):
    """Make the ctypes binding open `driver` as libcuda."""
    from hipsched.gpu.bindings import libs
    real = libs.open_library

    def open_library(kind):
        if kind == "cuda":
            return driver, "/fake/libcuda.so.1"
        return real(kind)
    monkeypatch.setattr(libs, "open_library", open_library)
    return driver


def fake_nvrtc(major: int, minor: int, archs=(75, 80, 86, 89, 90)):
    """An NvrtcCompiler of version major.minor that needs no library: a CUBIN is an ELF stub with the
    ABI version that NVRTC release writes (8 from CUDA 13 on, else 7), PTX declares the ISA it writes."""
    from hipsched.gpu.bindings.compilers import NvrtcCompiler

    class FakeNvrtc(NvrtcCompiler):
        def __init__(self):
            self.library_path = f"/fake/libnvrtc.so.{major}"
            self._version = None
            self.compiles = []

        def version_tuple(self):
            return (major, minor)

        def supported_archs(self):
            return list(archs)

        def compile(self, source, name, arch, options=()):
            self.compiles.append((name, arch))
            if arch.startswith("sm_"):
                header = b"\x7fELF" + bytes([2, 1, 1, 65 if major >= 13 else 51, 8 if major >= 13 else 7])
                return header + bytes(64 - len(header))
            return f".version {major - 4}.{minor}\n.target sm_{arch[8:]}\n".encode()

        def compile_with_log(self, source, name, arch, options=()):
            return self.compile(source, name, arch, options), ""
    return FakeNvrtc()
