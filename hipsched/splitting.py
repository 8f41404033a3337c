"""Splitting one call across processors: a call the model predicts to take long enough is cut along the
rows of its largest operand (OpSpec.partition) so that the CPU and each GPU take a share and finish at the
same time, the parts running at once (the CPU kernel on its threads in the calling thread, each GPU's
part in a worker thread that waits on its stream), the result merged from the parts in row order.

The shares come from the models that pick a side (hipsched._sched): each side's predicted time at its
share of the call's work, copies included, is made equal across the sides. The executor's GPU (the one
backend="gpu" means) is judged by the executor's own model; every further device has a model and a
circuit breaker of its own (a SchedCore whose GPU side is that device), and until a device has run an
op its time is predicted as the executor's GPU's. Each part's time is learned as its side's sample at
the part's size, so the shares follow what the sides really do (a CPU part slowed by the GPU parts'
pageable uploads is what the CPU does while splitting, and the next shares take it into account). A GPU
part that fails reruns on the CPU (nothing lost, nothing twice), and the failure counts against that
device's health like any GPU run's. docs/guide/splitting.md, "Splitting one call"."""
from __future__ import annotations

import math
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from ._sched import BACKEND_CPU, BACKEND_GPU, F_FITS, F_GPU_PRESENT, F_GPU_SUPPORTS
from .errors import GpuError
from .ops import OPS

# A split must be predicted at most this share of the better single side's time: below, the cut, the
# thread hand-off and the merge (tens of microseconds) and the model's error would eat the gain. A side
# slower than GAIN / (1 - GAIN) times the best is left out: it could add at most 1 - GAIN of the rate.
GAIN = 0.9
# No side takes less than this share of the rows: a sliver would cost its side's fixed overheads
# (a launch, a copy's latency, waking the CPU's threads) for almost no work.
MIN_SHARE = 0.05
# Rounds of the balance solver (see _balance): each moves every side's share to where the lines through
# its last two predictions meet the others'; the predictions are piecewise linear in the work, so a few
# rounds settle far below a row's worth of time.
ROUNDS = 5
# Cut points are rounded to this many rows when the call has at least ALIGN * 64 of them: a part that
# starts on a multiple of 64 rows keeps the 16-byte alignment the GPU's vector kernels need for any row
# length, and 1-d arrays (add, scale) split on elements.
ALIGN = 64
# How long the calling thread waits for the GPU parts' threads to start before it runs the CPU's part
_START_WAIT_S = 0.002
# The flags a further device's own core decides with: present, supporting and fitting (judged by its
# backend first), so its answer is its health alone (see Side)
_HEALTH_FLAGS = F_GPU_PRESENT | F_GPU_SUPPORTS | F_FITS


class Side:
    """One processor a split can use: the CPU, the executor's GPU, or a further GPU with its own core
    (strategy gpu_preferred, min_batch 0, so that its decide() answers with the breaker's state alone).
    `name` is what events call it: cpu, gpu (an executor with one GPU) or gpu:<device index>."""

    __slots__ = ("name", "backend", "core", "is_cpu")

    def __init__(self, name, backend, core, is_cpu=False):
        self.name, self.backend, self.core = name, backend, core
        self.is_cpu = is_cpu


class SplitPlan:
    """Where a call is cut: side i takes rows [bounds[i], bounds[i + 1]); the model's predictions (us)
    for the whole split call and for each side's part (by side name)."""

    __slots__ = ("partition", "sides", "bounds", "slots", "copies", "predicted_us", "predicted")

    def __init__(self, partition, sides, bounds, predicted_us, predicted, slots=None, copies=None):
        self.partition = partition
        self.sides = sides
        self.bounds = bounds
        self.slots = slots or {}        # side name -> the slot of its own core (further GPUs)
        self.copies = copies or {}      # side name -> (h2d, d2h) bytes of the whole call on that side
        self.predicted_us = predicted_us
        self.predicted = predicted

    @property
    def shares(self) -> dict:
        rows = self.partition.rows
        return {s.name: (self.bounds[i + 1] - self.bounds[i]) / rows for i, s in enumerate(self.sides)}

    @property
    def gpu_share(self) -> float:
        return sum(v for k, v in self.shares.items() if k != "cpu")


