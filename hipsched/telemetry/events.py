"""Event schema v1. The hot path stores one tuple per call (layout below); this module turns those
tuples into schema dicts (for `Telemetry.events`) and JSON lines (for the writer thread), so dict
building and encoding never run in the caller. Field meanings: docs/guide/telemetry.md; JSON Schema:
schema.json next to this file."""
from __future__ import annotations

import json
import math
import numbers
import os
import socket
import time
import uuid
from datetime import datetime, timezone

SCHEMA_VERSION = 1

# Layout of the tuple Telemetry.record stores (indices used by the writer, store and formatter).
TS, SEQ, OP, BACKEND, REASON, SIZE, DTYPE, NBYTES, DURATION, PRED_CPU, PRED_GPU, STREAM, SCOPE, FALLBACK, DETAIL, \
    RESIDENT, SPLIT, GPU_DEVICE = range(18)

FIELDS = ("v", "ts", "run", "seq", "host", "device", "op", "backend", "reason", "size", "dtype", "bytes",
          "duration_us", "predicted_us", "stream", "phase", "tags", "fallback")
# Present only when the Telemetry was given them (a worker of a distributed job, hipsched.dask): after
# `device`, so logs of single-machine runs are byte for byte what they were.
OPTIONAL_IDENT = ("worker", "job")
# Present only where they apply, last, so every other line is byte for byte what it was: `detail` on
# events whose reason has one (gpu_unsupported: why the GPU refused the call), `resident` on GPU runs of
# host inputs (bytes uploaded, bytes read from device copies kept across calls), `split` on calls cut
# across processors (the shares and each part's rows and time), `gpu_device` on GPU runs on a further
# device of an executor with several (the device its inputs live on; docs/guide/devices.md, "Two devices").
OPTIONAL_EVENT = ("detail", "resident", "split", "gpu_device")


HALF_DTYPES = ("float16", "bfloat16")


def op_label(d) -> object:
    """The name an event is tabulated under: the op, and for half precision the op and its dtype
    ("top_k[float16]": half the bytes, its own costs and crossover; qmatmul's "q8_0/float16", a half x
    against quantized weights, is "qmatmul[float16]"). float32 and the quantized ops' block types keep
    the plain op name, so logs without half calls read as they always did."""
    op, dt = d.get("op"), d.get("dtype")
    half = dt.rpartition("/")[2] if isinstance(dt, str) else None
    return f"{op}[{half}]" if half in HALF_DTYPES and isinstance(op, str) else op


def new_run_id() -> str:
    """Sortable and unique across hosts: UTC start time plus random bits."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def default_host() -> str:
    return socket.gethostname() or "unknown"


def iso_ts(t: float) -> str:
    """ISO 8601 UTC with microseconds, e.g. 2026-11-21T12:34:56.123456Z."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_ts(s: str) -> float:
    """Inverse of iso_ts (seconds since the epoch)."""
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def text(x):
    """Names as strings: enums (SelectionReason and friends) by value, anything else by str()."""
    if x is None or isinstance(x, str):
        return x
    v = getattr(x, "value", None)
    if isinstance(v, str):
        return v
    name = getattr(x, "name", None)
    return name.lower() if isinstance(name, str) else str(x)


def stream_id(s):
    """A stream as the event shows it: ints as they are, handle objects by their pointer."""
    if s is None or isinstance(s, int):
        return int(s) if s is not None and type(s) is not int else s   # bool/IntEnum subclasses as plain ints
    if isinstance(s, numbers.Integral):
        return int(s)                  # numpy integer scalars: the number, not its str()
    for attr in ("ptr", "cuda_stream", "handle"):
        v = getattr(s, attr, None)
        if isinstance(v, int):
            return v
    return str(s)


def _finite(x):
    """Microseconds to nanosecond resolution (what the JSON lines carry), None for missing or NaN/inf."""
    if x is None:
        return None
    x = float(x)
    return round(x, 3) if math.isfinite(x) else None


def ident_extra(worker=None, job=None) -> dict:
    """The optional identity fields that are set (worker and job names, as strings)."""
    return {k: str(v) for k, v in (("worker", worker), ("job", job)) if v is not None}


def to_dict(rec, run, host, device, extra=None) -> dict:
    """The schema-v1 dict of one stored tuple; `extra` is ident_extra(...) (worker, job)."""
    sc = rec[SCOPE]
    fb = rec[FALLBACK]
    return {
        "v": SCHEMA_VERSION, "ts": iso_ts(rec[TS]), "run": run, "seq": rec[SEQ], "host": host, "device": device,
        **(extra or {}),
        "op": text(rec[OP]), "backend": text(rec[BACKEND]), "reason": text(rec[REASON]), "size": int(rec[SIZE]),
        "dtype": text(rec[DTYPE]), "bytes": int(rec[NBYTES]), "duration_us": _finite(rec[DURATION]),
        "predicted_us": {"cpu": _finite(rec[PRED_CPU]), "gpu": _finite(rec[PRED_GPU])},
        "stream": stream_id(rec[STREAM]),
        # phase and tags as the JSON line has them (str(phase), tag values JSON-encodable), so the dicts
        # validate against the same schema
        "phase": json.loads(sc.phase_json), "tags": json.loads(sc.tags_json),
        "fallback": None if fb is None else {"backend": text(fb[0]), "error": str(fb[1])},
        **({} if rec[DETAIL] is None else {"detail": str(rec[DETAIL])}),
        **({} if rec[RESIDENT] is None else {"resident": _resident(rec[RESIDENT])}),
        **({} if rec[SPLIT] is None else {"split": _split(rec[SPLIT])}),
        **({} if rec[GPU_DEVICE] is None else {"gpu_device": int(rec[GPU_DEVICE])}),
    }


