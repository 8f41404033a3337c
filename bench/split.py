"""Splitting one call across the CPU and its GPUs (hipsched/splitting.py): how well a split top_k
balances its sides, what deciding, cutting and merging cost, and how much faster it is than any side
alone, each side measured alone in the same run.

Usage: python bench/split.py [--rows N] [--dim D] [--calls N] [--gpu-speed X] [--gpus N] [--real-gpu]

Without --real-gpu the GPU is simulated, as issue 23 asks: a device whose time this benchmark sets (the
CPU's own time for the same rows, divided by --gpu-speed: 1.0 is equal throughput) and which sleeps for
it, leaving the CPU's cores to the CPU's part; its results come off the clock (the corpus's scores and
their order are computed once before timing, so a part's top k is a short scan of that order). --gpus N
gives the executor N such devices (the first is backend="gpu", the others take parts of split calls). With
--real-gpu the executor's own GPU backend takes the GPU's part (corpus on the host, uploaded per call
unless it is read-only and fits the resident budget).

Measures, each a median over --calls calls after the model has learned both sides:
- single sides: the CPU alone (backend="cpu"), the GPU alone (backend="gpu"), and with --gpus each further
  simulated device alone (its backend's run, called directly);
- split: the executor's automatic decision, which splits (the events say so, with the shares);
- balancing efficiency (EngineCL's): ideal / split time, ideal being the rows over the sum of the
  sides' single-side throughputs (1 / (1/cpu + 1/gpu + ...) for the whole call); target >= 0.9;
- overhead: the split call's time beyond its slower part (deciding, cutting, the hand-off to the GPU's
  thread and the merge), as a share of the call; target <= 3%;
- speed: split time over the better single side; target <= 0.6x at equal throughput.
The table is printed and written to bench/results/split.md (split-<N>gpus.md with --gpus N)."""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

import checkout  # noqa: E402,F401  (a checkout built in place is what is measured)
import hipsched as hs
from hipsched.backends.interface import GpuBackendBase
from hipsched.ops import OPS


class SleepingGpu(GpuBackendBase):
    """A device of set speed for top_k over one corpus: a call over rows [lo, hi) of the corpus sleeps
    `us_per_row * (hi - lo)` plus a launch, and answers from scores ranked once before the benchmark.
    What it does not override is GpuBackendBase's (no refusals, the call's bytes, no timing events)."""

    def __init__(self, q, T, k, us_per_row, launch_us=20.0, index=0):
        self.available = True
        self.device_index = index
        self.unavailable_reason = None
        self.runtime_name, self.device_name, self.device_arch = "sleep", "simulated GPU (sleeps)", "sim"
        self.T, self.k = T, k
        self.us_per_row, self.launch_us = us_per_row, launch_us
        # the CPU engine's own scores (top_k ranks by the same cosine), so the parts' answers are the
        # ones a real device computing exactly would give and the merged result can be checked exactly
        with hs.Executor(persist_model=False, telemetry_enabled=False, split=False) as cpu:
            scores = cpu.cosine_similarity(q, T, backend="cpu")
        # the op's ranking: score descending, ties to the lower index (no NaN in this corpus)
        self.order = np.lexsort((np.arange(len(scores)), -scores.astype(np.float64)))
        self.scores = scores

    def supports(self, op, dtype):
        return op == "top_k" and dtype == "float32"

    def max_elements(self, op):
        return 1 << 40

    def free_memory(self):
        return 1 << 40

    def transfer_bytes(self, call):
        return 0, 0        # the sleep is the whole cost: a resident corpus

    def measure_transfer(self):
        return {"h2d_latency_us": 10.0, "h2d_gbps": 1000.0, "d2h_latency_us": 10.0, "d2h_gbps": 1000.0}

    def run(self, call, stream=None):
        q, part = call.args[0], call.args[1]
        lo = (part.ctypes.data - self.T.ctypes.data) // self.T.strides[0]
        hi = lo + part.shape[0]
        t_end = time.perf_counter() + (self.launch_us + self.us_per_row * (hi - lo)) * 1e-6
        k = min(int(call.params["k"]), hi - lo)
        # the first k of the global order inside [lo, hi): about k * rows / (hi - lo) entries looked at
        picked, step, start = [], max(4 * k, 1024), 0
        while len(picked) < k:
            chunk = self.order[start:start + step]
            picked.extend(chunk[(chunk >= lo) & (chunk < hi)][:k - len(picked)].tolist())
            start += step
        idx = np.asarray(picked, dtype=np.int64)
        out = (idx - lo, self.scores[idx])
        left = t_end - time.perf_counter()
        if left > 0:
            time.sleep(left)   # the GIL is free: the CPU part runs on every core meanwhile
        return out


