"""A machine for calls in flight: a CPU and a GPU that each run one call at a time for a scripted time,
sleeping (so the callers' threads run meanwhile, and the machine running the tests does not set the
times). Results are real: the CPU kernels compute them, outside the side's time, or a `result` function
gives them (a benchmark that must not spend the real CPU on the GPU's results). tests/sched/test_submit.py
and bench/concurrency.py use it; the fake GPU of tests/support/fake_gpu.py runs calls concurrently, and
spins, so it cannot show a busy device."""
from __future__ import annotations

import threading

from hipsched.backends.cpu import CpuBackend
from hipsched.backends.interface import GpuBackendBase

from fake_gpu import sleep_us


class SerialSide:
    """One processor: a call holds it for its time; calls that arrive meanwhile wait their turn."""

    def __init__(self, us):
        self.us = us                 # call -> microseconds
        self.lock = threading.Lock()
        self.runs = 0

    def take(self, call):
        with self.lock:
            self.runs += 1
            sleep_us(self.us(call))


class Results:
    """A call's result: the CPU kernels', computed once per (op, arguments) (a GPU that must not spend the
    real CPU on its results: bench/concurrency.py; calls in virtual time: virtual_machine.py)."""

    def __init__(self):
        self._cpu = CpuBackend()
        self._done = {}
        self._lock = threading.Lock()

    def __call__(self, call):
        key = (call.op, tuple(id(a) for a in call.args), tuple(sorted(call.params.items(), key=str)))
        with self._lock:
            r = self._done.get(key)
            if r is None:
                r = self._done[key] = self._cpu.run(call)
            return r


class SideCpu:
    """A CPU backend whose calls each take `side` (its `take(call)` holds it for the call's time);
    results from `result(call)`, the CPU kernels by default."""

    def __init__(self, side, result=None):
        self.side = side
        self._result = result if result is not None else CpuBackend().run

    @property
    def runs(self):
        return self.side.runs

    def run(self, call, stream=None):
        out = self._result(call)
        self.side.take(call)
        return out

    def run_device_data(self, call):
        return self.run(call)

    def roofline_properties(self):
        return None


class SideGpu(GpuBackendBase):
    """A GPU backend whose calls each take `side`: one device with one stream, host data only, a free
    link (the copies are part of the side's time), every op and dtype the CPU runs."""
    name = "gpu"

    def __init__(self, side, result=None, label="side"):
        self.available = True
        self.runtime_name = label
        self.device_name = f"{label} GPU"
        self.device_arch = label
        self.side = side
        self._result = result if result is not None else CpuBackend().run

    @property
    def runs(self):
        return self.side.runs

    def supports(self, op, dtype):
        return True

    def max_elements(self, op):
        return 1 << 40

    def free_memory(self):
        return 1 << 36

    def device_bytes_needed(self, call):
        return call.nbytes

    def transfer_bytes(self, call):
        return (0, 0)

    def run(self, call, stream=None):
        out = self._result(call)
        self.side.take(call)
        return out

    def measure_transfer(self):
        return {"h2d_latency_us": 0.0, "h2d_gbps": 1e6, "d2h_latency_us": 0.0, "d2h_gbps": 1e6}


class SleepingCpu(SideCpu):
    """The loaded machine's CPU: `us(call)` of sleep a call, one call at a time."""

    def __init__(self, us):
        super().__init__(SerialSide(us))


class SleepingGpu(SideGpu):
    """The loaded machine's GPU: `us(call)` of sleep a call, one call at a time."""

    def __init__(self, us, result=None):
        super().__init__(SerialSide(us), result, "sleeping")
