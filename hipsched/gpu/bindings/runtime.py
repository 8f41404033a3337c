"""The small runtime interface every GPU binding implements (hip-python, ctypes HIP, ctypes CUDA).

Handles (device pointers, streams, events, modules, functions) are plain Python ints so the rest of
hipsched never sees binding-specific types. Every method raises GpuError (hipsched.errors) with the
runtime's own error name on failure; nothing here may crash the process or raise anything else.

A Compiler is separate from a Runtime because compiling needs no device: `python -m hipsched
compile` and CI use a Compiler alone."""
from __future__ import annotations

import collections
import copy
import ctypes
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ...errors import GpuError

# Bumped in a forked child. CUDA and HIP state does not survive fork(): a child that touches the
# parent's driver gets CUDA_ERROR_NOT_INITIALIZED (or, on ROCm, may hang), so every binding compares
# the generation it was created in with this one before each driver call.
_fork_generation = 0


def _after_fork_in_child():
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation() -> int:
    """How many fork()s separate this process from the first image (0 unless this is a forked child)."""
    return _fork_generation


def forked_error(name: str):
    """The GpuError a runtime created before a fork() raises in the child instead of calling the driver."""
    return GpuError("unavailable", f"forked child (pid {os.getpid()}): the {name} runtime was initialised in the "
                                   f"parent process and the driver cannot be used again after fork(); start "
                                   f"GPU workers with multiprocessing's 'spawn' or 'forkserver' method",
                    name="forked-child")


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    arch: str            # full arch string: "gfx90a:sramecc+:xnack-" or "sm_90"
    total_memory: int    # bytes
    platform: str        # "amd" | "nvidia"
    warp_size: int       # 64 on gfx9 (CDNA/GCN), 32 on gfx10+ and NVIDIA
    multiprocessors: int


