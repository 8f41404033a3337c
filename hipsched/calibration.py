"""Calibration: run every op over a sweep of sizes on each backend (forced), so the model has measured
buckets on both sides before real work arrives. Inputs are random arrays whose work measure
(Call.size) spans the range where the CPU/GPU crossover usually lies."""
from __future__ import annotations

import logging
import time

import numpy as np

from .errors import GpuError
from .ops import OPS
from .progress import progress as _progress

log = logging.getLogger("hipsched")


def _sweep(op, rng):
    """The op spec's calibration calls: (size, args, kwargs), sizes growing by about 4x per step."""
    return OPS[op].sweep(rng)


def calibrate(ex, ops=None, progress=True, repeats=3, max_seconds_per_op=None, seed=0):
    """Runs the sweep through `ex` (so the model learns from real runs, exactly as in use); returns
    {op: [(size, median cpu us, median gpu us or None)]}. Ops that cannot run here are skipped with
    a log line, and a size whose CPU run takes longer than max_seconds_per_op ends that op's sweep."""
    known = [name for name, spec in OPS.items() if spec.sweep is not None]
    ops = list(ops) if ops else known
    unknown = [o for o in ops if o not in known]
    if unknown:
        raise ValueError(f"calibrate: unknown op(s) {unknown}; ops: {', '.join(known)}")
    rng = np.random.default_rng(seed)
    sides = ["cpu"] + (["gpu"] if ex.capabilities().gpu_available else [])
    plans = {}
    for op in ops:
        try:
            plans[op] = list(_sweep(op, rng))
        except Exception as e:  # e.g. the quant family is not built here
            log.info("hipsched calibrate: skipping %s (%s)", op, e)
    bar = _progress(sum(len(p) for p in plans.values()), "calibrating", enabled=progress)
    table = {}
    try:
        with ex.scope(phase="calibrate"):
            for op, plan in plans.items():
                fn = getattr(ex, op)
                rows = []
                for size, args, kwargs in plan:
                    bar.set_postfix_str(f"{op} size={size}")
                    med = {}
                    for side in sides:
                        try:
                            times = []
                            for _ in range(repeats):
                                fb = ex._core.counters()["fallback_operations"]
                                t0 = time.perf_counter()
                                fn(*args, backend=side, **kwargs)
                                dt = (time.perf_counter() - t0) * 1e6
                                # a GPU run that fell back ran on the CPU: not a GPU time
                                if ex._core.counters()["fallback_operations"] == fb:
                                    times.append(dt)
                            if times:
                                med[side] = float(np.median(times))
                            else:
                                log.info("hipsched calibrate: %s on %s at size %d fell back to the CPU", op, side,
                                         size)
                        except (GpuError, NotImplementedError, ImportError) as e:
                            log.info("hipsched calibrate: %s on %s at size %d: %s", op, side, size, e)
                    bar.update(1)
                    rows.append((size, med.get("cpu"), med.get("gpu")))
                    if max_seconds_per_op and (med.get("cpu") or 0) * 1e-6 > max_seconds_per_op:
                        bar.update(len(plan) - len(rows))
                        break
                table[op] = rows
    finally:
        bar.close()
    return table