class Splitter:
    """Plans and runs split calls for one executor (its scheduler core, backends and telemetry).
    `others`: the further GPU backends, each with the core `make_core()` gives it."""

    def __init__(self, core, cpu, gpu, min_us: float, record_event, others=(), make_core=None):
        self.core = core
        self.cpu = cpu
        self.gpu = gpu
        self.min_us = float(min_us)
        self.record_event = record_event     # (call, duration_us, pc, pg, fallback, split dict) -> None
        several = bool(others)
        self.cpu_side = Side("cpu", cpu, core, is_cpu=True)
        self.gpu_side = Side(f"gpu:{gpu.device_index}" if several else "gpu", gpu, core)
        self.others = [Side(f"gpu:{g.device_index}", g, make_core()) for g in others]
        self._pool = None
        self._pool_lock = threading.Lock()
        # a forked child has the pool object but not its thread: a part submitted there would wait
        # forever, so the child starts afresh (a weak reference: the hook outlives the executor)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (s := ref()) is not None and s._forget_pool())

    @property
    def sides(self) -> list:
        return [self.cpu_side, self.gpu_side, *self.others]

    # ------------------------------------------------------------------ planning
    def plan(self, call, slot: int, pc: float, pg: float, h2d: float, d2h: float) -> SplitPlan | None:
        """The split of `call` that the models predict to finish soonest, or None when running it whole
        on the better side is predicted as good (a short call, an unknown side, no partition)."""
        best = min(pc, pg)
        if not (best >= self.min_us and math.isfinite(best)) or call.on_device:
            return None
        spec = OPS.get(call.op)
        if spec is None or spec.partition is None:
            return None
        limit = best * GAIN / (1.0 - GAIN)
        # a pair whose slower side is past the limit cannot be helped (and no further device is asked)
        if not self.others and max(pc, pg) > limit:
            return None
        part = spec.partition(call)
        if part is None or part.rows < 2 * max(1, part.min_rows):
            return None
        core, size = self.core, float(call.size)
        model = core.transfer_model()
        up_us = 1.0 / (model["h2d_gbps"] * 1e3)
        down_us = 1.0 / (model["d2h_gbps"] * 1e3)

        def gpu_time(predict, up, down):
            def t(share):
                copies = ((model["h2d_latency_us"] + up * share * up_us if up > 0 else 0.0)
                          + (model["d2h_latency_us"] + down * share * down_us if down > 0 else 0.0))
                return predict(size * share) + copies
            return t

        sides, times, slots, copies = [], [], {}, {}
        if pc <= limit:
            sides.append(self.cpu_side)
            times.append(lambda share: core.predict(slot, BACKEND_CPU, size * share))
        if pg <= limit:
            sides.append(self.gpu_side)
            times.append(gpu_time(lambda work: core.predict(slot, BACKEND_GPU, work), h2d, d2h))
            copies[self.gpu_side.name] = (h2d, d2h)
        for side in self.others:
            judged = self._judge(side, call, slot, size)
            if judged is None:
                continue
            slots[side.name], up, down, predict = judged
            t = gpu_time(predict, up, down)
            if t(1.0) <= limit:
                sides.append(side)
                times.append(t)
                copies[side.name] = (up, down)
        plan = self._cut(part, sides, times, best)
        # a device judged but given no part: a half-open probe it was granted waits for the next call
        for side in self.others:
            if side.name in slots and (plan is None or side not in plan.sides):
                side.core.release_probe(slots[side.name])
        if plan is not None:
            plan.slots, plan.copies = slots, copies
        return plan

    def _judge(self, side, call, slot, size):
        """(its core's slot, h2d, d2h, predict(work)) of a further device that can take part in `call`
        now, or None: it must be up, take the call's shapes and fit it in free memory (its backend's
        judgement, with what it keeps resident), and its breaker must let it run."""
        g = side.backend
        try:
            if not g.available or not g.supports(call.op, call.dtype):
                return None
            j = g.judge(call)
        except Exception:  # a device that cannot answer is not trusted with a part
            return None
        if j.refusal is not None or not j.fits:
            return None
        up, down = j.h2d, j.d2h
        s_slot = side.core.slot(call.op, call.dtype)
        if side.core.decide(s_slot, size, up, down, _HEALTH_FLAGS, True)[0] != BACKEND_GPU:
            return None
        own, core = side.core, self.core

        def predict(work):
            t = own.predict(s_slot, BACKEND_GPU, work)
            # not yet measured on this device: predicted as the executor's GPU until its first part
            return core.predict(slot, BACKEND_GPU, work) if math.isnan(t) else t
        return s_slot, up, down, predict

    def _cut(self, part, sides, times, best) -> SplitPlan | None:
        if len(sides) < 2:
            return None
        shares = _balance(times)
        if shares is None:
            return None
        keep = [i for i, s in enumerate(shares) if s > 0]
        if len(keep) < 2:
            return None
        sides, times = [sides[i] for i in keep], [times[i] for i in keep]
        rows, least = part.rows, max(1, part.min_rows)
        bounds, acc = [0], 0.0
        for i in keep[:-1]:
            acc += shares[i]
            b = int(round(acc * rows))
            if rows >= ALIGN * 64:
                b = int(round(b / ALIGN)) * ALIGN
            # every part keeps its least rows: this one after the last bound, those still to come before the end
            bounds.append(min(max(b, bounds[-1] + least), rows - least * (len(keep) - len(bounds))))
        bounds.append(rows)
        if any(hi - lo < least for lo, hi in zip(bounds, bounds[1:])):
            return None
        predicted = {s.name: t((hi - lo) / rows) for s, t, lo, hi in zip(sides, times, bounds, bounds[1:])}
        total = max(predicted.values())
        if not total <= GAIN * best:
            return None
        return SplitPlan(part, sides, bounds, total, predicted)

    # ------------------------------------------------------------------ running
    def _worker(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1 + len(self.others),
                                                    thread_name_prefix="hipsched-split")
        return self._pool

    def _forget_pool(self) -> None:
        self._pool = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    @staticmethod
    def _gpu_part(backend, call, stream, started=None):
        if started is not None:
            started.release()
        t0 = time.perf_counter_ns()
        try:
            return backend.run(call, stream), (time.perf_counter_ns() - t0) * 1e-3, None
        except Exception as e:  # noqa: BLE001 - any GPU-side failure reruns the part on the CPU
            err = e if isinstance(e, GpuError) else GpuError("runtime", f"{type(e).__name__}: {e}")
            return None, (time.perf_counter_ns() - t0) * 1e-3, err

    def run(self, plan: SplitPlan, call, slot: int, pc: float, pg: float, h2d: float, d2h: float, stream=None):
        """Run `call` as `plan` cuts it and merge the parts; records one event and a sample per part."""
        part, bounds, sides, rows = plan.partition, plan.bounds, plan.sides, plan.partition.rows
        shares = [(hi - lo) / rows for lo, hi in zip(bounds, bounds[1:])]
        calls = [call.part(part.args(lo, hi), f) for lo, hi, f in zip(bounds, bounds[1:], shares)]
        # the calling thread runs the CPU's part, or (no CPU part) the last GPU's; the others go to workers
        here = 0 if sides[0].is_cpu else len(sides) - 1
        # the caller's stream belongs to the executor's GPU; a further device's part runs on its own
        streams = [stream if s is self.gpu_side else None for s in sides]
        t0 = time.perf_counter_ns()
        started = threading.Semaphore(0)
        pending = {i: self._worker().submit(self._gpu_part, s.backend, calls[i], streams[i], started)
                   for i, s in enumerate(sides) if i != here}
        # The GPU parts' threads start before the CPU part takes every core: a woken thread waits for a
        # core the CPU kernel's threads hold (on 2 cores, milliseconds with two GPUs), and its part,
        # launched that late, ends that late. Bounded: a pool thread that cannot start soon is not awaited.
        deadline = time.monotonic() + _START_WAIT_S
        for _ in pending:
            if not started.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        results = [None] * len(sides)
        try:
            if sides[here].is_cpu:
                th = time.perf_counter_ns()
                results[here] = (self.cpu.run(calls[here]), (time.perf_counter_ns() - th) * 1e-3, None)
            else:
                results[here] = self._gpu_part(sides[here].backend, calls[here], streams[here])
        finally:
            for i, fut in pending.items():   # never leave a GPU part running behind an error
                results[i] = fut.result()
        outs, parts, errors = [], [], []
        cpu_us = gpu_us = 0.0
        for i, (side, (out, us, err)) in enumerate(zip(sides, results)):
            if side.is_cpu:
                self.core.record_sample(slot, BACKEND_CPU, calls[i].size, us)
                cpu_us += us
            else:
                out, us, err = self._learn_gpu_part(plan, side, slot, calls[i], shares[i], out, us, err)
                if err is None:
                    gpu_us += us
                else:
                    cpu_us += us
                    errors.append(f"{side.name}: {err}" if self.others else str(err))
            outs.append(out)
            parts.append({"backend": side.name if err is None else "cpu", "rows": [bounds[i], bounds[i + 1]],
                          "duration_us": round(us, 3)})
        out = part.merge(outs, list(zip(bounds, bounds[1:])))
        dur = (time.perf_counter_ns() - t0) * 1e-3
        fallback = ("gpu", "; ".join(errors)) if errors else None
        # the call counts once among the core's operations (its parts were recorded as not final)
        self.core.count_split(cpu_us, gpu_us, fallback is not None)
        self.record_event(call, dur, pc, pg, fallback, {
            "shares": {s.name: round(f, 6) for s, f in zip(sides, shares)}, "parts": parts,
            "predicted_us": round(plan.predicted_us, 3), "balance": round(balance(rows, parts, dur), 4)})
        return out

    def _learn_gpu_part(self, plan, side, slot, call, share, out, us, err):
        """A GPU part's sample and health, in the core that judges its device; a failed part rerun on
        the CPU here (every row once) -> (result, time including the rerun, error or None)."""
        core = side.core
        s_slot = plan.slots.get(side.name, slot)
        up, down = plan.copies.get(side.name, (0.0, 0.0))
        if err is None:
            core.record_sample(s_slot, BACKEND_GPU, call.size, us, up * share, down * share)
            return out, us, None
        if err.kind == "unsupported":
            core.release_probe(s_slot)
        else:
            core.record_gpu_failure(s_slot, call.size, us, up * share, down * share)
        if err.kind == "oom":
            side.backend.forget_free_memory()
        tr0 = time.perf_counter_ns()
        out = self.cpu.run(call)
        return out, us + (time.perf_counter_ns() - tr0) * 1e-3, err