def median_us(fn, n):
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t) * 1e-3)
    return float(np.median(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1 << 20)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--calls", type=int, default=9)
    p.add_argument("--gpu-speed", type=float, default=1.0, help="simulated GPU throughput / the CPU's")
    p.add_argument("--gpus", type=int, default=1, help="simulated GPUs (each at --gpu-speed)")
    p.add_argument("--real-gpu", action="store_true", help="the executor's own GPU backend instead")
    p.add_argument("--resident-bytes", type=int, default=None,
                   help="with --real-gpu: the GPU's resident budget (half the corpus: issue 23's corpus of "
                        "twice the budget, which the GPU cannot keep and streams)")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    T = rng.standard_normal((a.rows, a.dim), dtype=np.float32)
    T.flags.writeable = False            # read-only: a real GPU may keep it resident
    q = rng.standard_normal(a.dim, dtype=np.float32)
    lines = []

    def out(s=""):
        print(s, flush=True)
        lines.append(s)

    cfg = dict(persist_model=False, telemetry_ring_size=100000)
    with hs.Executor(**cfg, split=False) as probe:       # the CPU's time for the whole call, alone
        probe.top_k(q, T, a.k, backend="cpu")
        cpu_whole = median_us(lambda: probe.top_k(q, T, a.k, backend="cpu"), 3)
    if a.real_gpu:
        gpu = None
        device = "this machine's GPU"
    else:
        gpu = [SleepingGpu(q, T, a.k, cpu_whole / a.gpu_speed / a.rows, index=i) for i in range(a.gpus)]
        device = (f"{a.gpus} simulated GPU{'s' if a.gpus > 1 else ''} at {a.gpu_speed:g}x the CPU's throughput "
                  f"each (sleeps)")
    if gpu is not None:
        ex = hs.Executor(**cfg, gpu_backend=gpu)
    else:
        ex = hs.Executor(**cfg, **({} if a.resident_bytes is None else {"resident_bytes": a.resident_bytes}))
        if a.resident_bytes is not None:
            device += f", resident budget {a.resident_bytes / 2**30:.2f} GiB for a {T.nbytes / 2**30:.2f} GiB corpus"
    with ex:
        if not ex.capabilities().gpu_available:
            print("bench/split.py: no GPU available; run without --real-gpu for the simulated one")
            return 0
        # the model learns both sides at the sizes a split's parts have
        for frac in (1.0, 0.75, 0.5, 0.25):
            part = T[:max(1, int(frac * a.rows))]
            for side in ("cpu", "gpu"):
                for _ in range(3):
                    ex.top_k(q, part, a.k, backend=side)
        cpu = median_us(lambda: ex.top_k(q, T, a.k, backend="cpu"), a.calls)
        gpu_t = median_us(lambda: ex.top_k(q, T, a.k, backend="gpu"), a.calls)
        whole = OPS["top_k"].prepare(q, T, a.k)
        others_t = [median_us(lambda g=g: g.run(whole), a.calls) for g in (gpu or [])[1:]]
        for _ in range(3):                 # the split's own samples settle the shares
            ex.top_k(q, T, a.k)
        n0 = len(ex.events)
        split = median_us(lambda: ex.top_k(q, T, a.k), a.calls)
        evs = [e for e in ex.events[n0:] if e["op"] == "top_k"]
        splits = [e for e in evs if e["backend"] == "split"]
        got = ex.top_k(q, T, a.k)
        want = ex.top_k(q, T, a.k, backend="cpu")
        exact = np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    out(f"## Splitting one top_k across the CPU and {'its GPUs' if len(others_t) else 'a GPU'} "
        f"({platform.machine()}, {os.cpu_count()} cores, {device})")
    out()
    out(f"top_k, q({a.dim}) x T({a.rows},{a.dim}) float32, k={a.k}; medians of {a.calls} calls each, same run")
    out()
    ideal = 1.0 / (1.0 / cpu + 1.0 / gpu_t + sum(1.0 / t for t in others_t))
    best = min(cpu, gpu_t, *others_t)
    if splits:
        share = float(np.median([sum(v for k, v in e["split"]["shares"].items() if k != "cpu") for e in splits]))
        sides = max(len(e["split"]["parts"]) for e in splits)
        slower = [max(p["duration_us"] for p in e["split"]["parts"]) for e in splits]
        overhead = float(np.median([(e["duration_us"] - s) / e["duration_us"] for e, s in zip(splits, slower)]))
    else:
        share = overhead = float("nan")
        sides = 0
    out("| measure | value | target |")
    out("|---|---|---|")
    out(f"| CPU alone | {cpu / 1e3:.2f} ms | |")
    out(f"| GPU alone{' (backend=gpu)' if others_t else ''} | {gpu_t / 1e3:.2f} ms | |")
    for i, t in enumerate(others_t, 1):
        out(f"| GPU {i} alone | {t / 1e3:.2f} ms | |")
    out(f"| split (automatic) | {split / 1e3:.2f} ms, {len(splits)} of {len(evs)} calls split, up to {sides} "
        f"parts, GPU share {share:.1%} | |")
    out(f"| ideal (rows over the summed single-side throughputs) | {ideal / 1e3:.2f} ms | |")
    eff = ideal / split
    out(f"| balancing efficiency (ideal / split) | {eff:.2f} | >= 0.9 {'ok' if eff >= 0.9 else 'MISSED'} |")
    out(f"| overhead (split call beyond its slower part) | {overhead:.1%} | <= 3% "
        f"{'ok' if overhead <= 0.03 else 'MISSED'} |")
    sp = split / best
    equal_pair = abs(a.gpu_speed - 1) < 1e-9 and not a.real_gpu and not others_t
    target = "<= 0.6x " + ("ok" if sp <= 0.6 else "MISSED") if equal_pair else ""
    out(f"| split / better single side | {sp:.2f}x | {target} |")
    out(f"| split result equals the CPU's | {'yes' if exact else 'NO'} | yes |")
    path = os.path.join(os.path.dirname(__file__), "results", "split.md" if a.gpus == 1 else f"split-{a.gpus}gpus.md")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"\nwritten: {path}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
