"""Chrome trace-event JSON (chrome://tracing, Perfetto) written while the log streams by: one complete
("X") event per call, one process per (host, run) and one track per backend and stream, named with
metadata ("M") events at the end. Nothing but the track names is kept in memory."""
from __future__ import annotations

import json

from .reader import TsParser


class TraceWriter:
    def __init__(self, path):
        self.path = path
        self._f = open(path, "w", encoding="utf-8")
        self._f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        self._first = True
        self._pids = {}      # (host, run) -> pid
        self._tids = {}      # (pid, backend, stream) -> tid
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
        pkey = (d.get("host"), d.get("run"))
        pid = self._pids.setdefault(pkey, len(self._pids) + 1)
        backend, stream = str(d.get("backend")), d.get("stream")
        tkey = (pid, backend, stream)
        tid = self._tids.setdefault(tkey, len(self._tids) + 1)
        fb = d.get("fallback")
        name = d.get("op", "?") if not fb else f"{d.get('op', '?')} (fallback from {fb.get('backend')})"
        args = {"size": d.get("size"), "bytes": d.get("bytes"), "reason": d.get("reason"), "dtype": d.get("dtype"),
                "predicted_us": d.get("predicted_us"), "phase": d.get("phase"), "seq": d.get("seq")}
        if fb:
            args["error"] = fb.get("error")
        if d.get("tags"):
            args["tags"] = d["tags"]
        self._emit({"name": name, "cat": backend, "ph": "X", "ts": round(end * 1e6 - dur, 3), "dur": dur,
                    "pid": pid, "tid": tid, "args": args})
        self.count += 1

    def close(self) -> None:
        for (host, run), pid in self._pids.items():
            self._emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
                        "args": {"name": f"hipsched {host} run {run}"}})
        for (pid, backend, stream), tid in self._tids.items():
            label = backend.upper() + ("" if stream is None else f" stream {stream}")
            self._emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": {"name": label}})
        self._f.write("\n]}\n")
        self._f.close()
