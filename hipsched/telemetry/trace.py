"""Chrome trace-event JSON (chrome://tracing, Perfetto) written while the log streams by: one complete
("X") event per call, one process per (host, run) and one track per backend and stream, named with
metadata ("M") events at the end; events of a distributed job's worker (a `worker` field) share one
process per worker instead. A call split across processors is a slice on the SPLIT track and each of
its parts a slice, from the call's start, on the track of the side that ran it (cpu, gpu, or one track
per device, gpu:0, gpu:1, ..., with several GPUs: the lanes show the sides working at once; a whole call
on a further GPU, with `gpu_device`, is on that device's track). Calls from several threads overlap in
time, and slices on one track must nest, so overlapping calls go to extra lanes of their track ("CPU #2",
...). A lane keeps only the span it covers: for a log in completion order (as the writer writes it) the
lanes match the calls in flight at once; input far out of order could open more, so a track has at most
MAX_LANES, the last taking whatever does not fit elsewhere."""
from __future__ import annotations

import json

from .reader import TsParser

MAX_LANES = 1024  # three numbers each: bounds memory for input far out of order


class TraceWriter:
    def __init__(self, path):
        self.path = path
        self._f = open(path, "w", encoding="utf-8")
        self._f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        self._first = True
        self._pids = {}      # (host, run), or ("worker", name) -> pid
        self._names = {}     # pid -> process name
        self._lanes = {}     # (pid, backend, stream) -> [[first start, last end, tid], ...]
        self._labels = {}    # tid -> (pid, track name)
        self._ts = TsParser()
        self.count = 0

    def _emit(self, obj):
        if not self._first:
            self._f.write(",\n")
        self._first = False
        self._f.write(json.dumps(obj, separators=(",", ":")))

    def add(self, d) -> None:
        """One schema-v1 event; its ts is when the call finished, so it starts duration_us earlier."""
        end = self._ts(d.get("ts", ""))
        dur = d.get("duration_us")
        if end is None or not isinstance(dur, (int, float)):
            return
        # a distributed job's worker is one process track whatever its runs (a restarted worker keeps its
        # name); single-machine logs keep one process per (host, run)
        w = d.get("worker")
        pkey = ("worker", str(w)) if w is not None else (d.get("host"), d.get("run"))
        pid = self._pids.get(pkey)
        if pid is None:
            pid = self._pids[pkey] = len(self._pids) + 1
            self._names[pid] = (f"hipsched worker {w} ({d.get('host')}, {d.get('device')})" if w is not None
                                else f"hipsched {d.get('host')} run {d.get('run')}")
        backend, stream = str(d.get("backend")), d.get("stream")
        start = round(end * 1e6 - dur, 3)
        # a whole call run on a further GPU goes on that device's track, where its split parts go
        gd = d.get("gpu_device") if backend == "gpu" else None
        tid = self._lane(pid, backend if gd is None else f"gpu:{gd}", stream, start, start + dur)
        fb = d.get("fallback")
        name = d.get("op", "?") if not fb else f"{d.get('op', '?')} (fallback from {fb.get('backend')})"
        args = {"size": d.get("size"), "bytes": d.get("bytes"), "reason": d.get("reason"), "dtype": d.get("dtype"),
                "predicted_us": d.get("predicted_us"), "phase": d.get("phase"), "seq": d.get("seq")}
        if fb:
            args["error"] = fb.get("error")
        if d.get("tags"):
            args["tags"] = d["tags"]
        sp = d.get("split") if backend == "split" else None
        if isinstance(sp, dict):
            args["shares"], args["balance"] = sp.get("shares"), sp.get("balance")
        self._emit({"name": name, "cat": backend, "ph": "X", "ts": start, "dur": dur,
                    "pid": pid, "tid": tid, "args": args})
        self.count += 1
        for part in (sp.get("parts") or []) if isinstance(sp, dict) else ():
            pdur = part.get("duration_us")
            if not isinstance(pdur, (int, float)):
                continue
            pb = str(part.get("backend"))
            ptid = self._lane(pid, pb, stream, start, start + pdur)
            self._emit({"name": f"{d.get('op', '?')} rows {part.get('rows')}", "cat": pb, "ph": "X", "ts": start,
                        "dur": pdur, "pid": pid, "tid": ptid, "args": {"split_of": d.get("seq"),
                                                                        "rows": part.get("rows")}})

    def _lane(self, pid, backend, stream, start, end) -> int:
        """The tid of the first lane whose covered span this slice stays clear of (a new lane if none,
        up to MAX_LANES): slices placed by that rule never overlap within a lane."""
        lanes = self._lanes.setdefault((pid, backend, stream), [])
        for lane in lanes:
            if start >= lane[1]:
                lane[1] = end
                return lane[2]
            if end <= lane[0]:
                lane[0] = start
                return lane[2]
        if len(lanes) >= MAX_LANES:
            lanes[-1][0], lanes[-1][1] = min(lanes[-1][0], start), max(lanes[-1][1], end)
            return lanes[-1][2]
        tid = len(self._labels) + 1
        label = backend.upper() + ("" if stream is None else f" stream {stream}")
        self._labels[tid] = (pid, label if not lanes else f"{label} #{len(lanes) + 1}")
        lanes.append([start, end, tid])
        return tid

    def close(self) -> None:
        for pid, name in self._names.items():
            self._emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}})
        for tid, (pid, label) in self._labels.items():
            self._emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": {"name": label}})
        self._f.write("\n]}\n")
        self._f.close()
