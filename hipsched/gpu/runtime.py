"""The small runtime interface every GPU binding implements (hip-python, ctypes HIP, ctypes CUDA).

Handles (device pointers, streams, events, modules, functions) are plain Python ints so the rest of
hipsched never sees binding-specific types. Every method raises GpuError (hipsched.errors) with the
runtime's own error name on failure; nothing here may crash the process or raise anything else.

A Compiler is separate from a Runtime because compiling needs no device: `python -m hipsched
compile` and CI use a Compiler alone."""
from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from dataclasses import dataclass


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
        """Index of the device set_device chose (0 until then); bindings store it as `_device`."""
        return getattr(self, "_device", 0)
    @abstractmethod
    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes on the current device."""

    # memory
    @abstractmethod
    def malloc(self, nbytes: int) -> int: ...
    @abstractmethod
    def free(self, ptr: int) -> None: ...
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


def pack_kernel_params(args) -> ctypes.Array:
    """The `void**` kernelParams array for `args` (ctypes scalars, in the kernel's parameter order).
    The array points into the ctypes objects, so keep `args` alive until the launch call returns.
    Raises GpuError(kind="launch") for anything that is not a ctypes scalar."""
    from ..errors import GpuError
    pointers = []
    for i, a in enumerate(args):
        if not isinstance(a, ctypes._SimpleCData):
            raise GpuError("launch", f"kernel argument {i} is {type(a).__name__}, not a ctypes scalar "
                                     f"(c_void_p for pointers, c_int32, c_int64, c_float)", name="bad-argument")
        pointers.append(ctypes.addressof(a))
    return (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
