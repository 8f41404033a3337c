"""Reading JSONL logs in bounded memory: line by line, whatever the file size, with malformed lines
(and a cut last line) skipped and counted rather than fatal. Rotated siblings (LOG.1, LOG.2, ...) can be
read oldest first so a run's events come back in order."""
from __future__ import annotations

import calendar
import glob
import json
import math
import os
import re

from .events import is_op_event


class ReadStats:
    __slots__ = ("lines", "events", "service", "malformed", "files")

    def __init__(self):
        self.lines = self.events = self.service = self.malformed = 0
        self.files = []

    def to_dict(self):
        return {"files": list(self.files), "lines": self.lines, "events": self.events,
                "service_records": self.service, "malformed_lines": self.malformed}


def with_rotated(path: str) -> list[str]:
    """[LOG.N, ..., LOG.1, LOG]: the rotated files oldest first, then the live one (those that exist)."""
    rotated = []
    for p in glob.glob(glob.escape(path) + ".*"):
        m = re.fullmatch(re.escape(path) + r"\.(\d+)", p)
        if m:
            rotated.append((int(m.group(1)), p))
    out = [p for _, p in sorted(rotated, reverse=True)]
    if os.path.exists(path):
        out.append(path)
    return out


def folder_logs(folder: str) -> list[str]:
    """The live logs of a folder (a distributed job's: one `<worker>.jsonl` per worker), sorted."""
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.endswith(".jsonl") and os.path.isfile(os.path.join(folder, f)))


def expand(paths, rotated=True) -> list[str]:
    """Files to read: each path with its rotated siblings; a folder stands for its *.jsonl logs."""
    if isinstance(paths, (str, bytes, os.PathLike)):   # one path, not an iterable of its characters
        paths = [paths]
    out = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            logs = folder_logs(p)
            if not logs:
                raise FileNotFoundError(f"no telemetry log (*.jsonl) in folder {p}")
        else:
            logs = [p]
        for log in logs:
            files = with_rotated(log) if rotated else [log]
            if not files:
                raise FileNotFoundError(f"no telemetry log at {log}")
            out += [f for f in files if f not in out]
    return out


def _int(x) -> bool:
    """A count: a non-negative number (5.0 is an integer to JSON Schema too)."""
    return type(x) in (int, float) and 0 <= x < math.inf


def _num(x) -> bool:
    """None or a finite number (json.loads accepts NaN and Infinity; bools are not numbers here)."""
    return x is None or (type(x) in (int, float) and math.isfinite(x))


def _well_formed(d) -> bool:
    """The fields readers use have the schema's types: an event with a NaN duration, a string size or a
    fallback that is not an object is malformed (skipped and counted), not a crash further on."""
    if not isinstance(d.get("ts", ""), str):
        return False
    if "event" in d:
        if d["event"] == "dropped":
            return type(d.get("dropped")) is int and type(d.get("dropped_total")) is int
        return True
    pred = d.get("predicted_us")
    fb = d.get("fallback")
    tags = d.get("tags")
    return (_int(d.get("size")) and _int(d.get("bytes")) and _num(d.get("duration_us"))
            and (pred is None or (isinstance(pred, dict) and _num(pred.get("cpu")) and _num(pred.get("gpu"))))
            and (fb is None or isinstance(fb, dict)) and (tags is None or isinstance(tags, dict))
            and (d.get("seq") is None or _int(d.get("seq"))))


def parse_line(line, stats: ReadStats):
    """The record of one line, or None (blank or malformed, counted)."""
    line = line.strip()
    if not line:
        return None
    stats.lines += 1
    try:
        d = json.loads(line)
    except ValueError:
        stats.malformed += 1
        return None
    if not isinstance(d, dict) or d.get("v") != 1 or not _well_formed(d):
        stats.malformed += 1
        return None
    if is_op_event(d):
        stats.events += 1
    else:
        stats.service += 1
    return d


def iter_records(paths, stats: ReadStats | None = None, rotated=True):
    """Every record (events and service records such as drop reports) of the logs, file by file."""
    stats = stats if stats is not None else ReadStats()
    for f in expand(paths, rotated):
        stats.files.append(f)
        with open(f, "r", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                d = parse_line(line, stats)
                if d is not None:
                    yield d


class TsParser:
    """ISO 8601 '...Z' timestamps to epoch seconds, fast: the date-and-seconds part is converted once
    per distinct second (strptime per line would dominate reading a large log)."""

    def __init__(self):
        self._prefix = None
        self._base = 0

    def __call__(self, s: str) -> float | None:
        try:
            p = s[:19]
            if p != self._prefix:
                self._base = calendar.timegm((int(p[0:4]), int(p[5:7]), int(p[8:10]), int(p[11:13]),
                                              int(p[14:16]), int(p[17:19]), 0, 0, 0))
                self._prefix = p
            frac = s[20:-1] if s.endswith("Z") else s[20:]
            return self._base + (int(frac) / 10 ** len(frac) if frac else 0.0)
        except (TypeError, ValueError, IndexError):
            return None


class DropCounter:
    """Events the writer dropped, from its `dropped` service records. dropped_total only grows within a
    run, so its maximum per run counts each run's drops once, even when the same record is read twice
    (two copies of a log, or a log and its rotated files)."""

    def __init__(self):
        self._runs = {}  # run -> highest dropped_total seen
        self.total = 0

    def add(self, d) -> int:
        """Count one `dropped` record; returns how many drops it adds."""
        run = d.get("run")
        seen = int(d.get("dropped_total") or d.get("dropped") or 0)
        prev = self._runs.get(run, 0)
        if seen <= prev:
            return 0
        self._runs[run] = seen
        self.total += seen - prev
        return seen - prev
