"""The analyzer's result as readable text tables (what `analyze` prints and the demo shows)."""
from __future__ import annotations

from .advice import _fmt_size


def _t(us):
    if us is None:
        return "-"
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


_NO_BOTH = "(none: no size bucket has calls measured on both CPU and GPU)"
_TEXT_COLUMNS = {"op", "backend", "from", "error", "uncertainty", "worker", "host", "device", "jobs", "crossover"}


def _table(header, rows, empty="(none)"):
    if not rows:
        return ["  " + empty]
    cells = [header] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    left = {0} | {i for i, h in enumerate(header) if h in _TEXT_COLUMNS}

    def line(r):
        return "  " + "  ".join(c.ljust(w[i]) if i in left else c.rjust(w[i]) for i, c in enumerate(r)).rstrip()
    return [line(cells[0]), "  " + "  ".join("-" * x for x in w)] + [line(r) for r in cells[1:]]


def _render_workers(workers) -> list:
    out = ["\nPer worker (distributed job)"]
    out += _table(["worker", "host", "device", "jobs", "runs", "events", "dropped"],
                  [[w["worker"], ",".join(w["hosts"]), ",".join(w["devices"]), ",".join(w["jobs"]) or "-", w["runs"],
                    w["events"], w["dropped_events"]] for w in workers])
    out.append("\nPer worker, op and backend")
    out += _table(["worker", "op", "backend", "calls", "total", "p50", "p95", "fallbacks"],
                  [[w["worker"], r["op"], r["backend"], r["count"], _t(r["total_us"]), _t(r["p50_us"]),
                    _t(r["p95_us"]), r["fallbacks"]] for w in workers for r in w["ops"]])
    out.append("\nCrossover per worker (each worker's own hardware)")
    rows = []
    for w in workers:
        for c in w["crossover"]:
            if c["status"] == "crossover":
                est = f"~{_fmt_size(c['size'])} (between {_fmt_size(c['low'])} and {_fmt_size(c['high'])})"
            elif c["status"] == "gpu_always":
                est = f"GPU faster at every size seen (from {_fmt_size(c['high'])})"
            elif c["status"] == "cpu_always":
                est = f"CPU faster at every size seen (up to {_fmt_size(c['low'])})"
            else:
                est = f"GPU loses at the largest size (~{_fmt_size(c['low'])})"
            rows.append([w["worker"], ",".join(w["devices"]), c["op"], est])
    out += _table(["worker", "device", "op", "crossover"], rows, _NO_BOTH)
    out.append("\nFallbacks by worker")
    out += _table(["worker", "op", "from", "count", "error"],
                  [[w["worker"], f["op"], f["backend"], f["count"], f["error"]] for w in workers for f in w["fallbacks"]])
    return out


def render(res: dict) -> str:
    out = []
    inp = res.get("inputs") or {}
    runs = res.get("runs", [])
    out.append(f"hipsched telemetry analysis: {inp.get('events', 0)} events from {len(inp.get('files', []))} file(s), "
               f"{len(runs)} run(s); {inp.get('malformed_lines', 0)} malformed lines skipped, "
               f"{res.get('duplicates_skipped', 0)} duplicate events skipped, {res.get('dropped_events', 0)} dropped "
               "by the writer")
    for r in runs:
        out.append(f"  run {r['run']} on {r['host']} ({r['device']}): {r['events']} events, {r['first_ts']} .. {r['last_ts']}")

    out.append("\nPer op and backend")
    out += _table(["op", "backend", "calls", "total", "p50", "p95", "p99", "fallbacks"],
                  [[r["op"], r["backend"], r["count"], _t(r["total_us"]), _t(r["p50_us"]), _t(r["p95_us"]),
                    _t(r["p99_us"]), r["fallbacks"]] for r in res.get("ops", [])])

    both = [r for r in res.get("speedup", []) if r["speedup"] is not None]
    out.append("\nGPU speedup over CPU by size bucket (medians; buckets with both sides measured)")
    out += _table(["op", "size", "cpu p50", "gpu p50", "speedup", "calls cpu/gpu"],
                  [[r["op"], _fmt_size(r["size"]), _t(r["cpu_p50_us"]), _t(r["gpu_p50_us"]), f"{r['speedup']:.2f}x",
                    f"{r['cpu_count']}/{r['gpu_count']}"] for r in both], _NO_BOTH)

    out.append("\nCrossover (size where the GPU starts to win)")
    rows = []
    for c in res.get("crossover", []):
        if c["status"] == "crossover":
            est = f"~{_fmt_size(c['size'])}"
            unc = f"between {_fmt_size(c['low'])} and {_fmt_size(c['high'])}" + ("" if c["monotone"] else " (noisy)")
        elif c["status"] == "gpu_always":
            est, unc = f"<= {_fmt_size(c['high'])}", "GPU faster at every size seen"
        elif c["status"] == "cpu_always":
            est, unc = f"> {_fmt_size(c['low'])}", "CPU faster at every size seen"
        else:
            est, unc = "-", f"GPU loses at the largest size (~{_fmt_size(c['low'])})"
        rows.append([c["op"], est, unc])
    out += _table(["op", "crossover", "uncertainty"], rows, _NO_BOTH)

    ro = res.get("routing", {})
    o = ro.get("overall", {})
    out.append("\nRouting (calls on the faster side of their size bucket; cost-model decisions only)")
    rows = [[r["op"], r["judged"], "-" if r["accuracy"] is None else f"{r['accuracy']:.1%}", _t(r["regret_us"]),
             "-" if r["regret_pct"] is None else f"{r['regret_pct']:.1f}%", r["unjudged"]] for r in ro.get("per_op", [])
            if r["judged"] or r["unjudged"]]
    if rows:
        rows.append(["(all)", o["judged"], "-" if o["accuracy"] is None else f"{o['accuracy']:.1%}", _t(o["regret_us"]),
                     "-" if o["regret_pct"] is None else f"{o['regret_pct']:.1f}%", o["unjudged"]])
    out += _table(["op", "judged", "accuracy", "regret", "regret %", "not judged"], rows,
                  "(none: no cost-model decision in a size bucket measured on both sides)")
    if ro.get("not_judged_reason"):
        out.append(f"  {ro['not_judged_reason']}")

    splits = res.get("splits") or []
    if splits:
        out.append("\nSplit calls (cut across the CPU and the GPU; balance 1.0: both sides finished together)")
        out += _table(["op", "calls", "GPU share", "balance mean", "balance min", "total"],
                      [[r["op"], r["calls"], f"{r['mean_gpu_share']:.0%}", f"{r['mean_balance']:.2f}",
                        f"{r['min_balance']:.2f}", _t(r["time_us"])] for r in splits])

    out.append("\nFallbacks by error")
    out += _table(["op", "from", "count", "error"],
                  [[f["op"], f["backend"], f["count"], f["error"]] for f in res.get("fallbacks", [])])
    health = [h for h in res.get("gpu_health", []) if h["gpu_failed"] or h["breaker_opened"]]
    if health:
        out.append("\nGPU health")
        out += _table(["op", "ok", "failed", "success", "breaker opened"],
                      [[h["op"], h["gpu_ok"], h["gpu_failed"], f"{h['success_rate']:.1%}" if h["success_rate"] is not None
                        else "-", h["breaker_opened"]] for h in health])

    workers = res.get("workers") or []
    if workers:
        out += _render_workers(workers)

    adv = res.get("advice", [])
    out.append("\nAdvice")
    out += [f"  - {a}" for a in adv] if adv else ["  (nothing to flag)"]
    return "\n".join(out)