class Compiler(ABC):
    """Turns kernel source into a loadable code object for one target, with no device needed."""

    name: str            # "hiprtc" | "nvrtc"
    platform: str        # "amd" | "nvidia"

    @abstractmethod
    def version(self) -> str:
        """Compiler version string; part of the code-object cache key."""

    @abstractmethod
    def supports(self, arch: str) -> bool:
        """False for targets this compiler version is known to reject (or to abort the process on)."""

    @abstractmethod
    def compile(self, source: str, name: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
        """Compile `source` (prelude already prepended) for `arch`; returns the code object (HSACO on
        AMD, CUBIN on NVIDIA). Raises GpuError(kind="compile") with the compiler log on failure."""


class Runtime(ABC):
    """One GPU runtime binding bound to one current device."""

    name: str            # "hip-python" | "hip" | "cuda"
    platform: str        # "amd" | "nvidia"
    compiler: Compiler

    # devices
    @abstractmethod
    def device_count(self) -> int: ...
    @abstractmethod
    def device_info(self, index: int) -> DeviceInfo: ...
    @abstractmethod
    def set_device(self, index: int) -> None: ...
    def current_device(self) -> int:
        """Index of the device this object launches on (0 until set_device); bindings store it as `_device`."""
        return getattr(self, "_device", 0)

    def for_device(self, index: int) -> "Runtime":
        """A runtime bound to device `index` that shares this one's driver, leaving this one's device
        alone. Each call makes its own device current on the calling thread first, so two of them (two
        backends on two devices) never retarget each other's work, whatever thread runs it."""
        if index == self.current_device():
            return self
        if not hasattr(self, "_device"):
            raise GpuError("unavailable", f"the {self.name} runtime cannot bind device {index}", name="invalid-device")
        if not 0 <= index < self.device_count():
            raise GpuError("unavailable", f"device {index} does not exist", name="invalid-device")
        view = copy.copy(self)
        view._device = index
        # the compiled call path's Driver (gpu/bindings/_driver.pyx's driver_for keeps it on the runtime) is
        # bound to this one's device: its context, its index. A copy of it would replay device `index`'s
        # plans in this device's context (CUDA_ERROR_INVALID_HANDLE at each launch); the view makes its own
        view.__dict__.pop("_c_driver", None)
        return view

    # What the compiled call path (gpu/bindings/_driver.pyx) calls, by the ctypes binding's canonical names; each
    # entry has the CUDA driver API's C signature (HIP's module API mirrors it argument for argument),
    # plus "get_current"/"set_current": cuCtxGetCurrent/cuCtxSetCurrent, or hipGetDevice/hipSetDevice, and
    # optionally "host_alloc"/"host_free" for page-locked staging: cuMemAllocHost_v2/cuMemFreeHost, or
    # hipHostMalloc (its third argument, flags, 0)/hipHostFree.
    C_ENTRY_POINTS = ("launch", "memcpy_htod", "memcpy_dtoh", "event_create", "event_destroy", "event_record",
                      "event_synchronize", "event_elapsed", "stream_wait_event", "stream_synchronize", "mem_info",
                      "malloc_async", "free_async", "event_query")

    def c_entry_points(self):
        """(table, vendor, context, device) for the compiled call path: {name: address} of every
        C_ENTRY_POINTS entry and the current-device pair, "cuda" or "hip", the primary context to make
        current (CUDA) and the device index (HIP); None when this runtime has no C functions to offer
        (the Python methods then serve every call)."""
        return None

    def pointer_device(self, ptr: int) -> int | None:
        """The device a device pointer was allocated on, or None when the driver cannot say."""
        return None

    def driver_version(self) -> int:
        """The driver's version as its API reports it: CUDA 1000 * major + 10 * minor (12040 is 12.4);
        HIP hipDriverGetVersion. 0 when unknown."""
        return 0

    def loader_tag(self) -> str:
        """What loads code objects here (driver, and runtime on HIP, with versions): part of the
        code-object cache key. Empty when unknown."""
        return ""
    @abstractmethod
    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes on the current device."""

    # memory
    @abstractmethod
    def malloc(self, nbytes: int) -> int: ...
    @abstractmethod
    def free(self, ptr: int) -> None:
        """Free at once. Whether the driver first waits for queued work that may still use `ptr` is not
        promised (cuMemFree "may" synchronise), and where it does it stalls the whole device: memory
        that queued work may still read goes through free_async instead."""

    def malloc_async(self, nbytes: int, stream: int = 0) -> int:
        """Allocate `nbytes` in stream order on `stream`, from the device's memory pool (cuMemAllocAsync /
        hipMallocAsync): usable by work queued on `stream` from now on, and by other streams once ordered
        after that point. The pool keeps freed memory for the next allocation instead of handing it back
        to the driver, so a call's result costs microseconds where malloc costs 100 us or more and
        free_async of malloc'd memory as much again (measured on an H100: docs/design/gpu-runtime.md, "Runtimes").

        Without a pool (the driver or device has none: `_pool_malloc` gives None) it is malloc."""
        try:
            ptr = self._pool_malloc(nbytes, stream)
        except GpuError as e:
            if e.kind != "oom":
                raise
            # What the pool holds for reuse counts against the device like memory in use: give it back
            # (after the frees queued so far have run) and try once more, as CuPy and PyTorch do.
            self.trim_pool(synchronize=True)
            ptr = self._pool_malloc(nbytes, stream)
        return self.malloc(nbytes) if ptr is None else ptr

    def _pool_malloc(self, nbytes: int, stream: int):
        """One stream-ordered allocation from the current device's pool (a binding's part of
        malloc_async), or None where there is no usable pool."""
        return None

    def trim_pool(self, synchronize: bool = False) -> None:
        """Hand the memory the current device's pool holds for reuse back to the driver (for other
        libraries of the process, or before a large allocation). With synchronize, after the device's
        queued work (and with it the queued frees) has run. Nothing to do without a pool."""

    def free_async(self, ptr: int, stream: int = 0) -> None:
        """Free `ptr` once the work queued on `stream` so far has run, without blocking the host or any
        other stream (cuMemFreeAsync / hipFreeAsync). Work on other streams that uses `ptr` must be
        ordered before this point of `stream` by the caller (stream_wait_event).

        This fallback, for drivers without a stream-ordered free (or devices without memory pools),
        is a free list released by events: an event recorded on `stream` now, and `free` once a later
        call finds it complete. It runs from finalizers, so it takes no lock it could wait on."""
        event = self.event_create()
        try:
            self.event_record(event, stream)
        except BaseException:
            self.event_destroy(event)
            raise
        self.__dict__.setdefault("_deferred_frees", collections.deque()).append((event, ptr))
        self.release_deferred_frees()

    def release_deferred_frees(self, wait: bool = False) -> int:
        """Free what the free_async fallback holds and is complete now (everything, waiting for it,
        with wait=True); returns how many are still held."""
        pending = self.__dict__.get("_deferred_frees")
        if not pending:
            return 0
        lock = self.__dict__.setdefault("_deferred_lock", threading.Lock())
        # One releaser at a time. A finalizer that gets here while its own thread is in the loop (the
        # collector runs on any allocation) leaves its entry to that loop instead of waiting on it.
        if not lock.acquire(blocking=False):
            return len(pending)
        try:
            for item in list(pending):
                event, ptr = item
                if wait:
                    self.event_synchronize(event)
                elif not self.event_query(event):
                    continue
                pending.remove(item)
                try:
                    self.free(ptr)
                finally:
                    self.event_destroy(event)
        finally:
            lock.release()
        return len(pending)

    @abstractmethod
    def memcpy_htod(self, dst: int, src_host_ptr: int, nbytes: int, stream: int = 0) -> None:
        """Host -> device; asynchronous on `stream` when the host memory allows, else synchronous."""
    @abstractmethod
    def memcpy_dtoh(self, dst_host_ptr: int, src: int, nbytes: int, stream: int = 0) -> None: ...
    @abstractmethod
    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None: ...
    @abstractmethod
    def memset(self, dst: int, value: int, nbytes: int, stream: int = 0) -> None: ...

    # streams and events
    @abstractmethod
    def stream_create(self) -> int: ...
    @abstractmethod
    def stream_destroy(self, stream: int) -> None: ...
    @abstractmethod
    def stream_synchronize(self, stream: int) -> None: ...
    @abstractmethod
    def event_create(self) -> int: ...
    @abstractmethod
    def event_destroy(self, event: int) -> None: ...
    @abstractmethod
    def event_record(self, event: int, stream: int = 0) -> None: ...
    @abstractmethod
    def event_synchronize(self, event: int) -> None: ...
    def event_query(self, event: int) -> bool:
        """True when the work recorded before `event` has run (or it was never recorded). Bindings ask
        the driver without blocking (hipEventQuery / cuEventQuery); this fallback waits."""
        self.event_synchronize(event)
        return True
    @abstractmethod
    def event_elapsed_ms(self, start: int, end: int) -> float: ...
    @abstractmethod
    def stream_wait_event(self, stream: int, event: int) -> None: ...
    @abstractmethod
    def synchronize(self) -> None: ...

    # modules and launches
    @abstractmethod
    def module_load(self, image: bytes) -> int: ...
    @abstractmethod
    def module_unload(self, module: int) -> None: ...
    @abstractmethod
    def module_function(self, module: int, name: str) -> int: ...
    @abstractmethod
    def launch(self, function: int, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: tuple, shared_bytes: int = 0, stream: int = 0) -> None:
        """Launch with kernelParams. `args` are ctypes scalars (c_void_p for pointers, c_int32,
        c_int64, c_float) in the kernel's parameter order."""


