"""The analyzer behind tools/analyze.py and `python -m hipsched analyze`: one streaming pass over any
number of JSONL logs (memory bounded by the number of distinct ops, size buckets and runs, never by the
number of events) that answers where time went and whether the scheduler routed well.

Method, so the numbers can be trusted:
- Latency quantiles come from log-scale histograms (quantiles.py: 2% bins, <= 1% relative error).
- Size buckets are log2 (size in [2^b, 2^(b+1))); a bucket's size is the geometric mean of its calls.
- Speedup in a bucket = CPU median / GPU median, over calls that did not fall back.
- Crossover: the boundary after the last bucket where the CPU wins, interpolated in log-log between
  that bucket and the next (where the GPU wins); its uncertainty is that bracket of bucket sizes.
- Routing accuracy and regret: in buckets where both sides have >= min_samples calls, a call is
  correct when it ran on the side with the lower median (either side within the tie band); regret is
  the observed time of calls on the slower side minus what the faster side's median would have taken.
  Calls the cost model did not decide (NOT_ROUTED: forced, unhealthy GPU, capacity, exploration) are
  left out. A call split across both sides (backend "split") is correct when the bucket's split median is
  within the tie band of the faster single side's median or below it, and its regret is its time beyond
  that median.
- Splits: per op, how many calls were split, the GPUs' mean share of the rows (all devices together), and
  the balance achieved (the event's `split.balance`: the rows' time at the parts' summed throughputs over
  the call's time).
- Events duplicated across the inputs (same run and sequence number) count once, so logs merge by run id."""
from __future__ import annotations

import bisect
import math
import re

from .events import op_label
from .quantiles import LogHistogram
from .reader import DropCounter, ReadStats, iter_records

# Decisions the cost model did not make (forced by the user, by health or by capacity, or deliberate
# exploration) are not judged for routing accuracy.
NOT_ROUTED = frozenset({"user_preference", "exploring", "gpu_unhealthy", "gpu_unavailable", "memory_constraint",
                        "cpu_fallback", "gpu_unsupported"})


def size_bucket(size) -> int:
    return int(size).bit_length() - 1 if size and size > 0 else -1


_HEX = re.compile(r"0x[0-9a-fA-F]+")
_LONG = re.compile(r"\d{4,}")
MAX_ERRORS_PER_OP = 256   # distinct error texts kept per op; the rest count as OTHER_ERRORS
OTHER_ERRORS = "(other errors)"


def error_key(err) -> str:
    """Group fallback errors by message, with addresses (0x...) and long numbers (byte counts) folded."""
    return _LONG.sub("N", _HEX.sub("0xN", str(err)))[:160]


class _SeqSet:
    """Sequence numbers seen for one run, as sorted disjoint intervals: O(1) for in-order logs and
    bounded by the number of gaps, however many events."""
    __slots__ = ("lo", "hi")

    def __init__(self):
        self.lo, self.hi = [], []

    def add(self, s) -> bool:
        """False when s was already seen (a duplicate)."""
        lo, hi = self.lo, self.hi
        if hi and s == hi[-1] + 1:
            hi[-1] = s
            return True
        i = bisect.bisect_right(lo, s) - 1
        if i >= 0 and s <= hi[i]:
            return False
        if i >= 0 and s == hi[i] + 1:
            hi[i] = s
        else:
            i += 1
            lo.insert(i, s)
            hi.insert(i, s)
        if i + 1 < len(lo) and hi[i] + 1 == lo[i + 1]:  # close a gap
            hi[i] = hi[i + 1]
            del lo[i + 1], hi[i + 1]
        return True


class _Bucket:
    __slots__ = ("hist", "log_size", "n", "routed", "routed_time")

    def __init__(self):
        self.hist = {}                 # backend -> LogHistogram (calls that did not fall back)
        self.log_size = 0.0
        self.n = 0
        self.routed = {}               # backend -> count of routing decisions
        self.routed_time = {}          # backend -> their observed time

    @property
    def size(self):
        return math.exp(self.log_size / self.n) if self.n else None

    def p50(self, backend):
        h = self.hist.get(backend)
        return h.quantile(0.5) if h is not None else None


