"""GpuContext: what the kernel launch glue (hipsched/gpu/glue/<family>.py) needs from the runtime, in one object
per device: compiled functions by (source, kernel) name, uploads through the resident cache, output
allocation, launches with kernelParams, and handing results back where the inputs live.

Every glue function has the shape `def op(ctx, call, stream)`: work out its launches from the shapes
(a pure `<op>_launches(...)` function next to it, so CI can sweep them for every target without a
device), check them, upload inputs, allocate outputs, launch, `return ctx.finish(out, call, stream)`.
Failures surface as GpuError from the runtime; the backend converts anything else into GpuError too,
so the glue stays free of error handling.

Every launch is checked against the limits of the target the kernel was compiled for
(hipsched/gpu/compilation/targets.py) with the resources its code object records: a launch the device would
refuse raises GpuError("unsupported", name="launch-limit-<limit>") before it is made."""
from __future__ import annotations

import ctypes
import functools
import logging
import math
import threading
from typing import NamedTuple

import numpy as np

from ...errors import GpuError
from ..compilation.codeobject import kernel_resources
from ..compilation.kernels import KernelCache
from ..compilation.targets import check_launch, target_for
from ..memory.device_array import DeviceArray, callers_arrays, to_device
from ..memory.resident_cache import ResidentCache
from ..bindings._driver import driver_for
from .blas import last_reasons, load_blas
from ._callpath import GpuPath

# Temporaries up to this size are kept per stream and reused (see GpuContext.scratch).
SCRATCH_KEEP_BYTES = 64 << 20
# Grid-stride kernels need only enough blocks to fill the device; more just adds scheduling work.
_BLOCKS_PER_CU = 16


def _as_dim3(v) -> tuple[int, int, int]:
    if type(v) is tuple and len(v) == 3:   # a Launch's, already normalised: every launch passes here
        return v
    if isinstance(v, (int, np.integer)):
        return (int(v), 1, 1)
    t = tuple(int(x) for x in v)
    return (t + (1, 1, 1))[:3]


class Launch(NamedTuple):
    """One kernel launch as the glue plans it: which kernel, with what grid, block and dynamic shared
    memory. Arguments are not part of it: the plan depends on shapes only."""
    source: str                 # src_c/hip/<source>.hip
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int = 0

    @classmethod
    def of(cls, source, kernel, grid, block, shared=0) -> "Launch":
        return cls(source, kernel, _as_dim3(grid), _as_dim3(block), int(shared))


def pure_plan(fn):
    """For a glue's `<op>_launches(...)`, a pure function of shapes and device geometry: its plans are
    kept (a few hundred), since a program makes the same call again and again and building the Launch
    tuples cost more than some kernels take. Each caller gets its own list; refusals (GpuError) are
    raised anew every time."""
    cached = functools.lru_cache(maxsize=256)(fn)

    @functools.wraps(fn)
    def plan(*args, **kwargs):
        return list(cached(*args, **kwargs))
    plan.cache_clear = cached.cache_clear
    return plan


