"""Phases and tags for events, carried in a ContextVar so they follow threads and asyncio tasks
without being passed through every call. A scope is an immutable snapshot (phase, tags and their JSON
text computed once on entry), so the hot path only reads one reference and the writer thread never
re-encodes the tags of each event."""
from __future__ import annotations

import contextvars
import json
from contextlib import contextmanager

from . import nvtx


class Scope:
    __slots__ = ("phase", "tags", "phase_json", "tags_json")

    def __init__(self, phase, tags):
        self.phase = phase
        self.tags = tags
        self.phase_json = "null" if phase is None else json.dumps(str(phase))
        self.tags_json = json.dumps(tags, default=str, sort_keys=True, separators=(",", ":")) if tags else "{}"

    def __repr__(self):
        return f"Scope(phase={self.phase!r}, tags={self.tags!r})"


EMPTY = Scope(None, {})
_current: contextvars.ContextVar[Scope] = contextvars.ContextVar("hipsched_telemetry_scope", default=EMPTY)
current = _current.get


@contextmanager
def scope(phase=None, **tags):
    """Tag every event recorded inside the block. Scopes nest: an inner phase replaces the outer one
    (None keeps the outer), tags merge with inner values winning. Also opens an NVTX/roctx range named
    after the phase when such a profiler library is present."""
    outer = _current.get()
    merged = dict(outer.tags)
    merged.update(tags)
    inner = Scope(outer.phase if phase is None else phase, merged)
    token = _current.set(inner)
    pushed = phase is not None and nvtx.push(f"hipsched:{phase}")
    try:
        yield inner
    finally:
        if pushed:
            nvtx.pop()
        _current.reset(token)
