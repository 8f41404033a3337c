"""ctypes bindings to the HIP runtime (libamdhip64) and the CUDA driver API (libcuda).

The HIP module API mirrors the CUDA driver API argument for argument (hipModuleLoadData /
cuModuleLoadData, hipModuleLaunchKernel / cuLaunchKernel, hipMemcpyHtoDAsync / cuMemcpyHtoDAsync_v2,
...), so one class holds the one code path and each vendor is a symbol table (vendor_tables.py). Every
wrapper has the same shape: call, then one status check that turns a non-zero code into a GpuError
carrying the runtime's own error name."""
from __future__ import annotations

import ctypes
import re
import threading
from ctypes import POINTER as P
from ctypes import c_char_p, c_float, c_int, c_size_t, c_void_p

from ...errors import GpuError
from .compilers import get_compiler
from . import libs
from . import runtime as _rt
from .runtime import DeviceInfo, Runtime, forked_error, pack_kernel_params
from .status import gpu_error
from .vendor_tables import (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CUDA_ATTR, CUDA_OPTIONAL, CUDA_SYMBOLS, EVENT_DEFAULT,
                            HIP_ATTR, HIP_OPTIONAL, HIP_SYMBOLS, NOT_READY, OPTIONAL_SIGNATURES,
                            POOL_ATTR_RELEASE_THRESHOLD, POOL_FNS, SIGNATURES, STREAM_NON_BLOCKING)

_GFX_RE = re.compile(rb"gfx[0-9a-f]+(?::[a-z]+[+-])*")


def _address(fn) -> int:
    """The C address of a ctypes function (the library's own entry point)."""
    return ctypes.cast(fn, c_void_p).value or 0


