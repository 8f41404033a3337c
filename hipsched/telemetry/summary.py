"""The in-memory views of telemetry: BackendStats (totals per backend), BackendExecutionSummary (count
and time per backend and per op) and the readable table print_debug_summary shows."""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class BackendStats:
    """Counters since start (or the last clear): exact, never dropped, whatever the queue did.
    A fallback call counts once, under the backend that produced the result (the CPU)."""
    total_operations: int = 0
    cpu_operations: int = 0
    gpu_operations: int = 0
    fallback_operations: int = 0
    cpu_time_us: float = 0.0
    gpu_time_us: float = 0.0
    dropped_events: int = 0      # events the JSONL writer lost to a full queue (still counted here)
    split_operations: int = 0    # calls cut across the CPU and the GPU (in total_operations, not in cpu/gpu)

    @property
    def gpu_fraction(self) -> float:
        return self.gpu_operations / self.total_operations if self.total_operations else 0.0

    @property
    def fallback_rate(self) -> float:
        return self.fallback_operations / self.total_operations if self.total_operations else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class OpBackendTotals:
    count: int = 0
    time_us: float = 0.0
    fallbacks: int = 0           # calls that failed on the other backend and ran here instead

    @property
    def mean_us(self) -> float:
        return self.time_us / self.count if self.count else 0.0

    def to_dict(self) -> dict:
        return {"count": self.count, "time_us": self.time_us, "mean_us": self.mean_us, "fallbacks": self.fallbacks}


@dataclass(frozen=True)
class BackendExecutionSummary:
    """per_op[op][backend] and per_backend[backend] -> OpBackendTotals; fallback_errors[(op, error)] -> count."""
    per_op: dict = field(default_factory=dict)
    per_backend: dict = field(default_factory=dict)
    fallback_errors: dict = field(default_factory=dict)
    dropped_events: int = 0

    @property
    def total_operations(self) -> int:
        return sum(t.count for t in self.per_backend.values())

    @property
    def total_time_us(self) -> float:
        return sum(t.time_us for t in self.per_backend.values())

    def to_dict(self) -> dict:
        return {
            "per_op": {op: {b: t.to_dict() for b, t in bs.items()} for op, bs in self.per_op.items()},
            "per_backend": {b: t.to_dict() for b, t in self.per_backend.items()},
            "fallback_errors": [{"op": op, "error": err, "count": n} for (op, err), n in self.fallback_errors.items()],
            "dropped_events": self.dropped_events,
        }

    def table(self) -> str:
        """Per op and backend: calls, share of the op's calls, total and mean time, fallbacks."""
        if not self.per_op:
            return "hipsched telemetry: no operations recorded"
        rows = [("op", "backend", "calls", "share", "total ms", "mean us", "fallbacks")]
        for op in sorted(self.per_op):
            bs = self.per_op[op]
            n_op = sum(t.count for t in bs.values())
            for b in sorted(bs):
                t = bs[b]
                share = t.count / n_op if n_op else 0.0
                rows.append((op, b, str(t.count), f"{share:.0%}", f"{t.time_us / 1e3:.3f}", f"{t.mean_us:.1f}",
                             str(t.fallbacks)))
        for b in sorted(self.per_backend):
            t = self.per_backend[b]
            rows.append(("(all)", b, str(t.count), f"{t.count / self.total_operations:.0%}" if self.total_operations
                         else "0%", f"{t.time_us / 1e3:.3f}", f"{t.mean_us:.1f}", str(t.fallbacks)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        for (op, err), n in sorted(self.fallback_errors.items(), key=lambda kv: -kv[1]):
            lines.append(f"fallback {op}: {n}x {err}")
        if self.dropped_events:
            lines.append(f"dropped from the JSONL log (queue full): {self.dropped_events} (counted above)")
        return "\n".join(lines)

    def __str__(self):
        return self.table()


def print_debug_summary(summary: BackendExecutionSummary, file=None) -> None:
    print(summary.table(), file=file if file is not None else sys.stderr)