MAX_WORKERS = 4096   # workers given their own tables; events of others count only in the totals


class Analyzer:
    def __init__(self, min_samples=3, tie_band=0.05, pcie_gbps=25.0, per_worker=True):
        self.per_worker = per_worker
        self.workers = {}      # worker name -> Analyzer of its events only (events with a `worker` field)
        self.worker_jobs = {}  # worker name -> set of job ids
        self.min_samples = min_samples
        self.tie_band = tie_band
        self.pcie_gbps = pcie_gbps
        self.cells = {}        # (op, backend) -> [LogHistogram, fallbacks_landed_here]
        self.buckets = {}      # (op, bucket) -> _Bucket
        self.runs = {}         # run -> dict
        self.fallbacks = {}    # (op, failed_backend, error_key) -> count
        self._error_kinds = {}  # op -> distinct error keys kept
        self.gpu_health = {}   # op -> [gpu_ok, gpu_failed, breaker_opened]
        self.gpu_bytes = {}    # op -> [bytes of GPU calls, their time]
        self.reasons = {}      # reason -> count
        self.splits = {}       # op -> [calls, sum of balance, least balance, sum of GPU share, time]
        self.phases = {}       # (phase, backend) -> [count, time]
        self._unhealthy = {}   # (run, op) -> last decision was gpu_unhealthy
        self.dropped = 0
        self._drops = DropCounter()
        self.duplicates = 0

    # ---------------------------------------------------------------- one pass
    def add(self, d) -> bool:
        """Count one record; False when it was not a new event (a service record or a duplicate).
        Records of a distributed job's worker also go to that worker's own analyzer."""
        new = self._add(d)
        w = d.get("worker") if self.per_worker else None
        if w is not None and (new or d.get("event") == "dropped"):
            w = str(w)
            sub = self.workers.get(w)
            if sub is None and len(self.workers) < MAX_WORKERS:
                sub = self.workers[w] = Analyzer(self.min_samples, self.tie_band, self.pcie_gbps, per_worker=False)
            if sub is not None:
                sub._add(d)
                if d.get("job") is not None:
                    self.worker_jobs.setdefault(w, set()).add(str(d["job"]))
        return new

    def _add(self, d) -> bool:
        if d.get("event") == "dropped":
            self.dropped += self._drops.add(d)
            return False
        if "event" in d or "op" not in d:   # service records this reader does not know
            return False
        run = d.get("run")
        r = self.runs.get(run)
        if r is None:
            r = self.runs[run] = {"run": run, "host": d.get("host"), "device": d.get("device"),
                                  **{k: d[k] for k in ("worker", "job") if d.get(k) is not None}, "events": 0,
                                  "first_ts": d.get("ts"), "last_ts": d.get("ts"), "_seq": _SeqSet()}
        seq = d.get("seq")
        if isinstance(seq, int) and not r["_seq"].add(seq):
            self.duplicates += 1
            return False
        r["events"] += 1
        ts = d.get("ts") or ""
        if ts < (r["first_ts"] or "~"):
            r["first_ts"] = ts
        if ts > (r["last_ts"] or ""):
            r["last_ts"] = ts

        op, backend, reason = d.get("op"), d.get("backend"), d.get("reason")
        label = op_label(d)   # tables per op and half dtype; GPU health stays per op, as the breaker is
        dur = d.get("duration_us")
        dur = float(dur) if isinstance(dur, (int, float)) else None
        fb = d.get("fallback")
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

        cell = self.cells.get((label, backend))
        if cell is None:
            cell = self.cells[(label, backend)] = [LogHistogram(), 0]
        if dur is not None:
            cell[0].add(dur)
        ph = self.phases.setdefault((d.get("phase"), backend), [0, 0.0])
        ph[0] += 1
        ph[1] += dur or 0.0

        health = self.gpu_health.setdefault(op, [0, 0, 0])
        key = (run, op)
        unhealthy = reason == "gpu_unhealthy"
        if unhealthy and not self._unhealthy.get(key, False):
            health[2] += 1
        self._unhealthy[key] = unhealthy

        if fb:
            cell[1] += 1
            fkey = (label, fb.get("backend"), error_key(fb.get("error")))
            if fkey not in self.fallbacks:
                # memory stays bounded even when every error text is different
                n_op = self._error_kinds.get(label, 0)
                if n_op >= MAX_ERRORS_PER_OP:
                    fkey = (label, fb.get("backend"), OTHER_ERRORS)
                else:
                    self._error_kinds[label] = n_op + 1
            self.fallbacks[fkey] = self.fallbacks.get(fkey, 0) + 1
            if fb.get("backend") == "gpu":
                health[1] += 1
            return True
        sp = d.get("split") if backend == "split" else None
        if isinstance(sp, dict):
            s = self.splits.setdefault(label, [0, 0.0, math.inf, 0.0, 0.0])
            bal = float(sp.get("balance") or 0.0)
            s[0] += 1
            s[1] += bal
            s[2] = min(s[2], bal)
            # the GPUs' share together: "gpu" with one device, "gpu:<index>" each with several
            s[3] += sum(float(v or 0.0) for k, v in (sp.get("shares") or {}).items() if str(k).startswith("gpu"))
            s[4] += dur or 0.0
        if backend == "gpu":
            health[0] += 1
            gb = self.gpu_bytes.setdefault(label, [0, 0.0])
            gb[0] += int(d.get("bytes") or 0)
            gb[1] += dur or 0.0
        size = d.get("size") or 0
        if dur is None or size <= 0:
            return True
        b = self.buckets.get((label, size_bucket(size)))
        if b is None:
            b = self.buckets[(label, size_bucket(size))] = _Bucket()
        b.n += 1
        b.log_size += math.log(size)
        h = b.hist.get(backend)
        if h is None:
            h = b.hist[backend] = LogHistogram()
        h.add(dur)
        if reason not in NOT_ROUTED:
            b.routed[backend] = b.routed.get(backend, 0) + 1
            b.routed_time[backend] = b.routed_time.get(backend, 0.0) + dur
        return True

    def feed(self, records) -> "Analyzer":
        for d in records:
            self.add(d)
        return self

    # ---------------------------------------------------------------- results
    def _both(self, b):
        m = self.min_samples
        return all(b.hist.get(s) is not None and b.hist[s].count >= m for s in ("cpu", "gpu"))

    def speedups(self):
        out = []
        for (op, k), b in sorted(self.buckets.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            cpu, gpu = b.p50("cpu"), b.p50("gpu")
            row = {"op": op, "bucket": k, "size": b.size, "cpu_count": b.hist["cpu"].count if "cpu" in b.hist else 0,
                   "gpu_count": b.hist["gpu"].count if "gpu" in b.hist else 0, "cpu_p50_us": cpu, "gpu_p50_us": gpu,
                   "speedup": None}
            if self._both(b) and cpu and gpu:
                row["speedup"] = cpu / gpu
            out.append(row)
        return out

    def crossovers(self, speedups=None):
        by_op = {}
        for row in speedups if speedups is not None else self.speedups():
            if row["speedup"] is not None:
                by_op.setdefault(row["op"], []).append(row)
        out = []
        for op in sorted(by_op, key=str):
            rows = by_op[op]
            s = [math.log(r["speedup"]) for r in rows]      # > 0: the GPU wins there
            sizes = [r["size"] for r in rows]
            res = {"op": op, "status": None, "size": None, "low": None, "high": None, "monotone": True,
                   "buckets": len(rows)}
            wins = [x > 0 for x in s]
            if all(wins):
                res.update(status="gpu_always", high=sizes[0])
            elif not any(wins):
                res.update(status="cpu_always", low=sizes[-1])
            else:
                k = max(i for i, w in enumerate(wins) if not w)   # last bucket the CPU wins
                if k == len(rows) - 1:
                    res.update(status="non_monotone", monotone=False, low=sizes[-1])
                else:
                    x0, x1 = math.log(sizes[k]), math.log(sizes[k + 1])
                    frac = (0 - s[k]) / (s[k + 1] - s[k]) if s[k + 1] != s[k] else 0.5
                    res.update(status="crossover", size=math.exp(x0 + frac * (x1 - x0)), low=sizes[k],
                               high=sizes[k + 1], monotone=not any(wins[:k]))
            out.append(res)
        return out

    def routing(self):
        per_op = {}
        for (op, _), b in self.buckets.items():
            acc = per_op.setdefault(op, {"op": op, "judged": 0, "correct": 0, "regret_us": 0.0, "time_us": 0.0,
                                         "unjudged": 0})
            n_routed = sum(b.routed.values())
            if not self._both(b):
                acc["unjudged"] += n_routed
                continue
            cpu, gpu = b.p50("cpu"), b.p50("gpu")
            better, worse = ("gpu", "cpu") if gpu < cpu else ("cpu", "gpu")
            best, worst = min(cpu, gpu), max(cpu, gpu)
            tie = worst <= best * (1 + self.tie_band)
            acc["judged"] += n_routed
            acc["correct"] += n_routed - b.routed.get("split", 0) if tie else b.routed.get(better, 0)
            acc["time_us"] += sum(b.routed_time.values())
            n_worse = b.routed.get(worse, 0)
            acc["regret_us"] += max(0.0, b.routed_time.get(worse, 0.0) - n_worse * best)
            n_split = b.routed.get("split", 0)
            if n_split:   # a split is right when it beats (or ties) the faster side alone
                if b.p50("split") <= best * (1 + self.tie_band):
                    acc["correct"] += n_split
                acc["regret_us"] += max(0.0, b.routed_time["split"] - n_split * best)
        rows = []
        for op in sorted(per_op, key=str):
            a = per_op[op]
            a["accuracy"] = a["correct"] / a["judged"] if a["judged"] else None
            a["regret_pct"] = 100 * a["regret_us"] / a["time_us"] if a["time_us"] else None
            rows.append(a)
        tot = {k: sum(r[k] for r in rows) for k in ("judged", "correct", "regret_us", "time_us", "unjudged")}
        tot["accuracy"] = tot["correct"] / tot["judged"] if tot["judged"] else None
        tot["regret_pct"] = 100 * tot["regret_us"] / tot["time_us"] if tot["time_us"] else None
        return {"overall": tot, "per_op": rows, "not_judged_reason": self._not_judged_reason(tot)}

    def _not_judged_reason(self, tot):
        """Why routing decisions in the log cannot be judged, in words (None when all were)."""
        if not tot["unjudged"]:
            return None
        m = self.min_samples
        if not any("gpu" in b.hist for b in self.buckets.values()):
            return (f"{tot['unjudged']} cost-model decisions not judged: no call in the log ran on the GPU, so there "
                    "is no other side to compare with")
        if not tot["judged"]:
            return (f"none of the {tot['unjudged']} cost-model decisions can be judged: no size bucket has calls "
                    f"measured on both sides (at least {m} each), and a run that never explores leaves one side per "
                    "bucket, most of all a calibrated one. Measure both sides of the same calls: run "
                    "`hipsched demo --oracle`, or add forced runs (backend='cpu' and backend='gpu') of the same "
                    "sizes to the log")
        return (f"{tot['unjudged']} cost-model decisions not judged: their size buckets have fewer than {m} calls "
                "on one side (`hipsched demo --oracle` measures both sides of every call)")

    def split_table(self):
        return [{"op": op, "calls": n, "mean_balance": bal / n, "min_balance": least, "mean_gpu_share": share / n,
                 "time_us": t}
                for op, (n, bal, least, share, t) in sorted(self.splits.items(), key=lambda kv: str(kv[0])) if n]

    def op_table(self):
        rows = []
        for (op, backend), (h, fbs) in sorted(self.cells.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            rows.append({"op": op, "backend": backend, **h.summary(), "fallbacks": fbs})
        return rows

    def health(self):
        rows = []
        for op, (ok, failed, opened) in sorted(self.gpu_health.items(), key=lambda kv: str(kv[0])):
            if ok + failed == 0 and opened == 0:
                continue
            rows.append({"op": op, "gpu_ok": ok, "gpu_failed": failed, "breaker_opened": opened,
                         "success_rate": ok / (ok + failed) if ok + failed else None})
        return rows

    def worker_results(self) -> list:
        """Per worker (sorted by name): its runs, hardware, op table, crossover, fallbacks, GPU health."""
        out = []
        for w in sorted(self.workers):
            sub = self.workers[w]
            runs = list(sub.runs.values())
            out.append({
                "worker": w, "jobs": sorted(self.worker_jobs.get(w, ())),
                "hosts": sorted({str(r["host"]) for r in runs}), "devices": sorted({str(r["device"]) for r in runs}),
                "runs": len(runs), "events": sum(r["events"] for r in runs), "dropped_events": sub.dropped,
                "ops": sub.op_table(), "crossover": sub.crossovers(),
                "fallbacks": [{"op": op, "backend": b, "error": e, "count": n}
                              for (op, b, e), n in sorted(sub.fallbacks.items(), key=lambda kv: -kv[1])],
                "gpu_health": sub.health()})
        return out

    def result(self, read_stats: ReadStats | None = None) -> dict:
        sp = self.speedups()
        res = {
            "inputs": read_stats.to_dict() if read_stats is not None else None,
            "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in self.runs.values()],
            "duplicates_skipped": self.duplicates,
            "dropped_events": self.dropped,
            "ops": self.op_table(),
            "speedup": sp,
            "crossover": self.crossovers(sp),
            "routing": self.routing(),
            "splits": self.split_table(),
            "fallbacks": [{"op": op, "backend": b, "error": e, "count": n}
                          for (op, b, e), n in sorted(self.fallbacks.items(), key=lambda kv: -kv[1])],
            "gpu_health": self.health(),
            "workers": self.worker_results(),
            "reasons": dict(sorted(self.reasons.items(), key=lambda kv: -kv[1])),
            "phases": [{"phase": p, "backend": b, "count": c, "time_us": t}
                       for (p, b), (c, t) in sorted(self.phases.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))],
            "transfer_estimate": [{"op": op, "gpu_bytes": by, "gpu_time_us": t,
                                   "copy_share": min(1.0, by / (self.pcie_gbps * 1e3) / t) if t > 0 and self.pcie_gbps > 0 else None,
                                   "assumed_gbps": self.pcie_gbps}
                                  for op, (by, t) in sorted(self.gpu_bytes.items(), key=lambda kv: str(kv[0]))],
        }
        from .advice import advice  # deferred: loaded only when advice is asked for (log analysis loads what it uses)
        res["advice"] = advice(res)
        return res


def analyze(paths, trace=None, rotated=True, **options) -> dict:
    """Analyse the logs in one streaming pass; with `trace`, also write a Chrome trace there."""
    stats = ReadStats()
    an = Analyzer(**options)
    tw = None
    if trace:
        # deferred: loaded only when a trace is asked for (log analysis loads what it uses)
        from .trace import TraceWriter
        tw = TraceWriter(trace)
    try:
        for d in iter_records(paths, stats, rotated=rotated):
            if an.add(d) and tw is not None:
                tw.add(d)
    finally:
        if tw is not None:
            tw.close()
    return an.result(stats)


def report(paths, trace=None, plot_dir=None, **options) -> str:
    """The analyzer's text report (what the demo prints); also writes the trace and plots if asked."""
    from .report import render  # deferred: loaded only when a report is rendered (log analysis loads what it uses)
    res = analyze(paths, trace=trace, **options)
    notes = []
    if trace:
        notes.append(f"trace written: {trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    if plot_dir:
        from .plots import write_plots  # deferred: plots need matplotlib, optional and heavy
        notes += write_plots(res, plot_dir)
    return render(res) + ("\n" + "\n".join(notes) if notes else "")
