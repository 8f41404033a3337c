"""Exact counters per (op, backend) that many threads update at once, without a lock on the hot path:
each thread adds into its own shard (a dict it alone writes, found through a threading.local), and
readers sum the shards. Shards of threads that have ended are folded into one retired shard, so a
program that starts many short threads does not accumulate them. Fallback errors are rare and go
into one dict under a lock."""
from __future__ import annotations

import threading

from .events import text as _name
from .summary import BackendExecutionSummary, BackendStats, OpBackendTotals


class Counters:
    def __init__(self):
        self.local = threading.local()   # .cells: this thread's shard, (op, backend) -> [count, time_us, fallbacks]
        self.lock = threading.Lock()
        self._shards = []                # [(thread, cells)]
        self._retired = {}
        self.errors = {}                 # (op, error) -> count

    def shard(self) -> dict:
        """This thread's shard, created and registered on its first call. Telemetry.record adds into it
        directly (count, time, fallbacks), which is what keeps the hot path free of locks and calls."""
        cells = {}
        self.local.cells = cells
        with self.lock:
            self._shards.append((threading.current_thread(), cells))
        return cells

    def add_error(self, op, fallback):
        key = (_name(op), str(fallback[1]))
        with self.lock:
            self.errors[key] = self.errors.get(key, 0) + 1

    def snapshot(self):
        """Summed cells and the error counts. Exact for every record() that has returned."""
        with self.lock:
            live = []
            for t, cells in self._shards:
                if t.is_alive():
                    live.append((t, cells))
                else:
                    _fold(self._retired, cells)
            self._shards = live
            total = {k: list(v) for k, v in self._retired.items()}
            for _, cells in live:
                _fold(total, cells)
            return {k: tuple(v) for k, v in total.items()}, dict(self.errors)

    def clear(self):
        """Zero everything. Not atomic with records running at the same moment in other threads."""
        with self.lock:
            self._retired.clear()
            self.errors.clear()
            for _, cells in self._shards:
                cells.clear()

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


def _fold(into: dict, cells: dict) -> None:
    for k, v in list(cells.items()):   # list(): one C-level copy, safe while the owner inserts
        acc = into.get(k)
        if acc is None:
            into[k] = list(v)
        else:
            acc[0] += v[0]
            acc[1] += v[1]
            acc[2] += v[2]
