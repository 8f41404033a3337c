"""A deterministic stand-in for hipsched.backends.gpu.GpuBackend, for scheduler tests on machines
without a GPU. It implements the GpuBackend interface; its results are real (computed by the CPU
kernels), its failures and memory limits are scripted, and it can spin for a scripted time so the
executor measures known costs.

Given a `runtime` (the kernel emulator's EmuRuntime, asynchronous for a driver that queues) it also
takes device data the way the real backend does: the call spins for its host time (`cost_us`: the
launches) and returns at once with its result's device array, while the work itself runs later on the
call's stream; `run_timed` records an event after it, and `gpu_times` reports `device_us(call)` (the
scripted kernel time) for the runs whose event has completed, as the real backend reports the device
time between its events. Only ops whose result has the first input's shape (add, scale, softmax) run on
its device data."""
from __future__ import annotations

import collections
import ctypes
import itertools
import threading
import time

import numpy as np

from hipsched.backends.cpu import CpuBackend
from hipsched.backends.interface import GpuBackendBase
from hipsched.errors import GpuError
from hipsched.ops.base import Call

# H100 figures (../shared/h100: README and model-after-calibrate.json) for fakes that should behave
# like that device: the host time of an op launched on device data (the Python launch path), the
# kernel time of a 1M-element add (12 MB through HBM3 at about 2.7 TB/s, plus the launch latency) and
# the measured host<->device transfers (pageable memory).
H100_LAUNCH_US = 168.0
H100_ADD_1M_KERNEL_US = 10.0
H100_TRANSFER = {"h2d_latency_us": 11.1, "h2d_gbps": 11.7, "d2h_latency_us": 20.8, "d2h_gbps": 12.2}
_SAME_SHAPE_OPS = ("add", "scale", "softmax")


def spin_us(us: float):
    """Busy-wait (sleep is far too coarse for microsecond costs)."""
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


def sleep_us(us: float):
    """Wait at least `us` without holding the GIL (a sleep overshoots by tens of microseconds)."""
    end = time.perf_counter_ns() + int(us * 1e3)
    while (left := end - time.perf_counter_ns()) > 0:
        time.sleep(left * 1e-9)


