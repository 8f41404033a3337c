"""Advice lines from an analysis result: each names an op, what the events show and what to do. Only
claims the events support; estimates say they are estimates."""
from __future__ import annotations


def _fmt_size(x):
    if x is None:
        return "?"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.0f}"


def advice(res: dict, min_calls=5) -> list[str]:
    out = []
    if res.get("dropped_events"):
        out.append(f"{res['dropped_events']} events were dropped from the log (writer queue full): this log "
                   "under-counts; raise the telemetry queue_size (the in-memory counters were exact)")
    top_error = {}
    for f in res.get("fallbacks", []):  # sorted most frequent first
        top_error.setdefault(f["op"], f["error"])
    for h in res.get("gpu_health", []):
        n = h["gpu_ok"] + h["gpu_failed"]
        if n >= min_calls and h["success_rate"] is not None and h["success_rate"] < 0.95:
            line = f"GPU success rate {h['success_rate']:.0%} for {h['op']}"
            if h["breaker_opened"]:
                line += f": breaker opened {h['breaker_opened']} times"
            if h["op"] in top_error:
                line += f"; most common error: {top_error[h['op']]}"
            out.append(line)
    for t in res.get("transfer_estimate", []):
        if t["copy_share"] is not None and t["copy_share"] >= 0.5 and t["gpu_time_us"] > 0:
            out.append(f"{t['op']}: ~{t['copy_share']:.0%} of GPU time would be host-to-device copies if its inputs "
                       f"come from the host (estimated from event bytes at {t['assumed_gbps']:g} GB/s): keep the data "
                       "resident on the device (pass device arrays)")
    cross = {c["op"]: c for c in res.get("crossover", [])}
    for r in res.get("routing", {}).get("per_op", []):
        if r["judged"] >= 20 and r["accuracy"] is not None and r["accuracy"] < 0.9:
            c = cross.get(r["op"])
            where = (f" (GPU wins above ~{_fmt_size(c['size'])})" if c and c["status"] == "crossover" else "")
            out.append(f"{r['op']}: only {r['accuracy']:.0%} of calls went to the faster side{where}; "
                       f"{r['regret_us'] / 1e3:.1f} ms lost ({r['regret_pct']:.1f}% of its time): recalibrate "
                       "(hipsched calibrate)")
    for c in cross.values():
        if c["status"] == "cpu_always":
            out.append(f"{c['op']}: the GPU never beat the CPU at the sizes seen (up to ~{_fmt_size(c['low'])}): "
                       "it is best left on the CPU")
        elif c["status"] == "non_monotone":
            out.append(f"{c['op']}: the GPU wins at some sizes but loses at the largest (~{_fmt_size(c['low'])}): "
                       "look for memory pressure or chunking at large sizes")
    total = sum(res.get("reasons", {}).values())
    exploring = res.get("reasons", {}).get("exploring", 0)
    if total >= 100 and exploring / total > 0.2:
        out.append(f"{exploring / total:.0%} of calls were exploration: the cost model was still learning; run "
                   "hipsched calibrate once so new processes start calibrated")
    gpu_calls = sum(h["gpu_ok"] for h in res.get("gpu_health", []))
    if total and not gpu_calls:
        out.append("no call ran on a GPU: every op used the CPU (hipsched info says why)")
    return out
