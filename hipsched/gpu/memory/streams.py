"""Streams: turning users' stream objects into handles, and the StreamPool that spreads work over a
few streams (round robin, or one fixed stream per telemetry phase) with events for dependencies."""
from __future__ import annotations

import ctypes
import threading

from ...errors import GpuError

from ..bindings.retired_streams import _retired_streams, retire_stream, revive_stream  # noqa: F401


def as_stream_handle(obj) -> int:
    """A raw stream handle from an int, None (the null stream, 0), or an object with `.ptr` (CuPy),
    `.cuda_stream` (PyTorch), `.handle` or `.value`; GpuError for anything else."""
    if obj is None:
        return 0
    if isinstance(obj, ctypes.c_void_p):
        return obj.value or 0
    if isinstance(obj, bool):
        raise GpuError("unsupported", "a bool is not a stream handle")
    if isinstance(obj, int):
        if obj < 0:
            raise GpuError("unsupported", f"stream handle must be >= 0, got {obj}")
        return obj
    for attr in ("ptr", "cuda_stream", "handle", "value"):
        value = getattr(obj, attr, None)
        if value is not None and not callable(value):
            if isinstance(value, ctypes.c_void_p):
                value = value.value or 0
            try:
                return as_stream_handle(int(value))
            except (TypeError, ValueError):
                continue
    raise GpuError("unsupported", f"cannot use {type(obj).__name__} as a stream (expected an int or an "
                                  f"object with .ptr, .cuda_stream or .handle)")


class StreamPool:
    """`n` streams created on `runtime`. `next(phase)` hands one out: in "round_robin" mode the next in
    turn; in "per_phase" mode the same stream for the same phase (phases get streams in order of
    first use, wrapping after n). `sequential=True` gives the null stream every time, so all work is
    ordered (for debugging and for comparisons)."""

    MODES = ("round_robin", "per_phase")

    def __init__(self, runtime, n: int = 4, mode: str = "round_robin", sequential: bool = False):
        if mode not in self.MODES:
            raise ValueError(f"StreamPool mode must be one of {self.MODES}, got {mode!r}")
        if int(n) < 1:
            raise ValueError(f"StreamPool needs at least one stream, got n={n}")
        self.runtime = runtime
        self.mode = mode
        self.sequential = bool(sequential)
        self._lock = threading.Lock()
        self._turn = 0
        self._phase_index: dict = {}
        self._events: list[int] = []
        self.streams: list[int] = [] if self.sequential else [runtime.stream_create() for _ in range(int(n))]
        for s in self.streams:
            revive_stream(s)
        self._closed = False

    def next(self, phase=None) -> int:
        if self._closed:
            raise GpuError("unsupported", "StreamPool is closed")
        if self.sequential:
            return 0
        with self._lock:
            if self.mode == "per_phase":
                index = self._phase_index.setdefault(phase, len(self._phase_index) % len(self.streams))
            else:
                index = self._turn
                self._turn = (self._turn + 1) % len(self.streams)
            return self.streams[index]

    def record(self, stream) -> int:
        """An event recorded on `stream` now; pass it to `wait` to order another stream after it. The
        pool owns the event and destroys it at close()."""
        event = self.runtime.event_create()
        with self._lock:
            self._events.append(event)
        self.runtime.event_record(event, as_stream_handle(stream))
        return event

    def wait(self, stream, event: int) -> None:
        """Make future work on `stream` wait for `event` (no host blocking)."""
        self.runtime.stream_wait_event(as_stream_handle(stream), event)

    def synchronize(self) -> None:
        """Block until every stream of the pool (or the null stream in sequential mode) is idle."""
        for s in (self.streams or [0]):
            self.runtime.stream_synchronize(s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors = []
        for s in self.streams:
            try:
                self.runtime.stream_synchronize(s)
                # device arrays last used on it may outlive it: their frees must not name it
                retire_stream(s)
                self.runtime.stream_destroy(s)
            except GpuError as e:
                errors.append(e)
        for e in self._events:
            try:
                self.runtime.event_destroy(e)
            except GpuError as err:
                errors.append(err)
        self.streams, self._events = [], []
        if errors:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self):
        return len(self.streams)
