"""python -m hipsched monitor [FILE] [--tail] [--summary] [--op X] [--phase P] [--backend gpu]: show a
telemetry log one line per event, following it like `tail -F` with --tail, or as per op/backend counts,
p50/p95 and fallbacks with --summary (refreshed every --every seconds when following)."""
from __future__ import annotations

import os
import sys
import time

from .logs import default_log


def add_arguments(p):
    p.add_argument("file", metavar="FILE", nargs="?", help="JSONL telemetry log, or a distributed job's folder (its "
                   "*.jsonl, one per worker; without --tail); default: $HIPSCHED_TELEMETRY, else the last demo log")
    p.add_argument("--tail", action="store_true", help="follow the file as it grows (copes with rotation)")
    p.add_argument("--summary", action="store_true", help="per op/backend counts, p50/p95 and fallbacks")
    p.add_argument("--op", help="only this op")
    p.add_argument("--phase", help="only events of this phase")
    p.add_argument("--backend", choices=["cpu", "gpu"], help="only events that ran on this backend")
    p.add_argument("-n", "--lines", type=int, default=10, help="with --tail: start from the last N lines (default 10)")
    p.add_argument("--every", type=float, default=5.0, help="with --tail --summary: seconds between summaries")
    p.add_argument("--max-events", type=int, help="stop after this many matching events")
    p.add_argument("--timeout", type=float, help="stop following after this many seconds")


def _ms(us):
    if us is None:
        return "?"
    v = us / 1e3
    if v < 0.1:
        return f"{us:.1f} us"
    return f"{v:.2f} ms" if v < 1 else f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def format_event(d) -> str:
    """[cosine_similarity][GPU][stream=1] n=262144 | 0.81 ms (cpu est 9.1 ms)"""
    backend = str(d.get("backend"))
    other = "cpu" if backend == "gpu" else "gpu"
    est = (d.get("predicted_us") or {}).get(other)
    s = f"[{d.get('op')}][{backend.upper()}]"
    if d.get("worker") is not None:
        s = f"[worker {d['worker']}]" + s
    if d.get("stream") is not None:
        s += f"[stream={d['stream']}]"
    if d.get("phase") is not None:
        s += f"[{d['phase']}]"
    s += f" n={d.get('size')} | {_ms(d.get('duration_us'))}"
    if est is not None:
        s += f" ({other} est {_ms(est)})"
    s += f" {d.get('reason')}"
    fb = d.get("fallback")
    if fb:
        s += f" FALLBACK from {fb.get('backend')}: {fb.get('error')}"
    return s


def _matcher(args):
    def ok(d):
        if "op" not in d or "event" in d:
            return False
        return ((args.op is None or d.get("op") == args.op) and (args.phase is None or d.get("phase") == args.phase)
                and (args.backend is None or d.get("backend") == args.backend))
    return ok


class Summary:
    def __init__(self):
        # deferred: __main__ imports every command, so this loads only when the command runs (log analysis)
        from ..telemetry.events import op_label
        from ..telemetry.quantiles import LogHistogram
        self._hist = LogHistogram
        self._label = op_label
        self.cells = {}      # (op, backend) -> [hist, fallbacks]

    def add(self, d):
        key = (self._label(d), d.get("backend"))
        c = self.cells.get(key)
        if c is None:
            c = self.cells[key] = [self._hist(), 0]
        if isinstance(d.get("duration_us"), (int, float)):
            c[0].add(float(d["duration_us"]))
        if d.get("fallback"):
            c[1] += 1

    def render(self, stats, dropped) -> str:
        rows = [("op", "backend", "calls", "p50", "p95", "fallbacks")]
        for (op, b), (h, fb) in sorted(self.cells.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            rows.append((str(op), str(b), str(h.count), _ms(h.quantile(0.5)), _ms(h.quantile(0.95)), str(fb)))
        w = [max(len(r[i]) for r in rows) for i in range(6)]
        lines = ["  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)) for r in rows]
        lines.insert(1, "  ".join("-" * x for x in w))
        lines.append(f"{stats.malformed} malformed lines skipped, {dropped} events dropped by the writer")
        return "\n".join(lines)


def run(args) -> int:
    # deferred: __main__ imports every command, so this loads only when the command runs (log analysis)
    from ..telemetry.follow import Follower
    from ..telemetry.reader import DropCounter, ReadStats, iter_records
    if args.file is None:
        args.file = default_log("hipsched monitor")
        if args.file is None:
            return 2
    ok = _matcher(args)
    stats = ReadStats()
    summary = Summary() if args.summary else None
    shown = 0
    drops = DropCounter()
    out = sys.stdout

    def handle(d):
        nonlocal shown
        if d.get("event") == "dropped":
            drops.add(d)
            if summary is None:
                print(f"[telemetry] {d.get('dropped')} events dropped by the writer (queue full)", file=out, flush=True)
            return
        if not ok(d):
            return
        shown += 1
        if summary is not None:
            summary.add(d)
        else:
            print(format_event(d), file=out, flush=True)

    done = lambda: args.max_events is not None and shown >= args.max_events
    try:
        if args.tail and os.path.isdir(args.file):
            print(f"hipsched monitor: --tail follows one log; {args.file} is a folder: follow one worker's "
                  f"log, or run --summary (without --tail) on the folder", file=sys.stderr)
            return 2
        if args.tail:
            f = Follower(args.file, last_lines=args.lines, stats=stats)
            next_summary = time.monotonic() + args.every
            try:
                for d in f.follow(timeout=args.timeout, stop=done):
                    handle(d)
                    if done():
                        break
                    if summary is not None and time.monotonic() >= next_summary:
                        print(summary.render(stats, drops.total) + "\n", file=out, flush=True)
                        next_summary = time.monotonic() + args.every
            finally:
                f.close()
        else:
            for d in iter_records([args.file], stats, rotated=args.summary):
                handle(d)
                if done():
                    break
    except OSError as e:   # missing, a directory, unreadable
        print(f"hipsched monitor: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    if summary is not None:
        print(summary.render(stats, drops.total), file=out, flush=True)
    elif stats.malformed:
        print(f"[monitor] {stats.malformed} malformed lines skipped", file=sys.stderr)
    return 0