def pool_keep_bytes(total_memory: int) -> int:
    """Bytes of freed memory a device's pool keeps for reuse across synchronisations:
    HIPSCHED_GPU_POOL_KEEP (bytes, or "all"), by default a quarter of the device's memory, so a
    process that shares the device with PyTorch or CuPy does not starve their allocators (their own
    caches keep everything). A malformed value is an error, not a silent default."""
    raw = os.environ.get("HIPSCHED_GPU_POOL_KEEP", "").strip().lower()
    if not raw:
        return max(int(total_memory) // 4, 0)
    if raw == "all":
        return (1 << 64) - 1
    try:
        value = int(float(raw)) if raw.replace(".", "", 1).replace("e", "", 1).isdigit() else int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"HIPSCHED_GPU_POOL_KEEP={raw!r}: expected a number of bytes >= 0, or 'all'")
    return value


def pack_kernel_params(args) -> ctypes.Array:
    """The `void**` kernelParams array for `args` (ctypes scalars, in the kernel's parameter order).
    The array points into the ctypes objects, so keep `args` alive until the launch call returns.
    Raises GpuError(kind="launch") for anything that is not a ctypes scalar."""
    pointers = []
    for i, a in enumerate(args):
        if not isinstance(a, ctypes._SimpleCData):
            raise GpuError("launch", f"kernel argument {i} is {type(a).__name__}, not a ctypes scalar "
                                     f"(c_void_p for pointers, c_int32, c_int64, c_float)", name="bad-argument")
        pointers.append(ctypes.addressof(a))
    return (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
