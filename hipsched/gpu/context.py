"""GpuContext: what the kernel launch glue (hipsched/gpu/ops_*.py) needs from the runtime, in one object
per device: compiled functions by (source, kernel) name, uploads through the resident cache, output
allocation, launches with kernelParams, and handing results back where the inputs live.

Every glue function has the shape `def op(ctx, call, stream)`: upload inputs, allocate outputs, launch,
`return ctx.finish(out, call, stream)`. Failures surface as GpuError from the runtime; the backend
converts anything else into GpuError too, so the glue stays free of error handling."""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from ..errors import GpuError

# Default share of device memory the resident cache may hold when HIPSCHED_RESIDENT_BYTES is unset.
_RESIDENT_SHARE = 0.25
# Grid-stride kernels need only enough blocks to fill the device; more just adds scheduling work.
_BLOCKS_PER_CU = 16


def _as_dim3(v) -> tuple[int, int, int]:
    if isinstance(v, (int, np.integer)):
        return (int(v), 1, 1)
    t = tuple(int(x) for x in v)
    return (t + (1, 1, 1))[:3]


def _resident_budget(total_memory: int) -> int:
    env = os.environ.get("HIPSCHED_RESIDENT_BYTES")
    if env:
        try:
            return max(0, int(float(env)))
        except ValueError:
            raise GpuError("unavailable", f"HIPSCHED_RESIDENT_BYTES={env!r} is not a byte count") from None
    return int(total_memory * _RESIDENT_SHARE)


class GpuContext:
    """Launch helper bound to one runtime and its current device."""

    def __init__(self, rt, device_index: int = 0, cache_dir=None, resident_bytes: int | None = None):
        from .kernels import KernelCache
        from .memory import ResidentCache

        self.rt = rt
        rt.set_device(device_index)
        self.device = rt.device_info(device_index)
        self.warp_size = self.device.warp_size
        self.arch = self.device.arch
        self.platform = self.device.platform
        self.cache = KernelCache(rt.compiler, cache_dir=cache_dir)
        budget = _resident_budget(self.device.total_memory) if resident_bytes is None else int(resident_bytes)
        self.resident = ResidentCache(rt, budget)
        self._functions: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ kernels
    def function(self, source: str, kernel: str) -> int:
        """Function handle for `kernel` in src_c/hip/<source>.hip (compiled or loaded on first use)."""
        key = (source, kernel)
        fn = self._functions.get(key)
        if fn is None:
            with self._lock:
                fn = self._functions.get(key)
                if fn is None:
                    fn = self.cache.function(self.rt, source, kernel)
                    self._functions[key] = fn
        return fn

    def blocks_for(self, n: int, block: int = 256) -> int:
        """Blocks for a grid-stride loop over n items: enough to fill every compute unit, no more."""
        need = max(1, -(-int(n) // block))
        return min(need, max(1, self.device.multiprocessors) * _BLOCKS_PER_CU)

    # ------------------------------------------------------------------ memory
    def upload(self, x, stream):
        """A float32 input on the device: host arrays through the resident cache (a corpus or weights
        reused across calls stays on the device), device arrays as they are."""
        if isinstance(x, np.ndarray):
            return self.resident.get(x, stream)
        return x

    def upload_raw(self, arr: np.ndarray, stream):
        """A fresh device copy of any host array (uint8 blocks, int32 indices, ...), not cached."""
        from .memory import to_device
        return to_device(np.ascontiguousarray(arr), runtime=self.rt, stream=stream)

    def empty(self, shape, dtype, stream):
        """An uninitialised device array owned by hipsched (freed with its last reference)."""
        from .memory import DeviceArray
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        # A zero-byte malloc may return a null pointer; a real (tiny) allocation keeps .ptr meaningful.
        ptr = self.rt.malloc(max(nbytes, 4))
        try:
            return DeviceArray(ptr, shape, dtype, self.rt, stream=stream)
        except BaseException:
            self.rt.free(ptr)
            raise

    # ------------------------------------------------------------------ launches
    def launch(self, fn: int, grid, block, args, shared: int = 0, stream: int = 0) -> None:
        """Launch `fn` with kernelParams. DeviceArray arguments become their pointers; ctypes scalars
        (c_int32, c_int64, c_float, c_void_p) go as they are, so the glue states each parameter's type."""
        params = []
        for a in args:
            if isinstance(a, ctypes._SimpleCData):
                params.append(a)
            elif a is None:
                params.append(ctypes.c_void_p(0))
            elif hasattr(a, "ptr"):
                params.append(ctypes.c_void_p(int(a.ptr)))
            else:
                raise TypeError(f"kernel argument {a!r} is neither a device array nor a ctypes scalar")
        self.rt.launch(fn, _as_dim3(grid), _as_dim3(block), tuple(params), int(shared), int(stream or 0))

    def finish(self, out, call, stream):
        """Results where the inputs live: device arrays for device inputs (the work stays queued on
        `stream`), NumPy otherwise (one synchronising download per output). `out` may be a tuple."""
        if call.on_device:
            return out
        if isinstance(out, tuple):
            return tuple(o.get(stream=stream) for o in out)
        return out.get(stream=stream)

    def synchronize(self, stream: int = 0) -> None:
        self.rt.stream_synchronize(int(stream or 0))
