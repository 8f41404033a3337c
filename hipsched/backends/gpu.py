"""GpuBackend: runs a validated Call on the GPU through the detected runtime and the compiled kernels.

What the scheduler asks of it (capabilities, free memory, transfer volume) is answered without touching
the device where possible. `run` calls the launch glue its op spec names (`hipsched.gpu.glue.<family>.<op>(ctx,
call, stream)`) and turns ANY failure into GpuError, so the executor can always fall
back to the CPU. Results come back where the inputs live: NumPy for host inputs, device arrays for
device inputs (torch tensors for torch tensors, CuPy arrays for CuPy arrays, else DeviceArray).
`create_gpu_backend` never raises: with no GPU the backend says so in `unavailable_reason`."""
from __future__ import annotations

import logging
import statistics
import threading
import time

import numpy as np

from ..dlpack_devices import device_indices
from ..errors import GpuError
from ..gpu.bindings import detect
from ..gpu.bindings import runtime as _rt
from ..gpu.launch.recording import PlanRecorder
from ..gpu.memory.device_array import to_device
from ..gpu.memory.streams import StreamPool, as_stream_handle
from ..ops import OPS
from ..ops.base import host_arrays
from .interface import KEEP_QUERY_MIN_BYTES, GpuBackendBase, Judgement

# Views of the op specs (hipsched/ops), which are the one place these are declared:
# op -> (module, function) of the launch glue, and op -> dtypes (Call.dtype) with a GPU path
GPU_IMPLS = {name: spec.gpu for name, spec in OPS.items() if spec.gpu is not None}
SUPPORTED_DTYPES = {name: OPS[name].gpu_dtypes for name in GPU_IMPLS}

# Largest Call.size per op. Every kernel indexes with 64 bits, so the practical limit is device memory,
# which the scheduler checks separately through device_bytes_needed() and free_memory().
MAX_ELEMENTS = {op: 2**62 for op in GPU_IMPLS}


def _config_value(config, name, default=None):
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _no_runtime_reason() -> str:
    try:
        attempts = detect.attempts()
        reasons = [f"{a.name}: {a.reason}" for a in attempts if not a.ok]
        return "; ".join(reasons) or "no GPU runtime was selected"
    except Exception as e:  # the detection layer itself is broken: still report, never raise
        return f"GPU detection failed: {type(e).__name__}: {e}"


def _array_leaves(x, out):
    """(pointer, bytes, is a host array) of the arrays among a call's arguments, in order."""
    for a in x:
        if isinstance(a, (tuple, list)):
            _array_leaves(a, out)
        elif isinstance(a, np.ndarray):
            out.append((int(a.__array_interface__["data"][0]), int(a.nbytes), True))
        elif hasattr(a, "ptr") and hasattr(a, "nbytes"):
            out.append((int(a.ptr), int(a.nbytes), False))
    return out


# Streams for the executor's submission threads (stream_for_thread): as many as it starts for one GPU
# (hipsched/submission.py, THREADS_PER_SIDE per side), so that none shares.
THREAD_STREAMS = 4


