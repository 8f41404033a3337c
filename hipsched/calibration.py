"""Calibration: run every op over a sweep of sizes on each backend (forced), so the model has measured
buckets on both sides before real work arrives. Inputs are random arrays whose work measure
(Call.size) spans the range where the CPU/GPU crossover usually lies."""
from __future__ import annotations

import logging
import time

import numpy as np

from .errors import GpuError
from .progress import progress as _progress

log = logging.getLogger("hipsched")


def _f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _csr(rng, n, degree=8):
    indptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
    indices = rng.integers(0, n, n * degree, dtype=np.int64)
    weights = rng.random(n * degree, dtype=np.float32)
    return (indptr, indices, weights)


def _quantized(rng, n, k):
    from .ops.quant import quantize
    return quantize(_f32(rng, n, k), "q8_0")


# op -> [(label, (args, kwargs) builder)]; sizes grow by about 4x per step
def _sweep(op, rng):
    p2 = [2 ** e for e in range(6, 23, 2)]                      # 64 .. 4M elements
    if op in ("add", "scale", "softmax"):
        for n in p2:
            rows = max(1, n // 256)
            x = _f32(rng, rows, n // rows)
            if op == "add":
                yield n, (x, _f32(rng, *x.shape)), {}
            elif op == "scale":
                yield n, (x, 0.5), {}
            else:
                yield n, (x,), {"axis": -1}
    elif op in ("cosine_similarity", "top_k"):
        for n in (64, 256, 1024, 4096, 16384, 65536):
            q, T = _f32(rng, 128), _f32(rng, n, 128)
            yield n * 128, (q, T) + ((10,) if op == "top_k" else ()), {}
    elif op == "matmul":
        for n in (8, 16, 32, 64, 128, 256, 512):
            yield n ** 3, (_f32(rng, n, n), _f32(rng, n, n)), {}
    elif op in ("dequantize", "qmatmul"):
        for n in (64, 256, 1024, 2048):
            w = _quantized(rng, n, 1024)
            yield n * 1024, ((w,) if op == "dequantize" else (w, _f32(rng, 1024))), {}
    elif op == "attention":
        for s in (16, 64, 128, 256, 512):
            q, k, v = (_f32(rng, 1, 4, s, 64) for _ in range(3))
            yield 4 * s * s * 64, (q, k, v), {}
    elif op == "spread_activation":
        for n in (256, 4096, 65536):
            seeds = np.zeros(n, np.float32)
            seeds[:8] = 1.0
            yield n * 8 * 3, (_csr(rng, n), seeds), {"decay": 0.5, "steps": 3, "threshold": 0.0}


def calibrate(ex, ops=None, progress=True, repeats=3, max_seconds_per_op=None, seed=0):
    """Runs the sweep through `ex` (so the model learns from real runs, exactly as in use); returns
    {op: [(size, median cpu us, median gpu us or None)]}. Ops that cannot run here are skipped with
    a log line, and a size whose CPU run takes longer than max_seconds_per_op ends that op's sweep."""
    from .backends.cpu import CPU_IMPLS
    ops = list(ops) if ops else list(CPU_IMPLS)
    unknown = [o for o in ops if o not in CPU_IMPLS]
    if unknown:
        raise ValueError(f"calibrate: unknown op(s) {unknown}; ops: {', '.join(CPU_IMPLS)}")
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
