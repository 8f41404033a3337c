"""Timing and tables shared by every benchmark: median of repeated runs after a warm-up, hipsched and
its peer measured alternately in the same run (these machines are noisy, so only same-run ratios mean
anything), each timed block of a CPU benchmark after a short idle pause (CPU_SETTLE_S), and a Markdown
table printed and written under bench/results/."""
from __future__ import annotations

import glob
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if glob.glob(os.path.join(_ROOT, "hipsched", "cpu", "_features*.so")):
    sys.path.insert(0, _ROOT)  # a checkout built in place: benchmark it rather than an installed copy


@dataclass
class Case:
    op: str                      # e.g. "cosine_similarity"
    shape: str                   # human description, e.g. "q(768) x T(262144,768)"
    ours: Callable[[], object]   # runs hipsched once
    peer: Callable[[], object]   # runs the peer once
    peer_name: str               # e.g. "numpy T@q"
    bytes: float = 0.0           # bytes moved per call (for GB/s), 0 if not meaningful
    flops: float = 0.0           # floating point operations per call (for GFLOP/s), 0 if not meaningful
    target: float | None = None  # the ratio (peer time / our time) the issue asks for: the goal
    family: str = ""
    floor: float | None = None   # the least the issue accepts below the goal (None: the goal is the floor)


# Idle seconds before each timed block of a CPU benchmark. A threaded library's workers keep spinning on
# their cores for a while after its call returns (OpenBLAS: about 2^28 cycles, ~0.1 s; libgomp: briefly),
# and a block started at once would share every core with the other side's spinners: on a 16-core machine
# that made both sides 4-20x slower than either runs alone. After the pause each side is timed as it runs
# by itself.
CPU_SETTLE_S = float(os.environ.get("HIPSCHED_BENCH_SETTLE_S", "0.15"))


def time_pair(ours, peer, repeat=7, min_time=0.2, settle=0.0):
    """Median seconds per call for both, interleaving runs so drift hits both alike; `settle` seconds
    idle before each timed block."""
    ours(); peer()  # warm-up (and first-use compile/alloc)
    reps_o = max(1, int(min_time / max(_once(ours), 1e-6) / repeat))
    reps_p = max(1, int(min_time / max(_once(peer), 1e-6) / repeat))
    to, tp = [], []
    for _ in range(repeat):
        time.sleep(settle)
        to.append(_loop(ours, reps_o))
        time.sleep(settle)
        tp.append(_loop(peer, reps_p))
    return float(np.median(to)), float(np.median(tp))


def _once(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t


def _loop(f, n):
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n


def fmt_time(s):
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def target_text(ratio: float, goal: float | None, floor: float | None = None) -> str:
    """'>= 0.75x (floor 0.6x) ok', '... below goal' (the floor met, the goal not) or '... MISSED'."""
    if not goal:
        return ""
    verdict = "ok" if ratio >= goal else "below goal" if floor is not None and ratio >= floor else "MISSED"
    return f">= {goal:g}x" + (f" (floor {floor:g}x)" if floor is not None else "") + f" {verdict}"


def run_cases(cases, title, out_name, repeat=7, settle=0.0):
    rows = []
    header = "| op | shape | hipsched | peer | peer time | ratio (peer/ours) | target | hipsched rate |"
    print(f"## {title}\n\n{header}\n|---|---|---|---|---|---|---|---|", flush=True)
    for c in cases:
        to, tp = time_pair(c.ours, c.peer, repeat=repeat, settle=settle)
        rate = ""
        if c.flops:
            rate = f"{c.flops / to / 1e9:.1f} GFLOP/s"
        elif c.bytes:
            rate = f"{c.bytes / to / 1e9:.2f} GB/s"
        ratio = tp / to
        tgt = target_text(ratio, c.target, c.floor)
        row = f"| {c.op} | {c.shape} | {fmt_time(to)} | {c.peer_name} | {fmt_time(tp)} | {ratio:.2f}x | {tgt} | {rate} |"
        print(row, flush=True)
        rows.append(row)
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", out_name)
    with open(path, "w") as f:
        f.write(f"## {title}\n\n{header}\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(f"\nwritten: {path}")
    return rows