class GpuBackend(GpuBackendBase):
    _fork_gen = 0
    # The compiled call path (hipsched/gpu/launch/_callpath.pyx's GpuPath), or None. The dispatcher replays
    # through it the launch plans it recorded (see _run) for calls on device data.
    callpath = None
    device_index = None
    device_name = None
    runtime_name = None

    def __init__(self, config=None, runtime=None):
        """`runtime`: a Runtime to use instead of the detected one (tests, embedding)."""
        self.available = False
        self.unavailable_reason: str | None = None
        self.runtime_name: str | None = None
        self.device_name: str | None = None
        self.device_arch: str | None = None
        self._ctx = None
        self._fns = {}
        self._lock = threading.Lock()
        self._stream_pool = None                 # the streams stream_for_thread hands out (made on first use)
        self._thread_stream = threading.local()
        self._fork_gen = _rt.fork_generation()
        self.device_index: int | None = None
        self._config = config
        try:
            rt = runtime if runtime is not None else detect.get_runtime()
            if rt is None:
                self.unavailable_reason = _no_runtime_reason()
                return
            # deferred: the GPU glue loads only once a runtime is found (it may be broken)
            from ..gpu.launch.context import GpuContext
            # the executor's device list names its GPU first (HybridConfig.gpu_devices), else gpu_device_id
            listed = _config_value(config, "gpu_devices")
            index = listed[0] if listed else _config_value(config, "gpu_device_id", 0)
            self._ctx = GpuContext(rt, device_index=int(index or 0),
                                   # kernels: HIPSCHED_CACHE_DIR or ~/.cache/hipsched/kernels, the
                                   # place `python -m hipsched compile` fills ahead of time
                                   cache_dir=_config_value(config, "kernel_cache_dir"),
                                   resident_bytes=_config_value(config, "resident_bytes"))
            self.runtime_name = rt.name
            self.device_name = self._ctx.device.name
            self.device_arch = self._ctx.device.arch
            self.device_index = self._ctx.device.index
            try:
                # Decided once, here: whether this driver can load what the compiler makes (NVRTC 13's
                # CUBINs on a CUDA 12 driver cannot), so no call pays for a doomed module load.
                self._ctx.cache.target(self._ctx.rt)
            except GpuError as e:
                self.unavailable_reason = e.message
                return
            self.available = True
            # the engine replays recorded plans only through C entry points (see GpuPath)
            engine = self._ctx.engine
            self.callpath = engine if engine.enabled else None
        except Exception as e:
            self.available = False
            self.unavailable_reason = f"GPU initialisation failed: {type(e).__name__}: {e}"

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int:
        return self._ctx.rt.device_count() if self._ctx is not None else 0

    def for_device(self, index: int) -> "GpuBackend":
        """The backend of device `index` on this one's runtime (its own context view, kernels, streams
        and resident cache); the kernel cache directory and resident budget are this one's."""
        if self._ctx is None:
            return super().for_device(index)
        config = {"gpu_device_id": int(index), "kernel_cache_dir": _config_value(self._config, "kernel_cache_dir"),
                  "resident_bytes": _config_value(self._config, "resident_bytes")}
        return GpuBackend(config, runtime=self._ctx.rt)

    # ------------------------------------------------------------------ capabilities
    def supports(self, op: str, dtype: str) -> bool:
        """Whether op with this Call.dtype has a GPU path (a table; availability is `available`)."""
        return dtype in SUPPORTED_DTYPES.get(op, ())

    def max_elements(self, op: str) -> int:
        return MAX_ELEMENTS.get(op, 0)

    def unsupported(self, call) -> str | None:
        """Why this GPU cannot run `call`, or None when it can (see `_plan`)."""
        return self._plan(call)[0]

    def _plan(self, call, wait_for_kernels=True) -> tuple:
        """(refusal, plan): the op's launch planner (`<op>_plan(ctx, call)` next to its glue) checked
        against this target's launch limits, judged on the call's shapes and parameters before anything
        is uploaded. Only refusals count (GpuError "unsupported"); anything else (a compile error, a
        bug) is left for the run to report, where it counts against the GPU's health, and gives no
        plan. A call without arguments (select_backend by size) has nothing to judge."""
        if not call.args or not self.available:
            return None, None
        try:
            return None, self._ctx.check_launches(self._impl(call.op, "_plan")(self._ctx, call), wait_for_kernels)
        except GpuError as e:
            if e.kind == "unavailable":   # loading the planned kernels met a dead driver: as run() would
                self.disable(e.message)
            return (str(e) if e.kind == "unsupported" else None), None
        except Exception:
            return None, None

    def judge(self, call, wait_for_kernels=True) -> Judgement:
        """GpuBackendBase.judge in one walk of the call's host inputs (the transfer count and what the
        resident cache keeps come from the same pass), with the launch plan the run then uses."""
        why, plan = self._plan(call, wait_for_kernels)
        if why is not None:
            return Judgement(why, False)
        fits = self.device_bytes_needed(call) <= self._free_bytes()
        if call.on_device:
            return Judgement(None, fits, 0, 0, plan)
        resident = self._ctx.resident if self.available else None
        total_in = h2d = 0
        inputs = []
        for a, trusted in host_arrays(call.args):
            n = a.nbytes
            total_in += n
            kept = resident is not None and resident.is_resident(a)
            if not kept:
                h2d += n
            if n >= KEEP_QUERY_MIN_BYTES:
                inputs.append((a, trusted, kept, not kept and resident is not None and resident.would_keep(a, trusted)))
        return Judgement(None, fits, int(h2d), int(max(0, call.nbytes - total_in)), plan, tuple(inputs))

    def free_memory(self) -> int:
        if not self._still_available():
            return 0
        try:
            return int(self._ctx.rt.mem_info()[0])
        except GpuError as e:   # the scheduler's first question often meets a dead driver first
            if e.kind == "unavailable":
                self.disable(e.message)
            return 0
        except Exception:
            return 0

    def _free_bytes(self) -> int:
        if not self._still_available():
            return 0
        try:
            return int(self._ctx.engine.device_free_bytes())
        except GpuError as e:   # the scheduler's first question often meets a dead driver first
            if e.kind == "unavailable":
                self.disable(e.message)
            return 0
        except Exception:
            return 0

    def device_bytes_needed(self, call) -> int:
        """Inputs + outputs (call.nbytes) plus the scratch an op allocates on the device."""
        spec = OPS.get(call.op)
        if spec is None:
            return int(call.nbytes)
        return int(call.nbytes) + spec.device_scratch(call, self._ctx.multiprocessors if self._ctx is not None else 132)

    def transfer_bytes(self, call) -> tuple[int, int]:
        """(host->device, device->host) bytes this call copies: inputs not already resident, outputs."""
        if call.on_device:
            return (0, 0)
        arrays = [a for a, _ in host_arrays(call.args)]
        total_in = sum(a.nbytes for a in arrays)
        resident = self._ctx.resident if self.available else None
        h2d = sum(a.nbytes for a in arrays if resident is None or not resident.is_resident(a))
        return (int(h2d), int(max(0, call.nbytes - total_in)))

    # ------------------------------------------------------------------ residency
    def keep_resident(self, handle) -> None:
        """Upload a ResidentArray (hipsched.resident_array) now and keep it until it is released."""
        if not self._still_available():
            raise GpuError("unavailable", self.unavailable_reason or "no GPU")
        self._ctx.resident.pin(handle)

    def would_keep(self, host, trusted: bool = False) -> bool:
        """Whether a GPU run would keep `host` on the device for later calls (the resident cache's rule;
        `trusted`: bytes whose owner guarantees they never change, a QuantizedTensor's blocks)."""
        ctx = self._ctx
        return ctx is not None and self.available and ctx.resident.would_keep(host, trusted)

    def is_resident(self, host) -> bool:
        """Whether a GPU run would read `host` from a device copy kept now (no upload)."""
        ctx = self._ctx
        return ctx is not None and self.available and ctx.resident.is_resident(host)

    def _trim_resident(self) -> None:
        """Out of device memory: the kept copies of host arrays go first (the retry in pieces needs the
        room more than a cache does); registered ones stay."""
        try:
            self._ctx.resident.trim()
        except Exception:
            pass

    def resident_summary(self) -> dict | None:
        """The resident cache's budget and contents (ResidentCache.summary), None without a device."""
        ctx = self._ctx
        return ctx.resident.summary() if ctx is not None else None

    # ------------------------------------------------------------------ running
    def _impl(self, op, suffix=""):
        """The op's launch glue, or with suffix "_plan" its launch planner."""
        key = op + suffix
        fn = self._fns.get(key)
        if fn is None:
            if op not in GPU_IMPLS:
                raise GpuError("unsupported", f"no GPU implementation of {op!r}")
            try:
                fn = OPS[op].gpu_function(suffix)
            except (ImportError, AttributeError) as e:
                raise GpuError("unsupported", f"GPU glue for {op!r} cannot load: {e}") from e
            self._fns[key] = fn
        return fn

    def disable(self, reason: str) -> None:
        """The GPU is gone for this backend (a forked child, a driver that refuses our code objects,
        a driver that stopped answering): every later run fails at once with this one reason, never
        reaching the runtime again."""
        was = self.available   # the first reason stays; a racing second one says the same thing
        super().disable(reason)
        if was:
            logging.getLogger("hipsched").warning("hipsched: the GPU is no longer used, every op runs on the "
                                                  "CPU: %s", reason)

    def forget_free_memory(self) -> None:
        if self._ctx is not None:   # the engine's reading, which the judge and the replayed calls share
            self._ctx.engine.forget_free_memory()

    def _still_available(self) -> bool:
        if self.available and self._fork_gen != _rt._fork_generation:
            self.disable(_rt.forked_error(self.runtime_name or "GPU").message)
        return self.available

    def _check_devices(self, args):
        """A device array on another device than this backend's: its pointers mean nothing in this
        device's context (CUDA_ERROR_ILLEGAL_ADDRESS, which kills the context), so refuse it here."""
        for index in device_indices(args):
            if index != self.device_index:
                raise GpuError("unsupported", f"a device array on GPU {index} was passed to the GPU backend "
                                              f"of GPU {self.device_index} ({self.device_name}): copy it to GPU "
                                              f"{self.device_index} first, or use an Executor with "
                                              f"gpu_device_id={index}", name="wrong-device")

    def run(self, call, stream=None):
        return self._run(call, stream, False)[0]

    def run_timed(self, call, stream=None):
        """run() with events recorded on the call's stream before and after its work: (result, ticket),
        and `gpu_times()` gives the ticket back with the device time between them once the work has
        run. For device data, whose run returns with its work still queued, so the host cannot time it
        without waiting. ticket None: not timed (too many readings pending, no events)."""
        return self._run(call, stream, True)

    def gpu_times(self) -> list:
        """[(ticket, device us or None)] of run_timed calls whose work has run since the last call
        (None: the reading was lost); never waits."""
        ctx = self._ctx
        if ctx is None:
            return []
        try:
            return ctx.engine.read_timings()
        except Exception:
            return []

    def _run(self, call, stream, timed):
        if not self._still_available():
            raise GpuError("unavailable", self.unavailable_reason or "no GPU")
        s = start = None
        try:
            s = as_stream_handle(stream)
            if call.on_device:
                self._check_devices(call.args)
            if timed:
                start = self._ctx.engine.start_timing(s) or None
            ctx = recorder = None
            if self.callpath is not None:
                wanted = self.callpath.recording_request()
                # only a run of the whole call the request was made for (not a piece of it after an
                # out-of-memory split, nor inputs prepare converted): its arrays are the ones it names
                if wanted is not None and sorted(wanted) == sorted(_array_leaves(call.args, [])):
                    ctx = recorder = PlanRecorder(self._ctx, wanted, s)
            judged = call.judged
            counts = self._ctx.resident.transfer_totals if judged is not None and not call.on_device else None
            before = counts() if counts is not None else None
            out = self._impl(call.op)(ctx or self._ctx, call, s)
            if before is not None:   # host inputs: what the call uploaded and what it read from kept copies
                after = counts()
                judged.moved = (after[0] - before[0], after[1] - before[1])
            if recorder is not None:
                self.callpath.recorded(recorder.plan(), recorder.refused)
            ticket = None
            if start is not None:
                ticket, start = self._ctx.engine.stop_timing(start, s), None
            return out, ticket
        except GpuError as e:
            if e.kind == "unavailable":
                self.disable(e.message)
            elif e.kind == "oom":
                self._trim_resident()
            raise
        except MemoryError as e:
            self._trim_resident()
            raise GpuError("oom", f"{call.op} on the GPU: {e}") from e
        except Exception as e:
            raise GpuError("runtime", f"{call.op} on the GPU: {type(e).__name__}: {e}") from e
        finally:
            if start is not None:   # the run failed: nothing to read
                self._ctx.engine.cancel_timing(start)
            # Device inputs: the call returns with kernels reading them still queued (also when it
            # failed half way), and the caller may drop them at once, so they are held until then;
            # every call lets go of what earlier calls held and has run by now.
            keep_alive = getattr(self._ctx, "keep_alive", None)
            if s is not None and keep_alive is not None:
                keep_alive(call.args if call.on_device else (), s)

    uploads = True

    def upload(self, host, stream=None):
        if not self._still_available():
            return None
        return to_device(host, runtime=self._ctx.rt, stream=as_stream_handle(stream))

    def measure_transfer(self, small: int = 4, large: int = 16 << 20, repeat: int = 7) -> dict:
        """Latency (a `small`-byte copy) and bandwidth (a `large`-byte copy) each way, medians of
        `repeat` synchronised copies from pageable host memory (what hipsched's uploads use)."""
        if not self.available:
            raise GpuError("unavailable", self.unavailable_reason or "no GPU")
        try:
            rt = self._ctx.rt
            host = np.ones(large // 4, dtype=np.float32)
            dev = self._ctx.empty(host.shape, np.float32, 0)

            def timed(copy, nbytes):
                times = []
                for _ in range(repeat + 1):
                    t = time.perf_counter()
                    copy(nbytes)
                    rt.stream_synchronize(0)
                    times.append(time.perf_counter() - t)
                return statistics.median(times[1:])  # the first copy warms up the path

            def h2d(n): rt.memcpy_htod(dev.ptr, host.ctypes.data, n, 0)
            def d2h(n): rt.memcpy_dtoh(host.ctypes.data, dev.ptr, n, 0)

            result = {}
            for name, fn in (("h2d", h2d), ("d2h", d2h)):
                lat = timed(fn, small)
                big = timed(fn, large)
                result[f"{name}_latency_us"] = lat * 1e6
                result[f"{name}_gbps"] = large / max(big - lat, 1e-9) / 1e9
            return result
        except GpuError:
            raise
        except Exception as e:
            raise GpuError("runtime", f"measure_transfer: {type(e).__name__}: {e}") from e

    def stream_for_thread(self):
        """A stream of this backend's pool for the calling thread, the same one on each call (one
        thread's calls stay in order; different threads' overlap): the pool is made on first use."""
        s = getattr(self._thread_stream, "stream", None)
        if s is not None or not self.available:
            return s
        with self._lock:
            if self._ctx is None:
                return None
            if self._stream_pool is None:
                self._stream_pool = StreamPool(self._ctx.rt, n=THREAD_STREAMS)
            s = self._thread_stream.stream = self._stream_pool.next()
        return s

    def close(self) -> None:
        with self._lock:
            if self._stream_pool is not None:   # its streams' work done first; their late frees retired
                try:
                    self._stream_pool.close()
                except Exception:
                    pass
                self._stream_pool = None
            if self.callpath is not None:
                self.callpath.enabled = False
            if self._ctx is not None:   # its engine lets go of held inputs once their work has run
                try:
                    self._ctx.close()
                except Exception:
                    pass
                self._ctx = None
            self.available = False
            if self.unavailable_reason is None:
                self.unavailable_reason = "closed"


def create_gpu_backend(config=None) -> GpuBackend:
    """The GPU backend; never raises (available=False with unavailable_reason when there is no GPU)."""
    return GpuBackend(config)  # __init__ turns every failure into unavailable_reason
