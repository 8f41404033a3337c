"""A simulated GPU that takes the time an H100 took: a GpuBackend (the interface Executor(gpu_backend=...)
takes, as tests/support/fake_gpu.py) for routing tests and benchmarks on machines without a GPU.

What it models, and why that much:
- Compute: the measured H100 latency of the op at the call's work measure (tests/support/h100_latency.py,
  with its provenance), interpolated linearly in log(size)-log(time) between measured sizes; below the
  smallest the smallest's time, above the largest the last segment's log-log slope clamped to [0, 1]
  (a kernel's time never falls with work nor grows faster than it). Those times were measured with
  the inputs resident and include the launch and the copy of the output back, so only uploads are
  added here.
- Residency: like the real backend's resident cache, a host array uploaded once stays on the device
  (same object, LRU by bytes within RESIDENT_BYTES; arrays larger than that, or not C-contiguous, are
  uploaded on every call). transfer_bytes() reports what a call would upload now, as the real one.
- Link: uploads of non-resident inputs cost latency + bytes / bandwidth at the link hipsched measured
  on the H100 (measure_transfer() returns that), except that large pageable uploads run at the slower
  rate seen in the demo logs (LARGE_UPLOAD_GBPS): the scheduler's transfer model is then as wrong as
  it was there.
- Noise: each run's compute time is multiplied by exp(sigma * N(0, 1)), sigma 0.05 by default, from a
  seeded generator (run to run variation on the H100 was a few percent at these sizes); uploads are
  not noised.

The result is computed by the CPU engine (so it is right), and that computation is taken off the
clock: the simulator adds its duration to its SimClock's `hidden_ns`, and `executor_clock()` makes the
executor time calls with `perf_counter_ns() - hidden_ns`. Then it sleeps (and spins the last 0.3 ms) for the modelled
time. The clock is per simulator, not per thread: use it from one thread at a time."""
from __future__ import annotations

import bisect
import collections
import contextlib
import math
import threading
import time
import weakref

import numpy as np

from hipsched.backends.cpu import CpuBackend

from h100_latency import (GPU_US, LARGE_UPLOAD_BYTES, LARGE_UPLOAD_GBPS, MEASURED_TRANSFER,  # noqa: E402
                          RESIDENT_BYTES)


def _host_arrays(x):
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for item in x for a in _host_arrays(item)]
    data = getattr(x, "data", None)
    if isinstance(data, np.ndarray):
        return [data]
    return []


def gpu_latency_us(op, size, table=GPU_US):
    """The modelled H100 time of `op` at work `size` (resident inputs), microseconds."""
    pts = table[op]
    xs = [math.log(max(p[0], 1)) for p in pts]
    ys = [math.log(p[1]) for p in pts]
    x = math.log(max(size, 1))
    if x <= xs[0]:
        return pts[0][1]
    if x >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(pts) > 1 else 0.0
        return math.exp(ys[-1] + min(1.0, max(0.0, slope)) * (x - xs[-1]))
    i = bisect.bisect_right(xs, x) - 1
    f = (x - xs[i]) / (xs[i + 1] - xs[i])
    return math.exp(ys[i] + f * (ys[i + 1] - ys[i]))


def upload_us(nbytes):
    if nbytes <= 0:
        return 0.0
    gbps = LARGE_UPLOAD_GBPS if nbytes > LARGE_UPLOAD_BYTES else MEASURED_TRANSFER["h2d_gbps"]
    return MEASURED_TRANSFER["h2d_latency_us"] + nbytes / (gbps * 1e3)


def wait_us(us):
    """Sleeps most of `us` and spins the rest (sleep alone overshoots by tens of microseconds)."""
    end = time.perf_counter_ns() + int(us * 1e3)
    if us > 1000:
        time.sleep((us - 300) * 1e-6)
    while time.perf_counter_ns() < end:
        pass