def grid_stride_blocks(n: int, block: int, multiprocessors: int) -> int:
    """Blocks for a grid-stride loop over n items: enough to fill every compute unit, no more."""
    need = max(1, -(-int(n) // block))
    return min(need, max(1, int(multiprocessors)) * _BLOCKS_PER_CU)


class GpuContext:
    """Launch helper bound to one runtime and its current device."""

    def __init__(self, rt, device_index: int = 0, cache_dir=None, resident_bytes: int | None = None):
        # Its own view of the runtime on its own device (Runtime.for_device), not set_device on the shared
        # one: that would move every other context's work in this process to this device.
        bind = getattr(rt, "for_device", None)
        if bind is not None:
            rt = bind(device_index)
        else:
            rt.set_device(device_index)
        self.rt = rt
        self.device = rt.device_info(device_index)
        self.warp_size = self.device.warp_size
        self.arch = self.device.arch
        self.platform = self.device.platform
        self.cache = KernelCache(rt.compiler, cache_dir=cache_dir)
        self.target = target_for(self.arch, self.warp_size)
        self._kernels: dict[int, tuple] = {}    # function handle -> (kernel name, KernelResources | None)
        self._launches_fit: set = set()         # (function, grid, block, shared) that check() passed
        # Launch -> its function handle, for plans check_launches passed: a call's plan repeats call after
        # call, so its kernel lookup and limits check are paid once, not on every launch
        self._planned: dict = {}
        self._resources: dict[str, dict] = {}   # source -> {kernel: KernelResources} for this device
        # resident_bytes None: HIPSCHED_RESIDENT_BYTES or the memory module's default
        self.resident = ResidentCache(rt, resident_bytes)
        self._blas = None
        self._blas_tried = False
        self._blas_lock = threading.Lock()
        self._scratch = threading.local()  # per thread: see scratch()
        # the call engine (gpu/launch/_callpath.pyx): inputs' lifetimes, timing events, free memory and,
        # through C entry points where the runtime has them, the replay of recorded plans
        self.engine = GpuPath(driver_for(rt), rt, self.device.index, self.platform)

    # ------------------------------------------------------------------ kernels
    def function(self, source: str, kernel: str) -> int:
        """Function handle for `kernel` in src_c/hip/<source>.hip (compiled or loaded on first use).
        `source` may be given with or without the .hip suffix."""
        source = self._source_name(source)
        fn = self.cache.function(self.rt, source, kernel)
        if fn not in self._kernels:
            self._kernels[fn] = (kernel, self.resources(source).get(kernel))
        return fn

    def resources(self, source: str) -> dict:
        """{kernel: KernelResources} of `source` as compiled for this device, from its cached code
        object ({} when the code object records none, e.g. an emulator's host library)."""
        source = self._source_name(source)
        got = self._resources.get(source)
        if got is None:
            try:   # the very code object `function` loads: same target and loader, so a cache hit
                loader = getattr(self.rt, "loader_tag", lambda: "")()
                got = kernel_resources(self.cache.code_object(source, self.cache.target(self.rt), (), loader))
            except GpuError:
                got = {}
            self._resources[source] = got
        return got

    @property
    def multiprocessors(self) -> int:
        return max(1, int(self.device.multiprocessors))

    def blas(self):
        """The vendor BLAS (hipsched.gpu.launch.blas.Blas) for this device, or None when none can be loaded."""
        if not self._blas_tried:
            with self._blas_lock:
                if not self._blas_tried:
                    driver = getattr(self.rt, "driver_version", lambda: 0)()
                    self._blas = load_blas(self.platform, driver_version=driver or None)
                    self._blas_tried = True
                    if self._blas is None and last_reasons():
                        logging.getLogger("hipsched").warning(
                            "hipsched: no vendor BLAS for GPU %d, matmul uses the tiled kernel: %s",
                            self.device.index, "; ".join(last_reasons()))
        return self._blas

    def blocks_for(self, n: int, block: int = 256) -> int:
        """Blocks for a grid-stride loop over n items: enough to fill every compute unit, no more."""
        return grid_stride_blocks(n, block, self.multiprocessors)

    # ------------------------------------------------------------------ memory
    def upload(self, x, stream, immutable: bool = False, pack=None):
        """An input on the device: host arrays through the resident cache (a read-only or registered
        corpus, or weights, reused across calls stays on the device; `immutable`: the caller guarantees
        the host bytes never change, as a QuantizedTensor's blocks; `pack`: the host array's device
        layout, ResidentCache.get's), device arrays as they are."""
        if isinstance(x, np.ndarray):
            dev = self.resident.get(x, stream, immutable, pack)
        else:
            self._wait_for_producer(x, stream)
            dev = x
        # a resident copy outlives this call and may be freed (evicted) while other streams' work that
        # read it is queued: its free must wait for this stream too
        record = getattr(dev, "record_stream", None)
        if record is not None:
            record(stream)
        return dev

    def _wait_for_producer(self, x, stream) -> None:
        """A device input last written on another stream (CAI v3 "stream", or one of our own results
        from a call on another stream): order `stream` after that work before any kernel reads it."""
        src = getattr(x, "stream", None)
        if src is not None:
            self.engine.order_after(int(src), int(stream or 0))

    def keep_alive(self, args, stream) -> None:
        """Hold a call's device inputs until the work queued on `stream` so far has run (the engine's
        rule, GpuPath.hold_inputs); earlier calls' inputs whose work has run are let go."""
        self.engine.hold_inputs(args, int(stream or 0))

    def empty(self, shape, dtype, stream):
        """An uninitialised device array owned by hipsched (freed with its last reference)."""
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        return DeviceArray.empty(shape, dtype, runtime=self.rt, stream=stream)

    def scratch(self, name: str, shape, dtype, stream):
        """A device temporary for one call (never returned to the caller). Allocating and freeing
        device memory per call is slow, so temporaries up to SCRATCH_KEEP_BYTES live on per (thread,
        stream, name): reuse is safe because one thread's launches on one stream run in order (two
        threads sharing a stream would interleave, hence per thread). `name` tells apart the
        temporaries alive at the same time. A buffer replaced by a larger one, or one too large to
        keep, is freed in stream order after the kernels already queued on it."""
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > SCRATCH_KEEP_BYTES:
            return self.empty(shape, dtype, stream)
        buffers = self._scratch.__dict__.setdefault("buffers", {})
        key = (int(stream or 0), name)
        buf = buffers.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = buffers[key] = DeviceArray.empty((max(nbytes, 256),), np.uint8, runtime=self.rt,
                                                   stream=key[0])
        return DeviceArray(buf.ptr, shape, dtype, self.rt, owner=buf, stream=stream)

    # ------------------------------------------------------------------ launches
    def check(self, fn: int, grid, block, shared: int = 0) -> None:
        """Raise GpuError("unsupported", name="launch-limit-...") if the device would refuse this launch
        of `fn` (a handle from `function`): threads per block and the kernel's launch bounds, grid
        dimensions, shared memory, registers per block, and the warp size the glue planned with."""
        key = (fn, _as_dim3(grid), _as_dim3(block), shared)
        if key in self._launches_fit:   # plans repeat call after call: each is judged once
            return
        kernel, res = self._kernels.get(fn, (None, None))
        check_launch(self.target, kernel or f"kernel {fn:#x}", res, key[1], key[2], shared, self.warp_size)
        if len(self._launches_fit) < 4096:
            self._launches_fit.add(key)

    def check_launches(self, launches, wait=True):
        """Check a plan before anything is uploaded (a call the device cannot run then costs no copies);
        compiles or loads the kernels it names. Returns the plan. Without `wait`, a kernel source that
        would have to be compiled first is compiled in the background instead, and the call is refused
        for now (GpuError "unsupported", name "compiling"): its calls run on the CPU until it is ready."""
        planned = self._planned
        for l in launches:
            if l not in planned:
                if not wait:
                    self._not_compiling(l.source)
                fn = self.function(l.source, l.kernel)
                self.check(fn, l.grid, l.block, l.shared)
                if len(planned) < 4096:
                    planned[l] = fn
        return launches

    def _source_name(self, source: str) -> str:
        """A kernel source as the cache names it: `source` may be given without its .hip suffix."""
        if source not in self.cache.sources and source + ".hip" in self.cache.sources:
            return source + ".hip"
        return source

    def _not_compiling(self, source):
        source = self._source_name(source)
        if self.cache.ready(self.rt, source):
            return
        self.cache.compile_in_background(self.rt, source)
        raise GpuError("unsupported", f"{source} is being compiled in the background; the CPU runs the calls "
                                      f"that need it until it is ready", name="compiling")

    def planned(self, call, planner):
        """The call's launch plan: the one its judgement checked (GpuBackend.judge, carried on the call),
        else `planner(self, call)` checked now (a call run without being judged: a piece of one cut for
        memory, a test calling the glue)."""
        judged = call.judged
        plan = judged.plan if judged is not None else None
        return plan if plan is not None else self.check_launches(planner(self, call))

    def run(self, launch: Launch, args, stream: int = 0) -> None:
        """Launch one planned launch with `args` (see `launch`)."""
        fn = self._planned.get(launch)
        if fn is None:
            self.launch(self.function(launch.source, launch.kernel), launch.grid, launch.block, args,
                        shared=launch.shared, stream=stream)
            return
        self.rt.launch(fn, _as_dim3(launch.grid), _as_dim3(launch.block), self._kernel_params(args, stream),
                       int(launch.shared), int(stream or 0))

    def launch(self, fn: int, grid, block, args, shared: int = 0, stream: int = 0) -> None:
        """Launch `fn` with kernelParams, after checking it against the target's limits (`check`).
        DeviceArray arguments become their pointers; ctypes scalars (c_int32, c_int64, c_float,
        c_void_p) go as they are, so the glue states each parameter's type."""
        params = self._kernel_params(args, stream)
        self.check(fn, grid, block, shared)
        self.rt.launch(fn, _as_dim3(grid), _as_dim3(block), params, int(shared), int(stream or 0))

    @staticmethod
    def _kernel_params(args, stream) -> tuple:
        """kernelParams of `args` (see `launch`); every device array among them is recorded as used on
        `stream`."""
        params = []
        for a in args:
            if isinstance(a, ctypes._SimpleCData):
                params.append(a)
            elif a is None:
                params.append(ctypes.c_void_p(0))
            elif hasattr(a, "ptr"):
                params.append(ctypes.c_void_p(int(a.ptr)))
                record = getattr(a, "record_stream", None)
                if record is not None:   # its free must come after this kernel, whatever stream it was made on
                    record(stream)
            else:
                raise TypeError(f"kernel argument {a!r} is neither a device array nor a ctypes scalar")
        return tuple(params)

    def finish(self, out, call, stream):
        """Results where the inputs live: for device inputs device arrays of the inputs' own library
        (torch in, torch out: memory.callers_arrays; the work stays queued on `stream`), NumPy otherwise
        (one synchronising download per output). `out` may be a tuple."""
        if call.on_device:
            return callers_arrays(out, call.args)
        if isinstance(out, tuple):
            return tuple(o.get(stream=stream) for o in out)
        return out.get(stream=stream)

    def synchronize(self, stream: int = 0) -> None:
        self.rt.stream_synchronize(int(stream or 0))
        self.engine.reap()

    def close(self) -> None:
        """Drop device copies, the BLAS handle and the loaded modules (the runtime stays usable); let go
        of held inputs once their work has run."""
        self.engine.close()
        self.resident.clear()
        self._scratch = threading.local()  # every thread's buffers go with the old one
        if self._blas is not None:
            self._blas.close()
            self._blas = None
        self.cache.unload(self.rt)
        # handles of unloaded modules may come back for other kernels: what was learnt of them goes
        self._kernels.clear()
        self._launches_fit.clear()
        self._planned.clear()
