"""A machine in virtual time for calls in flight: callers on threads call a real Executor (its real
decision code, its real dispatch path), and each side, the CPU and the GPU, is a timeline: a call starts
when its side is free, holds it for its modelled time, and its caller's thread sleeps in virtual time
until it ends. Only one caller runs at a time, and virtual time moves only when every caller sleeps (to
the earliest wake-up, ties to the lowest caller), so a run is the same schedule on any machine under
any load: tests check it exactly and bench/concurrency.py --sim reports it without the noise of the
machine running it.

The executor reads this clock: the dispatcher's timer (hipsched._dispatch._perf_ns) and the decision
core's (SchedCore.set_clock), so the samples it learns and the backlog it sees are in virtual time.
Results are real (the CPU kernels', computed once per op and arguments: loaded_machine.Results)."""
from __future__ import annotations

import contextlib
import heapq
import threading

import numpy as np

from loaded_machine import Results, SideCpu, SideGpu


class VirtualTime:
    """The clock and the conductor: `run(callers)` runs each function on a thread of its own."""

    def __init__(self, start_ns=10 ** 12):
        self.ns = start_ns
        self._cond = threading.Condition()
        self._sleepers = []          # heap of (wake ns, caller index, seq)
        self._turn = None            # the caller index allowed to run
        self._seq = 0
        self._live = 0
        self._blocked = []           # [(caller index, ready)] waiting for another caller's work
        self._stuck = False          # only blocked callers are left: none of them can go on
        self._cores = []
        self._index = threading.local()

    def clock_ns(self):
        return self.ns

    def attach(self, core):
        """Makes a decision core read this clock."""
        self._cores.append(core)
        core.set_clock(self.ns)

    def _set(self, ns):
        self.ns = ns
        for c in self._cores:
            c.set_clock(ns)

    def sleep_until(self, wake_ns):
        """The calling caller sleeps until virtual time `wake_ns` (others run meanwhile)."""
        me = self._index.i
        with self._cond:
            heapq.heappush(self._sleepers, (max(wake_ns, self.ns), me, self._seq))
            self._seq += 1
            self._next()
            while self._turn != me:
                self._cond.wait()

    def block_until(self, ready):
        """The calling caller waits, without moving the clock, until `ready()` is true: it is asked each
        time another caller gives up its turn (what it waits for is done by another caller)."""
        if ready():
            return
        me = self._index.i
        with self._cond:
            self._blocked.append((me, ready))
            self._next()
            while self._turn != me:
                if self._stuck:
                    raise RuntimeError("virtual time: every caller left waits for another's work")
                self._cond.wait()

    def _next(self):
        """Gives the turn to a blocked caller whose wait is over, else to the earliest sleeper (under the
        condition's lock), moving the clock."""
        for k, (i, ready) in enumerate(self._blocked):
            if ready():
                del self._blocked[k]
                self._turn = i
                self._cond.notify_all()
                return
        if self._sleepers:
            wake, i, _ = heapq.heappop(self._sleepers)
            if wake > self.ns:
                self._set(wake)
            self._turn = i
        else:
            self._turn = None
            self._stuck = bool(self._blocked)
        self._cond.notify_all()

    def run(self, callers):
        """Runs `callers` (functions of no argument) to the end; returns the virtual ns it took."""
        t0 = self.ns
        errors = []

        def body(i, f):
            self._index.i = i
            with self._cond:
                while self._turn != i:
                    self._cond.wait()
            try:
                f()
            except BaseException as e:  # noqa: BLE001 - reported after the run
                errors.append(e)
            finally:
                with self._cond:
                    self._live -= 1
                    self._next()
        threads = [threading.Thread(target=body, args=(i, f), daemon=True) for i, f in enumerate(callers)]
        with self._cond:
            self._live = len(callers)
            for i in range(len(callers)):
                heapq.heappush(self._sleepers, (self.ns, i, self._seq))
                self._seq += 1
        for t in threads:
            t.start()
        with self._cond:
            self._next()
        for t in threads:
            t.join()
        self._blocked.clear()
        self._stuck = False
        if errors:
            raise errors[0]
        return self.ns - t0

    @contextlib.contextmanager
    def executor_clock(self, ex):
        """Within the block, `ex` times its calls and decides on this clock."""
        import hipsched._dispatch as dispatch_module
        saved = dispatch_module._perf_ns
        dispatch_module._perf_ns = self.clock_ns
        self.attach(ex._core)
        try:
            yield self
        finally:
            dispatch_module._perf_ns = saved
            ex._core.set_clock(0)
            self._cores.remove(ex._core)


class Timeline:
    """One side: calls run one at a time, in the order they arrive, each for `us(call)`."""

    def __init__(self, vt, us):
        self.vt = vt
        self.us = us
        self.free_ns = 0
        self.runs = 0
        self.busy_ns = 0

    def take(self, call):
        start = max(self.vt.ns, self.free_ns)
        dur = int(round(self.us(call) * 1e3))
        self.free_ns = start + dur
        self.runs += 1
        self.busy_ns += dur
        self.vt.sleep_until(self.free_ns)


class VirtualCpu(SideCpu):
    def __init__(self, vt, us, results):
        super().__init__(Timeline(vt, us), results)


class VirtualGpu(SideGpu):
    """One device, one stream, host data, a free link (its copies are in its modelled time)."""

    def __init__(self, vt, us, results):
        super().__init__(Timeline(vt, us), results, "virtual")


def noisy(us_of, sigma, seed):
    """`us_of(call)` times exp(sigma * N(0, 1)), drawn in call order (deterministic: one caller runs at a
    time)."""
    rng = np.random.default_rng(seed)
    return lambda call: us_of(call) * float(np.exp(sigma * rng.standard_normal()))


def virtual_machine(cpu_us, gpu_us, **config):
    """(VirtualTime, Executor, cpu, gpu): `cpu_us`, `gpu_us` map a call to its time on that side."""
    from hipsched import Executor
    vt, results = VirtualTime(), Results()
    cpu, gpu = VirtualCpu(vt, cpu_us, results), VirtualGpu(vt, gpu_us, results)
    config.setdefault("telemetry_path", None)
    ex = Executor(gpu_backend=gpu, cpu_backend=cpu, persist_model=False, split=False, **config)
    return vt, ex, cpu, gpu


def virtual_batch(vt, ex):
    """`ex.batch()` run by this machine's callers: a caller per side (Batch.run_sides), waiting for another
    side's results in virtual time (Batch.wait_until)."""
    b = ex.batch()
    b.run_sides = lambda workers: vt.run(list(workers.values()))
    b.wait_until = lambda ready, wake_s=None: vt.block_until(ready)   # (virtual time: no clock to wake by)
    return b