class SimClock:
    """The executor's clock less the time simulators spent computing results. Simulators that share one
    (an auto executor's and an oracle's) keep one consistent clock."""

    def __init__(self):
        self.hidden_ns = 0

    def clock_ns(self):
        return time.perf_counter_ns() - self.hidden_ns

    @contextlib.contextmanager
    def executor_clock(self):
        """Within the block, executors time calls on this clock (results off the clock)."""
        import hipsched.executor as executor_module
        saved = executor_module._perf_ns
        executor_module._perf_ns = self.clock_ns
        try:
            yield self
        finally:
            executor_module._perf_ns = saved


class SimulatedGpu:
    """GpuBackend with H100 latencies (see the module docstring)."""
    name = "gpu"

    def __init__(self, ops=None, sigma=0.05, seed=0, resident_bytes=RESIDENT_BYTES, table=GPU_US,
                 device_name="simulated NVIDIA H100 80GB HBM3", clock=None):
        self.available = True
        self.unavailable_reason = None
        self.runtime_name = "simulated"
        self.device_name = device_name
        self.device_arch = "sm_90 (simulated)"
        self._table = table
        self._ops = set(ops if ops is not None else table)
        self._sigma = sigma
        self._rng = np.random.default_rng(seed)
        self._budget = resident_bytes
        self._resident = collections.OrderedDict()   # id(host) -> (weakref, nbytes)
        self._resident_total = 0
        self._lock = threading.Lock()
        self._cpu = CpuBackend()
        self.clock = clock if clock is not None else SimClock()
        self.runs = 0
        self.uploaded_bytes = 0

    # ---------------------------------------------------------------- the GpuBackend interface
    def supports(self, op, dtype):
        return op in self._ops and dtype in ("float32", "q8_0", "q4_0")

    def max_elements(self, op):
        return 1 << 40

    def free_memory(self):
        return 79 << 30

    def unsupported(self, call):
        return None

    def device_bytes_needed(self, call):
        return call.nbytes

    def _is_resident(self, a):
        e = self._resident.get(id(a))
        return e is not None and e[0]() is a

    def transfer_bytes(self, call):
        if call.on_device:
            return (0, 0)
        arrays = _host_arrays(call.args)
        total_in = sum(a.nbytes for a in arrays)
        with self._lock:
            h2d = sum(a.nbytes for a in arrays if not self._is_resident(a))
        return (int(h2d), int(max(0, call.nbytes - total_in)))

    def run(self, call, stream=None):
        t0 = time.perf_counter_ns()
        out = self._cpu.run(call)
        self.clock.hidden_ns += time.perf_counter_ns() - t0
        with self._lock:
            up = sum(a.nbytes for a in _host_arrays(call.args) if not self._is_resident(a))
            for a in _host_arrays(call.args):
                self._keep(a)
            noise = math.exp(self._sigma * self._rng.standard_normal()) if self._sigma else 1.0
            self.runs += 1
            self.uploaded_bytes += up
        wait_us(gpu_latency_us(call.op, call.size, self._table) * noise + upload_us(up))
        return out

    def measure_transfer(self):
        return dict(MEASURED_TRANSFER)

    def close(self):
        pass

    # ---------------------------------------------------------------- residency
    def _keep(self, a):
        key = id(a)
        if self._is_resident(a):
            self._resident.move_to_end(key)
            return
        if a.nbytes > self._budget or not a.flags.c_contiguous:
            return
        self._drop(key)
        while self._resident and self._resident_total + a.nbytes > self._budget:
            self._drop(next(iter(self._resident)))
        try:
            ref = weakref.ref(a)
        except TypeError:
            return
        self._resident[key] = (ref, a.nbytes)
        self._resident_total += a.nbytes

    def _drop(self, key):
        e = self._resident.pop(key, None)
        if e is not None:
            self._resident_total -= e[1]

    def executor_clock(self):
        return self.clock.executor_clock()
