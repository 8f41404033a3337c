"""A simulated machine (by default the H100) for routing tests and benchmarks on machines without a GPU: a GPU backend
(the interface Executor(gpu_backend=...) takes, as tests/support/fake_gpu.py) and a CPU backend
(Executor(cpu_backend=...)) that take the time the H100 and its 16-core host took, on a virtual clock.

What it models, and why that much:
- Compute: the measured latency of the op at the call's work measure on that machine
  (tests/support/h100_latency.py, with its provenance), interpolated linearly in log(size)-log(time)
  between measured sizes; below the smallest the smallest's time, above the largest the last segment's
  log-log slope clamped to [0, 1] (a kernel's time never falls with work nor grows faster than it).
  The GPU times were measured with the inputs resident and include the launch and the copy of the
  output back, so only uploads are added to them.
- Residency: the real backend's rule (hipsched.gpu.memory.resident_cache.ResidentCache): a host array uploaded once
  stays on the device only when its bytes cannot change unseen (read-only through its base chain,
  registered, or a QuantizedTensor's blocks), LRU by bytes within the package's default budget (half the
  device memory free at start, DEFAULT_RESIDENT_SHARE) or a budget given; writable arrays,
  arrays larger than the budget and non-contiguous ones are uploaded on every call. transfer_bytes()
  reports what a call would upload now, and would_keep() what a run would keep, as the real ones.
- The machine: a sim_machine.Machine (a dataclass, loadable from JSON: bench/machines/*.json) scales
  and perturbs those times: compute scale per side, a GPU launch cost, run-to-run noise with a heavy
  tail, a deterministic per-(side, op, size) jitter (sizes not on one smooth line), a bimodal CPU, and
  the real link (pinned for registered arrays, pageable otherwise, slower above a size) against what
  measure_transfer() reports. `Machine()` is the machine simulated before issue 32: 5% noise on compute,
  the probed link but for pageable uploads over 64 MiB at the 8.5 GB/s the demo logs showed.

Time is virtual: a run computes its result with the real CPU engine (so results are right) and then
advances the SimClock by the modelled time, and `SimClock.executor_clock()` makes executors time calls
on that clock. Measured durations are then exactly the modelled ones, whatever the load of the machine
running the test (sleeping for the modelled time was tried first: on this project's shared 2-core
machines, at load averages of 30 to 300, neither sleeps nor the real CPU's times meant anything).
A simulated CPU backend has no compiled kernels for the executor to call directly, so every call
takes the executor's general path, whose clock is the patched one. One clock per process at a time:
the patch is of hipsched.executor's module clock."""
from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import math
import threading
import weakref

import numpy as np

from hipsched.backends.cpu import CpuBackend
from hipsched.backends.interface import GpuBackendBase
from hipsched.ops.base import host_arrays
from hipsched.resident_array import handle_of, immutable

from hipsched.gpu.memory.resident_cache import DEFAULT_RESIDENT_SHARE

from h100_latency import CPU_US, GPU_US  # noqa: E402
from sim_machine import Machine, RunNoise  # noqa: E402

# what the simulated device reports free, and so what the default budget is a share of
FREE_BYTES = 79 << 30


def _host_arrays(args, trusted=None):
    """The host arrays a call uploads; `trusted` (a set) collects the ids of those whose owner guarantees
    they never change (a QuantizedTensor's blocks), which the real cache keeps whatever their flags."""
    found = host_arrays(args)
    if trusted is not None:
        trusted.update(id(a) for a, t in found if t)
    return [a for a, _ in found]


def latency_us(table, op, size):
    """The modelled time of `op` at work `size` from `table` (GPU_US: resident inputs), microseconds."""
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


def upload_us(nbytes, machine=Machine(), pinned=False):
    return machine.h2d_us(nbytes, pinned)


class SimClock:
    """Virtual nanoseconds, advanced only by simulated runs."""

    def __init__(self):
        # a monotonic clock reads the time since boot, not 0: the executor's caches compare readings
        # with a time-to-live from 0 (its free-memory reading would otherwise be "fresh" at the start)
        self.ns = 10 ** 12
        self._lock = threading.Lock()

    def advance_us(self, us):
        with self._lock:
            self.ns += int(round(us * 1e3))

    def clock_ns(self):
        return self.ns

    @contextlib.contextmanager
    def executor_clock(self):
        """Within the block, executors time calls on this clock (the general path's, hipsched._dispatch)."""
        import hipsched._dispatch as dispatch_module
        saved = dispatch_module._perf_ns
        dispatch_module._perf_ns = self.clock_ns
        try:
            yield self
        finally:
            dispatch_module._perf_ns = saved


class _Noise:
    def __init__(self, machine, seed, expected=False):
        self.noise = RunNoise(machine, seed, expected)
        self.lock = threading.Lock()

    def __call__(self, side, op):
        with self.lock:
            return self.noise.factor(side, op)


def _machine(machine, sigma):
    if machine is None:
        return Machine(sigma=0.05 if sigma is None else sigma)
    return machine if sigma is None else dataclasses.replace(machine, sigma=sigma)


