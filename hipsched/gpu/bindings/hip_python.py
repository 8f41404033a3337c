"""Runtime binding through AMD's hip-python (`from hip import hip`).

hip-python returns a tuple (hipError_t, values...) from every call; `_unwrap` is the one place that
checks the error and unpacks the values, turning handles (its Pointer types) into plain ints. Kernel
compilation goes through hipsched.gpu.bindings.compilers.HiprtcCompiler (ctypes on the same hiprtc library),
so the target allow-list that keeps ROCm 5.x hiprtc from aborting the process is shared with the
ctypes binding; for hip-python's own hiprtc module, `point_hiprtc_at` does the ROCm 5.x library fix."""
from __future__ import annotations

import ctypes

from ...errors import GpuError
from .compilers import get_compiler
from . import runtime as _rt
from .runtime import DeviceInfo, Runtime, forked_error, pack_kernel_params
from .status import gpu_error

_STREAM_NON_BLOCKING = 1
_POOL_ATTR_RELEASE_THRESHOLD = 4   # hipMemPoolAttrReleaseThreshold
# Calls that do not act on the current device (so need no hipSetDevice on a new thread first).
_DEVICELESS = frozenset({"hipGetDeviceCount", "hipSetDevice", "hipGetDevice", "hipGetDeviceProperties",
                         "hipDriverGetVersion", "hipRuntimeGetVersion", "hipPointerGetAttributes"})


def _import_hip():
    """hip-python's HIP module: `hip.hip` (hip-python 5.x-10.x), else `rocm.bindings.hip`, where 10.x
    keeps the real module (its `hip` package re-exports it) and later releases may keep it alone."""
    errors = []
    for load in (lambda: __import__("hip", fromlist=["hip"]).hip,
                 lambda: __import__("rocm.bindings", fromlist=["hip"]).hip):
        try:
            return load()
        except Exception as e:   # ImportError, or a broken install raising anything at import
            errors.append(f"{type(e).__name__}: {e}")
    raise GpuError("unavailable", f"hip-python not importable ({'; '.join(errors)})", name="hip-python-missing")


def point_hiprtc_at(library_path: str) -> None:
    """Make hip-python's hiprtc module load `library_path` (ROCm 5.x keeps hiprtc inside
    libamdhip64.so.5, where hip-python looks for libhiprtc.so). Must run before its first hiprtc call.
    Older hip-python exposes `hip.chiprtc.DLL`; newer resolves paths in rocm.bindings.util.paths."""
    try:
        import hip as hip_pkg  # deferred: hip-python is optional
        chiprtc = getattr(hip_pkg, "chiprtc", None)
        if chiprtc is not None and hasattr(chiprtc, "DLL"):
            chiprtc.DLL = library_path.encode() if isinstance(chiprtc.DLL, bytes) else library_path
            return
        from rocm.bindings.util import paths  # deferred: hip-python is optional
        original = paths.get_library_path
        if getattr(original, "_hipsched_patched", False):
            return

        def get_library_path(shortname, *args, **kwargs):
            if shortname == "hiprtc":
                return library_path.encode()
            return original(shortname, *args, **kwargs)
        get_library_path._hipsched_patched = True
        paths.get_library_path = get_library_path
    except Exception:
        pass


