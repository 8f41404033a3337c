"""Splitting one call across processors: a call the model predicts to take long enough is cut along the
rows of its largest operand (OpSpec.partition) so that the CPU and the GPU each take a share and finish
at the same time, the parts running at once (the CPU kernel on its threads in the calling thread, the
GPU's part in a worker thread that waits on its stream), the result merged from the parts in row order.

The shares come from the same model that picks a side (hipsched._sched): the GPU's share f is where its
predicted time at f of the call's work, copies included, meets the CPU's at 1 - f. Each part's time is
learned as its side's sample at the part's size, so the shares follow what the sides really do (a CPU
part slowed by the GPU part's pageable uploads is what the CPU does while splitting, and the next shares
take it into account). A GPU part that fails reruns on the CPU (nothing lost, nothing twice), and the
failure counts against the GPU's health like any GPU run's. docs/scheduling.md, "Splitting one call"."""
from __future__ import annotations

import math
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from ._sched import BACKEND_CPU, BACKEND_GPU
from .errors import GpuError
from .ops import OPS

# A split must be predicted at most this share of the better single side's time: below, the cut, the
# thread hand-off and the merge (tens of microseconds) and the model's error would eat the gain.
GAIN = 0.9
# Neither side takes less than this share of the rows: a sliver would cost its side's fixed overheads
# (a launch, a copy's latency, waking the CPU's threads) for almost no work.
MIN_SHARE = 0.05
# Bisection steps for the balance point (2^-30 of the rows: far below a row for any array that fits).
STEPS = 30
# Cut points are rounded to this many rows when the call has at least ALIGN * 64 of them: a part that
# starts on a multiple of 64 rows keeps the 16-byte alignment the GPU's vector kernels need for any row
# length, and 1-d arrays (add, scale) split on elements.
ALIGN = 64


class SplitPlan:
    """Where a call is cut: rows [0, cut) on the CPU, [cut, rows) on the GPU; the model's predictions."""

    __slots__ = ("partition", "cut", "predicted_us", "predicted_cpu_us", "predicted_gpu_us")

    def __init__(self, partition, cut, predicted_us, predicted_cpu_us, predicted_gpu_us):
        self.partition = partition
        self.cut = cut
        self.predicted_us = predicted_us
        self.predicted_cpu_us = predicted_cpu_us
        self.predicted_gpu_us = predicted_gpu_us

    @property
    def gpu_share(self) -> float:
        return (self.partition.rows - self.cut) / self.partition.rows