class CtypesRuntime(Runtime):
    """HIP or CUDA through ctypes. Construct with `CtypesRuntime("hip")` or `("cuda")`; the
    constructor initialises the driver and raises GpuError(kind="unavailable") if there is no
    library or no device. `for_device(i)` gives a runtime on device i sharing this driver."""

    def __init__(self, vendor: str):
        if vendor not in ("hip", "cuda"):
            raise ValueError(f"vendor must be 'hip' or 'cuda', got {vendor!r}")
        self.vendor = vendor
        self.name = vendor
        self.platform = "amd" if vendor == "hip" else "nvidia"
        self._symbols = HIP_SYMBOLS if vendor == "hip" else CUDA_SYMBOLS
        self._attr = HIP_ATTR if vendor == "hip" else CUDA_ATTR
        try:
            self._lib, self.library_path = libs.open_library(vendor)
        except libs.LibraryNotFound as e:
            raise GpuError("unavailable", str(e), name=f"{vendor}-library-missing") from None
        self._fns = {}
        for canon, symbol in self._symbols.items():
            fn = getattr(self._lib, symbol, None)
            if fn is None:
                raise GpuError("unavailable", f"{self.library_path} lacks {symbol}", name="symbol-missing")
            fn.restype = c_int
            fn.argtypes = SIGNATURES[canon]
            self._fns[canon] = fn
        self._setup_error_names()
        self._fork_gen = _rt.fork_generation()
        self._device = 0
        # Shared by every for_device() view: one retained primary context per device.
        self._contexts: dict[int, int] = {}
        # Reentrant: free() runs from finalizers, and the collector may run one on a thread that is
        # inside _primary_context (any allocation can trigger it); a second retain is harmless.
        self._ctx_lock = threading.RLock()
        self._bind_context_calls()
        self._bind_optional()
        self._compiler = None
        self._infos: dict[int, DeviceInfo] = {}
        if vendor == "hip":
            self.device_count()   # says hipErrorNoDevice where hipInit would only say InvalidDevice
        self._call("init", 0)
        if self.device_count() < 1:
            raise GpuError("unavailable", "no device", name="hipErrorNoDevice" if vendor == "hip" else
                           "CUDA_ERROR_NO_DEVICE")
        self._driver_version = self._query_version("driver_version")
        self._runtime_version = self._query_version("hipRuntimeGetVersion") if vendor == "hip" else 0
        self.set_device(0)

    # ------------------------------------------------------------------ plumbing
    def _setup_error_names(self):
        if self.vendor == "hip":
            fn = self._lib.hipGetErrorName
            fn.restype, fn.argtypes = c_char_p, [c_int]
            self._error_name = lambda code: (fn(code) or b"").decode() or None
        else:
            fn = self._lib.cuGetErrorName
            fn.restype, fn.argtypes = c_int, [c_int, P(c_char_p)]

            def name(code):
                out = c_char_p()
                return out.value.decode() if fn(code, ctypes.byref(out)) == 0 and out.value else None
            self._error_name = name

    def _call(self, canon: str, *args):
        if self._fork_gen != _rt._fork_generation:
            raise forked_error(self.name)
        try:
            status = self._fns[canon](*args)
        except (ctypes.ArgumentError, TypeError, OverflowError) as e:   # bad handle or size from a caller
            raise GpuError("runtime", f"{self._symbols[canon]}: bad argument: {e}", name="bad-argument") from None
        if status != 0:
            raise gpu_error(self._error_name(status), self._symbols[canon], status)

    def _bind_optional(self):
        self._optional = HIP_OPTIONAL if self.vendor == "hip" else CUDA_OPTIONAL
        self._no_free_async = False
        self._pools = {}   # device index -> its default memory pool, once its release threshold is set
        for canon, symbol in self._optional.items():
            fn = getattr(self._lib, symbol, None)
            if fn is not None:
                fn.restype, fn.argtypes = c_int, OPTIONAL_SIGNATURES[canon]
                self._fns[canon] = fn

    def _bind_context_calls(self):
        def bind(symbol, argtypes):
            fn = getattr(self._lib, symbol, None)
            if fn is None:
                raise GpuError("unavailable", f"{self.library_path} lacks {symbol}", name="symbol-missing")
            fn.restype, fn.argtypes = c_int, argtypes
            return fn
        if self.vendor == "cuda":
            self._get_current = bind("cuCtxGetCurrent", [P(c_void_p)])
            self._set_current = bind("cuCtxSetCurrent", [c_void_p])
        else:
            self._get_current = bind("hipGetDevice", [P(c_int)])
            self._set_current = bind("hipSetDevice", [c_int])

    def _primary_context(self, index) -> int:
        ctx = self._contexts.get(index)
        if ctx is None:
            with self._ctx_lock:
                ctx = self._contexts.get(index)
                if ctx is None:
                    dev, handle = c_int(), c_void_p()
                    self._raw("cuDeviceGet", [P(c_int), c_int], ctypes.byref(dev), index)
                    self._raw("cuDevicePrimaryCtxRetain", [P(c_void_p), c_int], ctypes.byref(handle), dev.value)
                    ctx = self._contexts[index] = handle.value
        return ctx

    def _ctx(self):
        # What is current is per thread (cuCtxSetCurrent, hipSetDevice) and anyone may change it between
        # two of our calls: another backend of this process on another device, or PyTorch/CuPy on the
        # same thread. So the driver is asked each time, not a cache of what we last set: launching
        # into another device's context with this device's pointers is CUDA_ERROR_ILLEGAL_ADDRESS,
        # which kills that context.
        if self._fork_gen != _rt._fork_generation:
            raise forked_error(self.name)
        if self.vendor == "cuda":
            want = self._primary_context(self._device)
            cur = c_void_p()
            status = self._get_current(ctypes.byref(cur))
            if status != 0:
                raise gpu_error(self._error_name(status), "cuCtxGetCurrent", status)
            if cur.value != want:
                status = self._set_current(c_void_p(want))
                if status != 0:
                    raise gpu_error(self._error_name(status), "cuCtxSetCurrent", status)
        else:
            cur = c_int(-1)
            status = self._get_current(ctypes.byref(cur))
            if status != 0 or cur.value != self._device:
                status = self._set_current(self._device)
                if status != 0:
                    raise gpu_error(self._error_name(status), "hipSetDevice", status)

    def _query_version(self, what) -> int:
        v = c_int(0)
        try:
            if what in self._fns:
                self._call(what, ctypes.byref(v))
            else:
                self._raw(what, [P(c_int)], ctypes.byref(v))
        except (GpuError, AttributeError):
            return 0
        return v.value

    def _raw(self, symbol, argtypes, *args):
        if self._fork_gen != _rt._fork_generation:
            raise forked_error(self.name)
        fn = getattr(self._lib, symbol)
        fn.restype, fn.argtypes = c_int, argtypes
        status = fn(*args)
        if status != 0:
            raise gpu_error(self._error_name(status), symbol, status)

    @property
    def compiler(self):
        if self._compiler is None:
            # NVRTC: the one whose code this driver loads (see compilers.select_nvrtc)
            self._compiler = get_compiler(self.platform, driver_version=self._driver_version or None
                                          if self.vendor == "cuda" else None)
        return self._compiler

    def driver_version(self) -> int:
        return self._driver_version

    def loader_tag(self) -> str:
        if self.vendor == "cuda":
            return f"cuda-driver {self._driver_version}"
        return f"hip-driver {self._driver_version} hip-runtime {self._runtime_version}"

    def c_entry_points(self):
        if self._fork_gen != _rt._fork_generation or self._no_free_async or \
                any(name not in self._fns for name in self.C_ENTRY_POINTS):
            return None   # a driver without stream-ordered allocation: the Python path handles it
        table = {name: _address(self._fns[name]) for name in self.C_ENTRY_POINTS}
        table["get_current"] = _address(self._get_current)
        table["set_current"] = _address(self._set_current)
        # page-locked staging for host arrays (optional: without it host arrays take the glue)
        for name, symbol in zip(("host_alloc", "host_free"), ("cuMemAllocHost_v2", "cuMemFreeHost") if
                                self.vendor == "cuda" else ("hipHostMalloc", "hipHostFree")):
            fn = getattr(self._lib, symbol, None)
            if fn is not None:
                table[name] = _address(fn)
        context = self._primary_context(self._device) if self.vendor == "cuda" else 0
        return table, self.vendor, context, self._device

    def pointer_device(self, ptr: int) -> int | None:
        if not ptr:
            return None
        self._ctx()
        if self.vendor == "cuda":
            ordinal = c_int(-1)
            fn = getattr(self._lib, "cuPointerGetAttribute", None)
            if fn is None:
                return None
            fn.restype, fn.argtypes = c_int, [c_void_p, c_int, ctypes.c_uint64]
            if fn(ctypes.byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_uint64(ptr)) != 0:
                return None
            return ordinal.value if ordinal.value >= 0 else None
        fn = getattr(self._lib, "hipPointerGetAttributes", None)
        if fn is None:
            return None
        # hipPointerAttribute_t starts {enum memoryType/type; int device; ...} in ROCm 5 and 6 alike
        attrs = ctypes.create_string_buffer(128)
        fn.restype, fn.argtypes = c_int, [c_void_p, c_void_p]
        if fn(attrs, c_void_p(ptr)) != 0:
            return None
        device = c_int.from_buffer(attrs, 4).value
        return device if device >= 0 else None

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int:
        n = c_int()
        self._call("device_count", ctypes.byref(n))
        return n.value

    def _device_handle(self, index):
        if self.vendor == "cuda":
            dev = c_int()
            self._raw("cuDeviceGet", [P(c_int), c_int], ctypes.byref(dev), index)
            return dev.value
        return index

    def _attribute(self, key, dev) -> int:
        v = c_int()
        self._call("device_attribute", ctypes.byref(v), self._attr[key], dev)
        return v.value

    def _amd_arch(self, index) -> str:
        # hipDeviceProp_t changes layout between ROCm releases; its gcnArchName is the only "gfx..."
        # string in it, so it is found by pattern rather than by offset.
        buf = ctypes.create_string_buffer(16384)
        for symbol in ("hipGetDevicePropertiesR0600", "hipGetDeviceProperties"):
            if hasattr(self._lib, symbol):
                self._raw(symbol, [c_void_p, c_int], buf, index)
                # The longest match: the name field may also say "gfxNNNN", without the features.
                found = _GFX_RE.findall(buf.raw)
                if found:
                    return max(found, key=len).decode()
        raise GpuError("runtime", "could not read the device's gfx architecture", name="no-arch")

    def device_info(self, index: int) -> DeviceInfo:
        if index in self._infos:
            return self._infos[index]
        dev = self._device_handle(index)
        name = ctypes.create_string_buffer(256)
        self._call("device_name", name, 256, dev)
        total = c_size_t()
        self._call("device_total_mem", ctypes.byref(total), dev)
        if self.vendor == "cuda":
            arch = f"sm_{self._attribute('cc_major', dev)}{self._attribute('cc_minor', dev)}"
        else:
            arch = self._amd_arch(index)
        warp = 64 if arch.startswith("gfx9") or arch.startswith("gfx8") or arch.startswith("gfx7") else 32
        info = DeviceInfo(index=index, name=name.value.decode(errors="replace"), arch=arch,
                          total_memory=total.value, platform=self.platform, warp_size=warp,
                          multiprocessors=self._attribute("multiprocessors", dev))
        self._infos[index] = info
        return info

    def set_device(self, index: int) -> None:
        """Point this object at device `index` (every thread using it follows). Two users of one
        process on different devices each take their own `for_device` view instead."""
        if not 0 <= index < self.device_count():
            raise GpuError("unavailable", f"device {index} does not exist", name="invalid-device")
        self._device = index
        self._ctx()

    def mem_info(self):
        self._ctx()
        free, total = c_size_t(), c_size_t()
        self._call("mem_info", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    # ------------------------------------------------------------------ memory
    def malloc(self, nbytes: int) -> int:
        self._ctx()
        ptr = c_void_p()
        self._call("malloc", ctypes.byref(ptr), max(int(nbytes), 1))
        return ptr.value or 0

    def free(self, ptr: int) -> None:
        self._ctx()   # may run from a finalizer on any thread
        self._call("free", c_void_p(ptr))

    def free_async(self, ptr: int, stream: int = 0) -> None:
        if "free_async" not in self._fns or self._no_free_async:
            return super().free_async(ptr, stream)
        self._ctx()   # runs from finalizers, on any thread
        try:
            fn, symbol = self._fns["free_async"], self._optional["free_async"]
            status = fn(c_void_p(ptr), c_void_p(stream))
        except (ctypes.ArgumentError, TypeError, OverflowError) as e:
            raise GpuError("runtime", f"free_async: bad argument: {e}", name="bad-argument") from None
        if status == 0:
            return
        err = gpu_error(self._error_name(status), symbol, status)
        if err.kind != "unavailable":   # NOT_SUPPORTED: a device without memory pools
            raise err
        self._no_free_async = True
        super().free_async(ptr, stream)

    def _pool_malloc(self, nbytes: int, stream: int):
        if any(f not in self._fns for f in POOL_FNS) or self._no_free_async or "free_async" not in self._fns:
            return None
        self._ctx()
        if self._pools.get(self._device) is None:
            try:
                self._pool_of(self._device)
            except GpuError:
                # NOT_SUPPORTED (a device without memory pools), or a pool whose release threshold
                # cannot be set, which would hand its memory back at every synchronisation and be
                # no faster than malloc
                self._fns.pop("malloc_async", None)
                return None
        ptr = c_void_p()
        self._call_optional("malloc_async", ctypes.byref(ptr), max(int(nbytes), 1), c_void_p(stream))
        return ptr.value or 0

    def _pool_of(self, index: int) -> int:
        """Device `index`'s default memory pool, told to keep freed memory (up to pool_keep_bytes)
        across synchronisations instead of releasing it to the driver at each one."""
        dev, pool = c_int(), c_void_p()
        if self.vendor == "cuda":
            self._raw("cuDeviceGet", [P(c_int), c_int], ctypes.byref(dev), index)
        else:
            dev.value = index
        self._call_optional("default_pool", ctypes.byref(pool), dev.value)
        keep = ctypes.c_uint64(_rt.pool_keep_bytes(self.device_info(index).total_memory))
        self._call_optional("pool_set_attribute", pool, POOL_ATTR_RELEASE_THRESHOLD, ctypes.byref(keep))
        self._pools[index] = pool.value
        return pool.value

    def trim_pool(self, synchronize: bool = False) -> None:
        pool = self._pools.get(self._device)
        if pool is None:
            return
        if synchronize:
            self.synchronize()
        self._call_optional("pool_trim", c_void_p(pool), 0)

    def _call_optional(self, canon: str, *args):
        status = self._fns[canon](*args)
        if status != 0:
            raise gpu_error(self._error_name(status), self._optional[canon], status)

    def memcpy_htod(self, dst, src_host_ptr, nbytes, stream=0):
        self._ctx()
        self._call("memcpy_htod", c_void_p(dst), c_void_p(src_host_ptr), nbytes, c_void_p(stream))

    def memcpy_dtoh(self, dst_host_ptr, src, nbytes, stream=0):
        self._ctx()
        self._call("memcpy_dtoh", c_void_p(dst_host_ptr), c_void_p(src), nbytes, c_void_p(stream))

    def memcpy_dtod(self, dst, src, nbytes, stream=0):
        self._ctx()
        self._call("memcpy_dtod", c_void_p(dst), c_void_p(src), nbytes, c_void_p(stream))

    def memset(self, dst, value, nbytes, stream=0):
        self._ctx()
        self._call("memset_d8", c_void_p(dst), value & 0xFF, nbytes, c_void_p(stream))

    # ------------------------------------------------------------------ streams and events
    def stream_create(self) -> int:
        self._ctx()
        s = c_void_p()
        self._call("stream_create", ctypes.byref(s), STREAM_NON_BLOCKING)
        return s.value or 0

    def stream_destroy(self, stream):
        self._ctx()
        self._call("stream_destroy", c_void_p(stream))

    def stream_synchronize(self, stream):
        self._ctx()
        self._call("stream_synchronize", c_void_p(stream))

    def stream_wait_event(self, stream, event):
        self._ctx()
        self._call("stream_wait_event", c_void_p(stream), c_void_p(event), 0)

    def event_create(self) -> int:
        self._ctx()
        e = c_void_p()
        self._call("event_create", ctypes.byref(e), EVENT_DEFAULT)
        return e.value or 0

    def event_destroy(self, event):
        self._ctx()
        self._call("event_destroy", c_void_p(event))

    def event_record(self, event, stream=0):
        self._ctx()
        self._call("event_record", c_void_p(event), c_void_p(stream))

    def event_synchronize(self, event):
        self._ctx()
        self._call("event_synchronize", c_void_p(event))

    def event_query(self, event) -> bool:
        if "event_query" not in self._fns:
            return super().event_query(event)
        self._ctx()
        status = self._fns["event_query"](c_void_p(event))
        if status == NOT_READY:
            return False
        if status != 0:
            raise gpu_error(self._error_name(status), self._optional["event_query"], status)
        return True

    def event_elapsed_ms(self, start, end) -> float:
        self._ctx()
        ms = c_float()
        self._call("event_elapsed", ctypes.byref(ms), c_void_p(start), c_void_p(end))
        return ms.value

    def synchronize(self):
        self._ctx()
        self._call("synchronize")

    # ------------------------------------------------------------------ modules and launches
    def module_load(self, image: bytes) -> int:
        self._ctx()
        m = c_void_p()
        self._call("module_load", ctypes.byref(m), image)
        return m.value or 0

    def module_unload(self, module):
        self._ctx()
        self._call("module_unload", c_void_p(module))

    def module_function(self, module, name) -> int:
        self._ctx()
        f = c_void_p()
        self._call("module_function", ctypes.byref(f), c_void_p(module), name.encode())
        return f.value or 0

    def launch(self, function, grid, block, args, shared_bytes=0, stream=0):
        self._ctx()
        params = pack_kernel_params(args)
        self._call("launch", c_void_p(function), *grid, *block, shared_bytes, c_void_p(stream), params, None)