class FakeGpuBackend(GpuBackendBase):
    name = "gpu"

    def __init__(self, ops=("add", "scale", "softmax", "cosine_similarity", "top_k", "matmul", "attention"),
                 dtypes=("float32",), max_elements=1 << 40, free_memory=1 << 34, oom_above_bytes=None,
                 cost_us=None, fail=None, available=True, transfer=None, unsupported=None, runtime=None,
                 device_us=None):
        self.available = available
        self.unavailable_reason = None if available else "fake: no device"
        self.runtime_name = "fake" if available else None
        self.device_name = "FakeGPU 1" if available else None
        self.device_arch = "fake_arch" if available else None
        self._ops, self._dtypes, self._max = set(ops), set(dtypes), max_elements
        self._free = free_memory
        self.oom_above_bytes = oom_above_bytes   # runs needing more device bytes raise an oom GpuError
        self.cost_us = cost_us                   # call -> microseconds to spin (None: no spin)
        self.fail = fail                         # call -> GpuError kind to raise, or None
        self.refuse = unsupported                # call -> why the device cannot run it, or None
        self._transfer = transfer or {"h2d_latency_us": 5.0, "h2d_gbps": 20.0, "d2h_latency_us": 5.0, "d2h_gbps": 20.0}
        self._cpu = CpuBackend()
        self._lock = threading.Lock()
        self.runs = 0          # run() calls, failed or not
        self.ok_runs = 0
        self.sizes = []        # Call.size of every successful run
        self.closed = False
        self.runtime = runtime                   # EmuRuntime holding device data, or None (host data only)
        self.device_us = device_us               # call -> scripted device time of its work on device data
        self._timings = collections.deque()      # (ticket, end event, device us), oldest first
        self._tickets = itertools.count(1)

    def supports(self, op, dtype):
        return self.available and op in self._ops and dtype in self._dtypes

    def max_elements(self, op):
        return self._max

    def free_memory(self):
        return self._free

    def unsupported(self, call):
        return self.refuse(call) if self.refuse is not None else None

    def device_bytes_needed(self, call):
        return call.nbytes

    def transfer_bytes(self, call):
        return (0, 0) if call.on_device else (call.nbytes // 2, call.nbytes - call.nbytes // 2)

    def run(self, call, stream=None):
        return self._run(call, stream, False)[0]

    def run_timed(self, call, stream=None):
        return self._run(call, stream, True)

    def _run(self, call, stream, timed):
        with self._lock:
            self.runs += 1
        if self.fail is not None:
            kind = self.fail(call)
            if kind:
                raise GpuError(kind, f"fake GPU scripted {kind} for {call.op}", "fakeError")
        if self.oom_above_bytes is not None and self.device_bytes_needed(call) > self.oom_above_bytes:
            raise GpuError("oom", f"fake GPU: {call.nbytes} bytes > {self.oom_above_bytes}", "fakeErrorOutOfMemory")
        if call.on_device and (self.runtime is None or call.op not in _SAME_SHAPE_OPS):
            raise GpuError("unsupported", f"fake GPU: no device path for {call.op}", "fakeErrorNotSupported")
        if self.cost_us is not None:
            # device data: its work runs on the emulator's stream threads, which need the GIL that a spin
            # would hold (for up to the 5 ms switch interval): the host time is slept instead
            (sleep_us if call.on_device else spin_us)(self.cost_us(call))
        ticket = None
        if call.on_device:
            out = self._queue_on_device(call, int(stream or 0))
            if timed and self.device_us is not None:
                event = self.runtime.event_create()
                self.runtime.event_record(event, int(stream or 0))
                ticket = next(self._tickets)
                self._timings.append((ticket, event, float(self.device_us(call))))
        else:
            out = self._cpu.run(call)
        with self._lock:
            self.ok_runs += 1
            self.sizes.append(call.size)
        return out, ticket

    def _queue_on_device(self, call, stream):
        """The call's result as a device array whose values the stream writes when it gets there."""
        from hipsched.gpu.memory.device_array import DeviceArray, callers_arrays
        rt, x = self.runtime, call.args[0]
        out = DeviceArray.empty(x.shape, x.dtype, runtime=rt, stream=stream)
        args = call.args

        def kernel():   # holds `args` and `out` until it has run: the caller may drop them at once
            views = tuple(_host_view(a) if isinstance(a, DeviceArray) else a for a in args)
            _host_view(out)[...] = self._cpu.run(Call(call.op, views, call.params, call.size, call.nbytes,
                                                      call.dtype, False))
        rt.enqueue(stream, kernel, f"fake GPU {call.op}")
        return callers_arrays(out, call.args)

    def gpu_times(self):
        done = []
        while self._timings and self.runtime.event_query(self._timings[0][1]):
            ticket, event, us = self._timings.popleft()
            self.runtime.event_destroy(event)
            done.append((ticket, us))
        return done

    def measure_transfer(self):
        return dict(self._transfer)

    def close(self):
        self.closed = True


def _host_view(dev) -> np.ndarray:
    """The emulator's device memory of `dev` as a NumPy array (it is host memory), no copy."""
    raw = (ctypes.c_char * max(dev.nbytes, 1)).from_address(dev.ptr)
    return np.frombuffer(raw, dtype=dev.dtype, count=dev.size).reshape(dev.shape)


def breaker_open_for_add(fail, **executor_cfg):
    """(FakeGpuBackend, Executor, a) where three `add` calls that `fail(call)` made fail ("launch") have
    opened the breaker for add and its cooldown has passed: the next `ex.add(a, a)` is the half-open
    probe. `fail` is consulted on every GPU run, so the test decides what the probe meets."""
    import numpy as np

    from hipsched import Executor
    gpu = FakeGpuBackend(ops=("add",), fail=fail)
    cfg = dict(persist_model=False, telemetry_path=None, breaker_cooldown_s=0.02, strategy="gpu_preferred")
    ex = Executor(gpu_backend=gpu, **{**cfg, **executor_cfg})
    a = np.ones((64, 64), np.float32)
    for _ in range(3):
        ex.add(a, a)
    assert ex.gpu_health("add")["state"] == "open"
    time.sleep(0.03)
    return gpu, ex, a