class Splitter:
    """Plans and runs split calls for one executor (its scheduler core, backends and telemetry)."""

    def __init__(self, core, cpu, gpu, min_us: float, record_event):
        self.core = core
        self.cpu = cpu
        self.gpu = gpu
        self.min_us = float(min_us)
        self.record_event = record_event     # (call, duration_us, pc, pg, fallback, split dict) -> None
        self._pool = None
        self._pool_lock = threading.Lock()
        # a forked child has the pool object but not its thread: a part submitted there would wait
        # forever, so the child starts afresh (a weak reference: the hook outlives the executor)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (s := ref()) is not None and s._forget_pool())

    # ------------------------------------------------------------------ planning
    def plan(self, call, slot: int, pc: float, pg: float, h2d: float, d2h: float) -> SplitPlan | None:
        """The split of `call` that the model predicts to finish soonest, or None when running it whole
        on the better side is predicted as good (a short call, an unknown side, no partition)."""
        best = min(pc, pg)
        if not (best >= self.min_us and math.isfinite(best)) or call.on_device:
            return None
        # even perfectly balanced, two sides finish in best * slow / (best + slow): with the slower more
        # than GAIN / (1 - GAIN) times the better, no split can reach GAIN (and the plan's predictions
        # are not worth asking for)
        if max(pc, pg) > best * GAIN / (1.0 - GAIN):
            return None
        spec = OPS.get(call.op)
        if spec is None or spec.partition is None:
            return None
        part = spec.partition(call)
        if part is None or part.rows < 2 * max(1, part.min_rows):
            return None
        core, size = self.core, float(call.size)
        model = core.transfer_model()
        up_us = 1.0 / (model["h2d_gbps"] * 1e3)
        down_us = 1.0 / (model["d2h_gbps"] * 1e3)

        def t_cpu(share):
            return core.predict(slot, BACKEND_CPU, size * share)

        def t_gpu(share):
            copies = ((model["h2d_latency_us"] + h2d * share * up_us if h2d > 0 else 0.0)
                      + (model["d2h_latency_us"] + d2h * share * down_us if d2h > 0 else 0.0))
            return core.predict(slot, BACKEND_GPU, size * share) + copies

        # the GPU's time grows with its share and the CPU's falls: bisect for where they meet
        lo, hi = MIN_SHARE, 1.0 - MIN_SHARE
        if not (math.isfinite(t_cpu(1.0 - lo)) and math.isfinite(t_gpu(lo))):
            return None
        for _ in range(STEPS):
            mid = 0.5 * (lo + hi)
            if t_gpu(mid) < t_cpu(1.0 - mid):
                lo = mid
            else:
                hi = mid
        f = 0.5 * (lo + hi)
        rows = part.rows
        cut = rows - int(round(f * rows))
        if rows >= ALIGN * 64:
            cut = int(round(cut / ALIGN)) * ALIGN
        cut = min(max(cut, part.min_rows), rows - part.min_rows)
        f = (rows - cut) / rows
        tc, tg = t_cpu(1.0 - f), t_gpu(f)
        predicted = max(tc, tg)
        if not predicted <= GAIN * best:
            return None
        return SplitPlan(part, cut, predicted, tc, tg)

    # ------------------------------------------------------------------ running
    def _worker(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hipsched-split")
        return self._pool

    def _forget_pool(self) -> None:
        self._pool = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _gpu_part(self, call, stream):
        t0 = time.perf_counter_ns()
        try:
            return self.gpu.run(call, stream), (time.perf_counter_ns() - t0) * 1e-3, None
        except Exception as e:  # noqa: BLE001 - any GPU-side failure reruns the part on the CPU
            err = e if isinstance(e, GpuError) else GpuError("runtime", f"{type(e).__name__}: {e}")
            return None, (time.perf_counter_ns() - t0) * 1e-3, err

    def run(self, plan: SplitPlan, call, slot: int, pc: float, pg: float, h2d: float, d2h: float, stream=None):
        """Run `call` as `plan` cuts it and merge the parts; records one event and a sample per part."""
        part, cut, rows = plan.partition, plan.cut, plan.partition.rows
        f = plan.gpu_share

        cpu_call, gpu_call = call.part(part.args(0, cut), 1.0 - f), call.part(part.args(cut, rows), f)
        t0 = time.perf_counter_ns()
        pending = self._worker().submit(self._gpu_part, gpu_call, stream)
        try:
            tc0 = time.perf_counter_ns()
            cpu_out = self.cpu.run(cpu_call)
            cpu_us = (time.perf_counter_ns() - tc0) * 1e-3
        finally:
            gpu_out, gpu_us, err = pending.result()   # never leave the GPU part running behind an error
        fallback = None
        core = self.core
        core.record(slot, BACKEND_CPU, cpu_call.size, cpu_us, 0.0, 0.0, True, False, False)
        if err is None:
            core.record(slot, BACKEND_GPU, gpu_call.size, gpu_us, h2d * f, d2h * f, True, False, False)
        else:
            if err.kind == "unsupported":
                core.release_probe(slot)
            else:
                core.record(slot, BACKEND_GPU, gpu_call.size, gpu_us, h2d * f, d2h * f, False, False, False)
            if err.kind == "oom":
                self.gpu.forget_free_memory()
            fallback = ("gpu", str(err))
            tr0 = time.perf_counter_ns()
            gpu_out = self.cpu.run(gpu_call)   # the GPU's rows on the CPU: every row once
            gpu_us += (time.perf_counter_ns() - tr0) * 1e-3
        out = part.merge([cpu_out, gpu_out], [(0, cut), (cut, rows)])
        dur = (time.perf_counter_ns() - t0) * 1e-3
        # the call counts once among the core's operations (its parts were recorded as not final)
        core.count_split(cpu_us + (gpu_us if err is not None else 0.0), gpu_us if err is None else 0.0,
                         fallback is not None)
        parts = [{"backend": "cpu", "rows": [0, cut], "duration_us": round(cpu_us, 3)},
                 {"backend": "gpu" if err is None else "cpu", "rows": [cut, rows], "duration_us": round(gpu_us, 3)}]
        self.record_event(call, dur, pc, pg, fallback, {
            "shares": {"cpu": round(1.0 - f, 6), "gpu": round(f, 6)}, "parts": parts,
            "predicted_us": round(plan.predicted_us, 3), "balance": round(balance(rows, parts, dur), 4)})
        return out


def balance(rows: int, parts: list, duration_us: float) -> float:
    """How evenly a split call kept its processors busy: the time the rows would take at the parts' summed
    throughputs (each part's rows over its own time, as it ran beside the others) over the call's time
    (1.0: every side finished together and nothing else took time). The benchmark's measure is EngineCL's,
    with single-side throughputs measured alone (bench/split.py)."""
    rate = sum((p["rows"][1] - p["rows"][0]) / p["duration_us"] for p in parts if p["duration_us"] > 0)
    if rate <= 0 or duration_us <= 0:
        return 0.0
    return (rows / rate) / duration_us