def _resident(r) -> dict:
    return {"uploaded": int(r["uploaded"]), "reused": int(r["reused"])}


def _split(s) -> dict:
    return {"shares": {str(k): float(v) for k, v in s["shares"].items()},
            "parts": [{"backend": str(p["backend"]), "rows": [int(p["rows"][0]), int(p["rows"][1])],
                       "duration_us": float(p["duration_us"])} for p in s["parts"]],
            "predicted_us": float(s["predicted_us"]), "balance": float(s["balance"])}


_INF = float("inf")  # the range test below also rejects NaN (every comparison with it is False)
_NUMBERS = ',"size":%d,"bytes":%d,"duration_us":%.3f,"predicted_us":{"cpu":%.3f,"gpu":%.3f}'
_LINE = '%s%s.%06dZ"%s,"seq":%d%s%s,"stream":%s,"phase":%s,"tags":%s,"fallback":%s%s%s%s%s}\n'


class LineFormatter:
    """Encodes stored tuples as JSON lines on the writer thread. Equivalent to json.dumps(to_dict(..))
    but several times faster: strings that repeat (op, backend, reason, dtype) are escaped once and
    cached, the timestamp's date-and-seconds part is reused within a second, and the scope brings its
    own pre-encoded JSON."""

    def __init__(self, run, host, device, extra=None):
        self.head = '{"v":%d,"ts":"' % SCHEMA_VERSION
        self.ident = ',"run":%s,"host":%s,"device":%s' % (json.dumps(run), json.dumps(host), json.dumps(device))
        for k, v in (extra or {}).items():   # worker, job (ident_extra): on every line, drop records too
            self.ident += ',%s:%s' % (json.dumps(k), json.dumps(v))
        self._strings = {}
        self._names = {}
        self._sec = None
        self._sec_text = ""

    def _str(self, x):
        s = self._strings.get(x)
        if s is None:
            s = json.dumps(text(x))
            if len(self._strings) < 4096:
                self._strings[x] = s
        return s

    @staticmethod
    def _num(x):
        # '%.3f' is several times cheaper than repr(round(x, 3)); the range test also rejects NaN.
        if x is None:
            return "null"
        return "%.3f" % x if -_INF < x < _INF else "null"

    def _names_for(self, key):
        names = (f',"op":{self._str(key[0])},"backend":{self._str(key[1])},"reason":{self._str(key[2])}'
                 f',"dtype":{self._str(key[3])}')
        if len(self._names) < 4096:
            self._names[key] = names
        return names

    def _numbers_slow(self, size, nbytes, dur, pc, pg):
        num = self._num
        return (f',"size":{int(size)},"bytes":{int(nbytes)},"duration_us":{num(dur)},'
                f'"predicted_us":{{"cpu":{num(pc)},"gpu":{num(pg)}}}')

    def line(self, rec) -> str:
        t, seq, op, backend, reason, size, dtype, nbytes, dur, pc, pg, st, sc, fb, detail, resident, split, dev = rec
        sec = int(t)
        if sec != self._sec:
            self._sec = sec
            self._sec_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        micro = int((t - sec) * 1e6 + 0.5)
        if micro > 999999:  # rounded up into the next second; clamp rather than re-derive the text
            micro = 999999
        key = (op, backend, reason, dtype)
        names = self._names.get(key) or self._names_for(key)
        # One %-format for the numbers when all are finite; None, NaN or inf take the careful path.
        try:
            if -_INF < dur < _INF and -_INF < pc < _INF and -_INF < pg < _INF:
                nums = _NUMBERS % (size, nbytes, dur, pc, pg)
            else:
                nums = self._numbers_slow(size, nbytes, dur, pc, pg)
        except TypeError:
            nums = self._numbers_slow(size, nbytes, dur, pc, pg)
        if st is None:
            st = "null"
        elif type(st) is int:
            st = str(st)
        else:
            st = json.dumps(stream_id(st))
        fbt = "null" if fb is None else '{"backend":%s,"error":%s}' % (self._str(fb[0]), json.dumps(str(fb[1])))
        dt = "" if detail is None else ',"detail":' + json.dumps(str(detail))
        rs = "" if resident is None else ',"resident":{"uploaded":%d,"reused":%d}' % (
            int(resident["uploaded"]), int(resident["reused"]))
        sp = "" if split is None else ',"split":' + json.dumps(_split(split), separators=(",", ":"))
        gd = "" if dev is None else ',"gpu_device":%d' % int(dev)
        return _LINE % (self.head, self._sec_text, micro, self.ident, seq, names, nums, st, sc.phase_json,
                        sc.tags_json, fbt, dt, rs, sp, gd)

    def dropped_line(self, t, count, total) -> str:
        """The record that reports events lost to a full queue (they are still in the counters)."""
        return (f'{self.head}{iso_ts(t)}"{self.ident},"event":"dropped","dropped":{int(count)},'
                f'"dropped_total":{int(total)}}}\n')


def schema_path() -> str:
    return os.path.join(os.path.dirname(__file__), "schema.json")


def is_op_event(d) -> bool:
    """True for per-call events; False for service records such as the drop report."""
    return isinstance(d, dict) and "op" in d and "event" not in d
