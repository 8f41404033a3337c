"""A deterministic stand-in for hipsched.backends.gpu.GpuBackend, for scheduler tests on machines
without a GPU. It implements the GpuBackend interface; its results are real (computed by the CPU
kernels), its failures and memory limits are scripted, and it can spin for a scripted time so the
executor measures known costs."""
from __future__ import annotations

import threading
import time

from hipsched.backends.cpu import CpuBackend
from hipsched.errors import GpuError


def spin_us(us: float):
    """Busy-wait (sleep is far too coarse for microsecond costs)."""
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


class FakeGpuBackend:
    name = "gpu"

    def __init__(self, ops=("add", "scale", "softmax", "cosine_similarity", "top_k", "matmul", "attention"),
                 dtypes=("float32",), max_elements=1 << 40, free_memory=1 << 34, oom_above_bytes=None,
                 cost_us=None, fail=None, available=True, transfer=None, unsupported=None):
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
        with self._lock:
            self.runs += 1
        if self.fail is not None:
            kind = self.fail(call)
            if kind:
                raise GpuError(kind, f"fake GPU scripted {kind} for {call.op}", "fakeError")
        if self.oom_above_bytes is not None and self.device_bytes_needed(call) > self.oom_above_bytes:
            raise GpuError("oom", f"fake GPU: {call.nbytes} bytes > {self.oom_above_bytes}", "fakeErrorOutOfMemory")
        if self.cost_us is not None:
            spin_us(self.cost_us(call))
        out = self._cpu.run(call)
        with self._lock:
            self.ok_runs += 1
            self.sizes.append(call.size)
        return out

    def measure_transfer(self):
        return dict(self._transfer)

    def close(self):
        self.closed = True


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