class SimulatedCpu:
    """The CPU backend of the simulated machine: real results, the H100 host's times (CPU_US)."""

    def __init__(self, clock, sigma=None, seed=0, table=CPU_US, machine=None, expected=False):
        self.clock = clock
        self._table = table
        self.machine = _machine(machine, sigma)
        self._noise = _Noise(self.machine, seed, expected)
        self._cpu = CpuBackend()
        self.runs = 0

    def run(self, call):
        if call.op not in self._table:   # no measured time to take (calibrate skips such ops)
            raise NotImplementedError(f"simulated CPU: no H100-host latencies for {call.op}")
        out = self._cpu.run(call)
        self.runs += 1
        m = self.machine
        self.clock.advance_us(latency_us(self._table, call.op, call.size) * m.cpu_scale
                              * m.jitter("cpu", call.op, call.size) * self._noise("cpu", call.op))
        return out

    def run_device_data(self, call):   # the simulated GPU takes host arrays only
        return self.run(call)

    def roofline_properties(self):
        """What hipsched.priors.measure_cpu would find on this host: a tiny call, the largest add's
        bandwidth (3 float32 per element), the largest matmul's rate (2 flops per unit of work)."""
        m = self.machine
        add = self._table["add"][-1]
        mm = self._table["matmul"][-1]
        return {"launch_us": min(t for _, t, _ in self._table["add"]) * m.cpu_scale,
                "gbps": 12 * add[0] / (add[1] * m.cpu_scale) / 1e3,
                "gflops": 2 * mm[0] / (mm[1] * m.cpu_scale) / 1e3}


class SimulatedGpu(GpuBackendBase):
    """GpuBackend with the H100's times (see the module docstring)."""
    name = "gpu"

    def __init__(self, clock, ops=None, sigma=None, seed=0, resident_bytes=None, table=GPU_US,
                 device_name="simulated NVIDIA H100 80GB HBM3", machine=None, expected=False):
        self.clock = clock
        self.available = True
        self.unavailable_reason = None
        self.runtime_name = "simulated"
        self.device_name = device_name
        self.device_arch = "sm_90 (simulated)"
        self._table = table
        self._ops = set(ops if ops is not None else table)
        self.machine = _machine(machine, sigma)
        self._noise = _Noise(self.machine, seed, expected)
        # the real backend's default (resident_cache.resident_budget) unless a budget is given
        self._budget = int(FREE_BYTES * DEFAULT_RESIDENT_SHARE) if resident_bytes is None else resident_bytes
        self._resident = collections.OrderedDict()   # id(host) -> (weakref, nbytes)
        self._resident_total = 0
        self._lock = threading.Lock()
        self._cpu = CpuBackend()
        self.runs = 0
        self.uploaded_bytes = 0

    # ---------------------------------------------------------------- the GpuBackend interface
    def supports(self, op, dtype):
        return op in self._ops and dtype in ("float32", "q8_0", "q4_0")

    def max_elements(self, op):
        return 1 << 40

    def free_memory(self):
        return FREE_BYTES

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
        out = self._cpu.run(call)
        with self._lock:
            trusted = set()
            arrays = _host_arrays(call.args, trusted)
            new = [a for a in arrays if not self._is_resident(a)]
            up = sum(a.nbytes for a in new)
            pinned = sum(a.nbytes for a in new if handle_of(a) is not None)
            for a in arrays:
                if self.would_keep(a, id(a) in trusted):
                    self._keep(a)
            self.runs += 1
            self.uploaded_bytes += up
        m = self.machine
        out_bytes = max(0, call.nbytes - sum(a.nbytes for a in arrays))
        kernel = (latency_us(self._table, call.op, call.size) * m.gpu_scale * m.jitter("gpu", call.op, call.size)
                  + m.gpu_launch_us + m.d2h_extra_us(out_bytes)) * self._noise("gpu", call.op)
        copies = m.h2d_us(pinned, True) + m.h2d_us(up - pinned, False)
        kernel = max(kernel, 1.0)
        self.clock.advance_us(kernel + copies)
        # the parts as events around the copies and the kernel would time them, written into the call's
        # judgement (Judgement.parts); a machine with times_parts False, like a backend without such
        # events, reports none
        if call.judged is not None and m.times_parts:
            call.judged.parts = (float(up), copies, kernel)
        return out

    def measure_transfer(self):
        return self.machine.probe()

    def roofline_properties(self):
        """The device's figures as a real backend would give them: an H100's memory bandwidth and fp32
        rate (device properties), a tiny call's time as its launch (scaled by the machine)."""
        m = self.machine
        return {"launch_us": min(t for _, t, _ in self._table["add"]) * m.gpu_scale + m.gpu_launch_us,
                "gbps": 3350.0 / m.gpu_scale, "gflops": 60000.0 / m.gpu_scale}

    def close(self):
        pass

    # ---------------------------------------------------------------- residency
    def is_resident(self, a):
        with self._lock:
            return self._is_resident(a)

    def would_keep(self, a, trusted=False):
        return (a.nbytes <= self._budget and a.flags.c_contiguous
                and (trusted or immutable(a) or handle_of(a) is not None))

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


def simulated_machine(clock=None, seed=0, sigma=None, resident_bytes=None, machine=None, expected=False):
    """{"gpu_backend": ..., "cpu_backend": ..., "split": False}: the Executor options of the simulated
    H100 machine (`resident_bytes`: the device's resident budget, None the package's default). Splitting is off: the virtual clock is one for the process, so two parts running at
    once would each advance it by their own time and the split call would take their sum (and the
    splitter times its parts on the wall clock, which here measures this machine computing the results);
    a split call's worth is measured by bench/split.py with a device that really runs beside the CPU.
    `expected`: every run takes its expected time (RunNoise), for an oracle."""
    clock = clock if clock is not None else SimClock()
    return {"gpu_backend": SimulatedGpu(clock, sigma=sigma, seed=2 * seed + 1, resident_bytes=resident_bytes,
                                        machine=machine, expected=expected),
            "cpu_backend": SimulatedCpu(clock, sigma=sigma, seed=2 * seed, machine=machine, expected=expected),
            "split": False}
