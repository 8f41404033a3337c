"""Exact counters per (op, backend): one dict of cells the compiled recorder (_record.pyx) adds into
under the GIL, which a record never gives up part way, so many threads need no lock and lose no count.
Fallback errors are rare and go into one dict under a lock."""
from __future__ import annotations

import threading

from .events import text as _name
from .summary import BackendExecutionSummary, BackendStats, OpBackendTotals


class Counters:
    def __init__(self):
        self.cells = {}                  # (op, backend) -> [count, time_us, fallbacks]
        self.lock = threading.Lock()
        self.errors = {}                 # (op, error) -> count

    def add_error(self, op, fallback):
        key = (_name(op), str(fallback[1]))
        with self.lock:
            self.errors[key] = self.errors.get(key, 0) + 1

    def snapshot(self):
        """The cells and the error counts. Exact for every record() that has returned."""
        with self.lock:
            errors = dict(self.errors)
        # list(): one C-level copy of the items, and tuple() of each cell, safe while records insert;
        # cells zeroed by clear() are not reported
        return {k: tuple(v) for k, v in list(self.cells.items()) if v[0]}, errors

    def clear(self):
        """Zero everything. Not atomic with records running at the same moment in other threads."""
        with self.lock:
            self.errors.clear()
        # in place: the recorder keeps a reference to the cell it used last
        for c in list(self.cells.values()):
            c[0], c[1], c[2] = 0, 0.0, 0

    def stats(self, dropped=0) -> BackendStats:
        cells, _ = self.snapshot()
        n = {"cpu": 0, "gpu": 0, "split": 0}
        t = {"cpu": 0.0, "gpu": 0.0, "split": 0.0}
        total = fb = 0
        for (op, backend), (count, time_us, fallbacks) in cells.items():
            b = _name(backend)
            total += count
            fb += fallbacks
            if b in n:
                n[b] += count
                t[b] += time_us
        return BackendStats(total, n["cpu"], n["gpu"], fb, t["cpu"], t["gpu"], dropped, n["split"])

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