def _balance(times) -> list | None:
    """Shares (summing to 1; 0 for a side left out) at which every side's predicted time t_i(share) is
    the same, or None when a side cannot be predicted. Each round fits a line through each side's last
    two predictions and solves the lines for a common finish time T (t_i = a_i + b_i s_i, sum s_i = 1:
    T = (1 + sum a_i / b_i) / sum 1 / b_i); a side whose share falls below MIN_SHARE is left out."""
    n = len(times)
    pts = []
    for t in times:
        p1, p2 = t(1.0), t(0.5)
        if not (math.isfinite(p1) and math.isfinite(p2)):
            return None
        pts.append([(0.5, p2), (1.0, p1)])
    active = list(range(n))
    shares = [0.0] * n
    for _ in range(ROUNDS):
        lines = {}
        for i in active:
            (s0, t0), (s1, t1) = pts[i]
            b = (t1 - t0) / (s1 - s0)
            b = max(b, 1e-9 * max(abs(t0), abs(t1), 1.0))   # a flat or falling stretch: time grows anyway
            lines[i] = (t1 - b * s1, b)
        while True:
            inv = sum(1.0 / lines[i][1] for i in active)
            T = (1.0 + sum(lines[i][0] / lines[i][1] for i in active)) / inv
            s = {i: (T - lines[i][0]) / lines[i][1] for i in active}
            worst = min(active, key=s.__getitem__)
            if s[worst] >= MIN_SHARE:
                break
            active.remove(worst)
            if len(active) < 2:
                return None
        shares = [0.0] * n
        for i in active:
            shares[i] = min(max(s[i], MIN_SHARE), 1.0)
        for i in active:
            t = times[i](shares[i])
            if not math.isfinite(t):
                return None
            if abs(shares[i] - pts[i][1][0]) > 1e-12:
                pts[i] = [pts[i][1], (shares[i], t)]
    total = sum(shares)
    return [s / total for s in shares]


def balance(rows: int, parts: list, duration_us: float) -> float:
    """How evenly a split call kept its processors busy: the time the rows would take at the parts' summed
    throughputs (each part's rows over its own time, as it ran beside the others) over the call's time
    (1.0: every side finished together and nothing else took time). The benchmark's measure is EngineCL's,
    with single-side throughputs measured alone (bench/split.py)."""
    rate = sum((p["rows"][1] - p["rows"][0]) / p["duration_us"] for p in parts if p["duration_us"] > 0)
    if rate <= 0 or duration_us <= 0:
        return 0.0
    return (rows / rate) / duration_us