def _as_int(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return ctypes.cast(value.as_c_void_p(), ctypes.c_void_p).value or 0


class HipPythonRuntime(Runtime):
    name = "hip-python"
    platform = "amd"

    def __init__(self):
        self._hip = _import_hip()
        self._fork_gen = _rt.fork_generation()
        self._device = 0
        self._compiler = None
        self._infos: dict[int, DeviceInfo] = {}
        if self.device_count() < 1:
            raise GpuError("unavailable", "no device", name="hipErrorNoDevice")
        self._versions = (self._version("hipDriverGetVersion"), self._version("hipRuntimeGetVersion"))
        self.set_device(0)

    # hip-python keeps no C function pointers of its own: the same symbols, looked up in the library it
    # loaded (libamdhip64)
    _C_SYMBOLS = {"launch": "hipModuleLaunchKernel", "memcpy_htod": "hipMemcpyHtoDAsync",
                  "memcpy_dtoh": "hipMemcpyDtoHAsync", "event_create": "hipEventCreateWithFlags",
                  "event_destroy": "hipEventDestroy", "event_record": "hipEventRecord",
                  "event_synchronize": "hipEventSynchronize", "event_elapsed": "hipEventElapsedTime",
                  "stream_wait_event": "hipStreamWaitEvent", "stream_synchronize": "hipStreamSynchronize",
                  "mem_info": "hipMemGetInfo", "malloc_async": "hipMallocAsync", "free_async": "hipFreeAsync",
                  "event_query": "hipEventQuery", "get_current": "hipGetDevice", "set_current": "hipSetDevice",
                  "host_alloc": "hipHostMalloc", "host_free": "hipHostFree"}

    def c_entry_points(self):
        if self._fork_gen != _rt._fork_generation:
            return None
        from . import libs   # deferred: the library is opened by name only for the compiled call path
        lib = libs.open_library("hip")[0]
        table = {}
        for name, symbol in self._C_SYMBOLS.items():
            fn = getattr(lib, symbol, None)
            if fn is None:
                return None
            table[name] = ctypes.cast(fn, ctypes.c_void_p).value or 0
        return table, "hip", 0, self._device

    def _version(self, fname) -> int:
        try:
            return int(self._do(fname))
        except (GpuError, TypeError, ValueError):
            return 0

    def _unwrap(self, what: str, result):
        """(err, v1, v2, ...) -> None | v1 | (v1, v2, ...); GpuError with the error's name otherwise."""
        if not isinstance(result, tuple):
            result = (result,)
        err, values = result[0], result[1:]
        code = int(getattr(err, "value", err))
        if code != 0:
            raise gpu_error(getattr(err, "name", None), what, code)
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def _make_current(self):
        # hipSetDevice is per host thread, and anyone (another backend of this process on another
        # device, a finalizer's thread, PyTorch on this thread) may have changed it since our last
        # call: ask rather than remember.
        get = getattr(self._hip, "hipGetDevice", None)
        if get is not None:
            try:
                if self._unwrap("hipGetDevice", get()) == self._device:
                    return
            except GpuError:
                pass
        self._do("hipSetDevice", self._device)

    def _do(self, fname: str, *args):
        if self._fork_gen != _rt._fork_generation:
            raise forked_error(self.name)
        if fname not in _DEVICELESS:
            self._make_current()
        fn = getattr(self._hip, fname, None)
        if fn is None:
            raise GpuError("unavailable", f"hip-python lacks {fname}", name="symbol-missing")
        try:
            result = fn(*args)
        except GpuError:
            raise
        except Exception as e:   # argument conversion or loader errors inside the binding
            raise GpuError("runtime", f"{fname} raised {type(e).__name__}: {e}", name=type(e).__name__) from None
        return self._unwrap(fname, result)

    @property
    def compiler(self):
        if self._compiler is None:
            self._compiler = get_compiler("amd")
            point_hiprtc_at(getattr(self._compiler, "library_path", "libamdhip64.so.5"))
        return self._compiler

    # devices
    def device_count(self) -> int:
        return int(self._do("hipGetDeviceCount"))

    def device_info(self, index: int) -> DeviceInfo:
        if index not in self._infos:
            props = self._do("hipGetDeviceProperties", index)
            name, arch = props.name, props.gcnArchName
            name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            arch = arch.decode(errors="replace") if isinstance(arch, bytes) else str(arch)
            self._infos[index] = DeviceInfo(
                index=index, name=name, arch=arch, total_memory=int(props.totalGlobalMem), platform="amd",
                warp_size=int(props.warpSize), multiprocessors=int(props.multiProcessorCount))
        return self._infos[index]

    def set_device(self, index: int) -> None:
        self._do("hipSetDevice", index)
        self._device = index

    def driver_version(self) -> int:
        return self._versions[0]

    def loader_tag(self) -> str:
        return f"hip-driver {self._versions[0]} hip-runtime {self._versions[1]}"

    def pointer_device(self, ptr: int) -> int | None:
        try:
            attrs = self._do("hipPointerGetAttributes", ptr)
            device = int(attrs.device)
        except (GpuError, AttributeError, TypeError, ValueError):
            return None
        return device if device >= 0 else None

    def mem_info(self):
        free, total = self._do("hipMemGetInfo")
        return int(free), int(total)

    # memory
    def malloc(self, nbytes):
        return _as_int(self._do("hipMalloc", max(int(nbytes), 1)))

    def free(self, ptr):
        self._do("hipFree", ptr)

    def _pool_malloc(self, nbytes, stream):
        if getattr(self, "_no_pool", False) or getattr(self, "_no_free_async", False):
            return None
        pools = self.__dict__.setdefault("_pools", {})
        if self._device not in pools:
            try:
                pool = self._do("hipDeviceGetDefaultMemPool", self._device)
                keep = _rt.pool_keep_bytes(self.device_info(self._device).total_memory)
                attrs = getattr(self._hip, "hipMemPoolAttr", None)
                attr = getattr(attrs, "hipMemPoolAttrReleaseThreshold", _POOL_ATTR_RELEASE_THRESHOLD)
                self._do("hipMemPoolSetAttribute", pool, attr, ctypes.c_uint64(keep))
            except GpuError:
                # A pool that would hand its memory back at every synchronisation is no faster than
                # hipMalloc: without the threshold, do not use it.
                self._no_pool = True
                return None
            pools[self._device] = pool
        try:
            return _as_int(self._do("hipMallocAsync", max(int(nbytes), 1), stream))
        except GpuError as e:
            if e.kind != "unavailable":   # hip-python or the driver without it, or NotSupported
                raise
            self._no_pool = True
            return None

    def trim_pool(self, synchronize=False):
        pool = self.__dict__.get("_pools", {}).get(self._device)
        if pool is None:
            return
        if synchronize:
            self.synchronize()
        self._do("hipMemPoolTrimTo", pool, 0)

    def free_async(self, ptr, stream=0):
        if not getattr(self, "_no_free_async", False):
            try:
                self._do("hipFreeAsync", ptr, stream)
                return
            except GpuError as e:
                if e.kind != "unavailable":   # hip-python or the driver without it, or NotSupported
                    raise
                self._no_free_async = True
        super().free_async(ptr, stream)

    def memcpy_htod(self, dst, src_host_ptr, nbytes, stream=0):
        self._do("hipMemcpyHtoDAsync", dst, src_host_ptr, nbytes, stream)

    def memcpy_dtoh(self, dst_host_ptr, src, nbytes, stream=0):
        self._do("hipMemcpyDtoHAsync", dst_host_ptr, src, nbytes, stream)

    def memcpy_dtod(self, dst, src, nbytes, stream=0):
        self._do("hipMemcpyDtoDAsync", dst, src, nbytes, stream)

    def memset(self, dst, value, nbytes, stream=0):
        self._do("hipMemsetD8Async", dst, value & 0xFF, nbytes, stream)

    # streams and events
    def stream_create(self):
        return _as_int(self._do("hipStreamCreateWithFlags", _STREAM_NON_BLOCKING))

    def stream_destroy(self, stream):
        self._do("hipStreamDestroy", stream)

    def stream_synchronize(self, stream):
        self._do("hipStreamSynchronize", stream)

    def stream_wait_event(self, stream, event):
        self._do("hipStreamWaitEvent", stream, event, 0)

    def event_create(self):
        return _as_int(self._do("hipEventCreate"))

    def event_destroy(self, event):
        self._do("hipEventDestroy", event)

    def event_record(self, event, stream=0):
        self._do("hipEventRecord", event, stream)

    def event_synchronize(self, event):
        self._do("hipEventSynchronize", event)

    def event_query(self, event):
        try:
            self._do("hipEventQuery", event)
        except GpuError as e:
            if e.name == "hipErrorNotReady":
                return False
            if e.name == "symbol-missing":
                return super().event_query(event)
            raise
        return True

    def event_elapsed_ms(self, start, end):
        return float(self._do("hipEventElapsedTime", start, end))

    def synchronize(self):
        self._do("hipDeviceSynchronize")

    # modules and launches
    def module_load(self, image: bytes):
        return _as_int(self._do("hipModuleLoadData", image))

    def module_unload(self, module):
        self._do("hipModuleUnload", module)

    def module_function(self, module, name):
        return _as_int(self._do("hipModuleGetFunction", module, name.encode()))

    def launch(self, function, grid, block, args, shared_bytes=0, stream=0):
        params = pack_kernel_params(args)
        self._do("hipModuleLaunchKernel", function, *grid, *block, shared_bytes, stream,
                 ctypes.addressof(params), None)
