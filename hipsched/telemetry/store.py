"""Exact counters per (op, backend) that many threads update at once. A short lock guards the few
additions each call makes (CPython's `+=` on a list item is not atomic across threads); the lock is
never held across I/O, so the hot path cannot block on the writer."""
from __future__ import annotations

import threading

from .events import text as _name
from .summary import BackendExecutionSummary, BackendStats, OpBackendTotals


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.cells = {}        # (op, backend) -> [count, time_us, fallbacks]
        self.errors = {}       # (op, error) -> count

    def add(self, op, backend, duration_us, fallback):
        # Record inlines this for speed; kept here as the reference of what one call adds.
        with self.lock:
            c = self.cells.get((op, backend))
            if c is None:
                c = self.cells[(op, backend)] = [0, 0.0, 0]
            c[0] += 1
            c[1] += duration_us
            if fallback is not None:
                c[2] += 1
                self.add_error(op, fallback)

    def add_error(self, op, fallback):
        """Caller holds the lock."""
        key = (_name(op), str(fallback[1]))
        self.errors[key] = self.errors.get(key, 0) + 1

    def snapshot(self):
        with self.lock:
            return {k: tuple(v) for k, v in self.cells.items()}, dict(self.errors)

    def clear(self):
        with self.lock:
            self.cells.clear()
            self.errors.clear()

    def stats(self, dropped=0) -> BackendStats:
        cells, _ = self.snapshot()
        n = {"cpu": 0, "gpu": 0}
        t = {"cpu": 0.0, "gpu": 0.0}
        total = fb = 0
        for (op, backend), (count, time_us, fallbacks) in cells.items():
            b = _name(backend)
            total += count
            fb += fallbacks
            if b in n:
                n[b] += count
                t[b] += time_us
        return BackendStats(total, n["cpu"], n["gpu"], fb, t["cpu"], t["gpu"], dropped)

    def summary(self, dropped=0) -> BackendExecutionSummary:
        cells, errors = self.snapshot()
        per_op, per_backend = {}, {}
        for (op, backend), (count, time_us, fallbacks) in cells.items():
            o, b = _name(op), _name(backend)
            prev = per_op.setdefault(o, {}).get(b, OpBackendTotals())
            per_op[o][b] = OpBackendTotals(prev.count + count, prev.time_us + time_us, prev.fallbacks + fallbacks)
            pb = per_backend.get(b, OpBackendTotals())
            per_backend[b] = OpBackendTotals(pb.count + count, pb.time_us + time_us, pb.fallbacks + fallbacks)
        return BackendExecutionSummary(per_op, per_backend, errors, dropped)

