"""Telemetry: the object the Executor records every call into. `record` is the hot path (a few hundred
nanoseconds, compiled in _record.pyx): it stores one tuple in the ring of recent events, adds to the
exact counters and hands the same tuple to the JSONL writer's queue, taking no lock; dicts and JSON
are built later, off the caller. The compiled part is imported when a Telemetry is made, so reading
and analysing logs (this package's other modules) needs no build."""
from __future__ import annotations

import os

from . import events as ev
from .scope import _current as _scope_var
from .scope import scope as _scope
from .store import Counters
from .summary import BackendExecutionSummary, BackendStats, OpBackendTotals, print_debug_summary
from .writer import JsonlWriter

ENV_PATH = "HIPSCHED_TELEMETRY"


def path_from_env():
    """The JSONL path HIPSCHED_TELEMETRY names, or None (also for "", "0", "off")."""
    p = os.environ.get(ENV_PATH, "").strip()
    return None if p.lower() in ("", "0", "off", "false", "no", "none") else p


class Telemetry:
    """One per Executor: records every call in memory and, with `path`, in a JSONL log (see
    docs/guide/telemetry.md). `run_id`, `host` and `device` identify its events; they default to a new id,
    the host name and "cpu". `worker` and `job` (a distributed job's worker name and job id) are added
    to every record when given, and left out otherwise."""

    def __init__(self, path=None, enabled=True, ring_size=10000, queue_size=65536, rotate_bytes=64 << 20,
                 host=None, device=None, run_id=None, rotate_keep=8, flush_interval=0.02, worker=None, job=None):
        if ring_size < 0:
            raise ValueError(f"telemetry ring_size must be >= 0, got {ring_size!r}")
        self._enabled = bool(enabled)
        self.run_id = run_id or ev.new_run_id()
        self.host = host or ev.default_host()
        self.device = device or "cpu"
        self.worker = None if worker is None else str(worker)
        self.job = None if job is None else str(job)
        self._extra = ev.ident_extra(self.worker, self.job)
        self._counters = Counters()
        self._writer = None
        if path is not None and self._enabled:
            self._writer = JsonlWriter(path, ev.LineFormatter(self.run_id, self.host, self.device, self._extra),
                                       queue_size=queue_size, rotate_bytes=rotate_bytes, keep=rotate_keep,
                                       interval=flush_interval)
        from ._record import Recorder  # deferred: compiled, so log analysis (no Telemetry made) needs no build
        w = self._writer
        self.recorder = Recorder(int(ring_size), w.queue if w is not None else None, w.queue_size if w is not None else 0,
                                 w.drop_counter if w is not None else None, self._counters.cells,
                                 self._counters.add_error, _scope_var)
        self.recorder.enabled = self._enabled
        # the compiled method itself, so a call costs no Python frame of ours
        self.record = self.recorder.record

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value):
        self._enabled = self.recorder.enabled = bool(value)

    # ---------------------------------------------------------------- hot path
    def record(self, op, backend, reason, size, dtype, nbytes, duration_us, pred_cpu_us, pred_gpu_us,
               stream=None, fallback=None, detail=None, resident=None, split=None, gpu_device=None):
        """Record one executed call. Thread safe, never blocks on I/O, never raises for I/O problems.
        `fallback` is None or (failed_backend, error_str); `backend` is the one that produced the result;
        `detail` is None or the text behind the reason (gpu_unsupported: why the GPU refuses the call);
        `resident` is None or, for a GPU run on host inputs, {"uploaded": bytes, "reused": bytes}: what
        it copied to the device and what it read from device copies kept across calls; `split` is None or,
        for a call cut across processors, {"shares", "parts", "predicted_us", "balance"} (schema.json);
        `gpu_device` is None or, for a GPU run on a further device of an executor with several (its
        inputs live there), that device's index.
        (Each instance replaces this with its compiled recorder's method; this is its documentation.)"""
        return self.recorder.record(op, backend, reason, size, dtype, nbytes, duration_us, pred_cpu_us,
                                    pred_gpu_us, stream, fallback, detail, resident, split, gpu_device)

    def scope(self, phase=None, **tags):
        """Context manager: events recorded inside carry this phase and these tags (contextvars, so
        per thread and per asyncio task)."""
        return _scope(phase, **tags)

    # ---------------------------------------------------------------- views
    @property
    def events(self) -> list:
        """The most recent events (up to ring_size) as schema-v1 dicts, oldest first."""
        recs = self.recorder.recent()
        return [ev.to_dict(r, self.run_id, self.host, self.device, self._extra) for r in recs]

    @property
    def dropped(self) -> int:
        return self._writer.dropped if self._writer is not None else 0

    @property
    def path(self):
        return self._writer.path if self._writer is not None else None

    @property
    def writer_error(self):
        """The OSError that disabled the JSONL writer, or None."""
        return self._writer.failed if self._writer is not None else None

    def stats(self) -> BackendStats:
        return self._counters.stats(self.dropped)

    def summary(self) -> BackendExecutionSummary:
        return self._counters.summary(self.dropped)

    def operations_by_type(self, op) -> dict:
        """{"cpu": {...}, "gpu": {...}} for one op, each {"count", "time_us", "mean_us", "fallbacks"};
        both backends are always present (zeros when the op never ran there)."""
        per = self.summary().per_op.get(ev.text(op), {})
        out = {b: OpBackendTotals().to_dict() for b in ("cpu", "gpu")}
        for b, t in per.items():
            out[b] = t.to_dict()
        return out

    def print_debug_summary(self, file=None) -> None:
        print_debug_summary(self.summary(), file)

    # ---------------------------------------------------------------- lifecycle
    def flush(self) -> None:
        """Write everything queued to the JSONL file now."""
        if self._writer is not None:
            self._writer.flush()

    def clear(self) -> None:
        """Forget the in-memory events and counters (the JSONL file keeps what it has)."""
        self.recorder.clear()
        self._counters.clear()

    def close(self) -> None:
        """Flush and close the JSONL file; later records stay in memory only. Idempotent."""
        w = self._writer
        if w is not None:
            self.recorder.detach_queue()
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"Telemetry(run={self.run_id!r}, path={self.path!r}, enabled={self.enabled})"
