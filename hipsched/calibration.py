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


DTYPES = ("float32", "float16", "bfloat16")


def _sweep(op, rng, dtype="float32"):
    """The op spec's calibration calls: (size, args, kwargs), sizes growing by about 4x per step; for a
    half dtype, its float32 array arguments in that dtype (the model keys samples by dtype)."""
    calls = OPS[op].sweep(rng)
    if dtype == "float32":
        return calls
    dt = _numpy_dtype(dtype)
    return ((size, tuple(a.astype(dt) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a
                         for a in args), kwargs) for size, args, kwargs in calls)


def _numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes  # noqa: F401 - registers the type; whoever calibrates bfloat16 has it
    return np.dtype(name)


# Runs per side and size: at least `repeats`, then more while the last three differ by more than
# SETTLED_SPREAD (max/min), up to MAX_REPEATS. On the H200 host a size's three runs came out 388, 257
# and 137 us (add, 1M floats): a first touch of fresh output memory in a VM whose memory grows as it is
# used, still settling when the sweep moved on, and the model took the mean of the two slower runs.
SETTLED_SPREAD = 1.3
MAX_REPEATS = 8


def _warm_up(ex, op, side, args, kwargs):
    """One unrecorded run of the call on `side`'s backend, outside the model and the telemetry: a
    size's first run holds first-use costs (a kernel's compilation and load, an allocator's growth,
    output memory's first touch) that are not the op's time. Errors are left to the recorded runs."""
    try:
        call = OPS[op].prepare(*args, **kwargs)
        if side == "cpu":
            ex._cpu.run(call)
        elif ex._gpu is not None and ex._gpu.available:
            call.judged = ex._gpu.judge(call)
            if call.judged.refusal is None and call.judged.fits:
                ex._gpu.run(call)
    except Exception as e:  # noqa: BLE001 - a warm-up measures nothing; the recorded runs report failures
        log.debug("hipsched calibrate: warm-up of %s on %s failed (%s)", op, side, e)


def _settled(times) -> bool:
    last = times[-3:]
    return len(last) == 3 and max(last) <= SETTLED_SPREAD * min(last)


def calibrate(ex, ops=None, progress=True, repeats=3, max_seconds_per_op=None, seed=0, dtypes=("float32",)):
    """Runs the sweep through `ex` (so the model learns from real runs, exactly as in use), each size
    first run once on each side unrecorded (its first-use costs are not the op's), then at least
    `repeats` times, and up to MAX_REPEATS while the runs have not settled; returns
    {op: [(size, median cpu us, median gpu us or None)]}, a float16/bfloat16 sweep under "op[dtype]", and
    an op of quantized weights per quantization type, "qmatmul[q8_0]" and "qmatmul[q4_0]".
    `dtypes` (of float32, float16, bfloat16) are swept for each op whose CPU side takes them. Ops that
    cannot run here are skipped with a log line, and a size whose CPU run takes longer than
    max_seconds_per_op ends that op's sweep."""
    known = [name for name, spec in OPS.items() if spec.sweep is not None]
    ops = list(ops) if ops else known
    unknown = [o for o in ops if o not in known]
    if unknown:
        raise ValueError(f"calibrate: unknown op(s) {unknown}; ops: {', '.join(known)}")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"calibrate: dtypes must be among {', '.join(DTYPES)}, got {list(dtypes)}")
    rng = np.random.default_rng(seed)
    caps = ex.capabilities()
    # a forced GPU run of a dtype the GPU lacks would run on the CPU: not a GPU time
    on_gpu = {(c.op, d) for c in caps.ops if c.backend == "gpu" for d in c.dtypes} if caps.gpu_available else set()
    native_gpu = {c.op for c in caps.ops if c.backend == "gpu" and c.op in OPS
                  and not any(d in DTYPES for d in OPS[c.op].cpu_dtypes)}
    plans = {}
    for op in ops:
        for dtype in dtypes:
            native = not any(d in DTYPES for d in OPS[op].cpu_dtypes)
            if native:
                # an op of quantized weights (qmatmul, dequantize) has no float dtype to sweep: its own
                # sweep covers its quantization types, once, in the float32 pass
                if dtype != "float32":
                    continue
            elif dtype not in OPS[op].cpu_dtypes:
                continue
            name = op if dtype == "float32" else f"{op}[{dtype}]"
            try:
                calls = list(_sweep(op, rng, dtype))
            except Exception as e:  # e.g. the quant family is not built here, ml_dtypes absent
                log.info("hipsched calibrate: skipping %s (%s)", name, e)
                continue
            if native:
                # one row list per quantization type, named as the float dtypes are ("qmatmul[q8_0]"): in
                # one list each size came twice, one row per type, with nothing to tell them apart
                for size, args, kwargs in calls:
                    qtype = args[0].qtype
                    plans.setdefault((f"{op}[{qtype}]", op, qtype), []).append((size, args, kwargs))
            else:
                plans[(name, op, dtype)] = calls
    bar = _progress(sum(len(p) for p in plans.values()), "calibrating", enabled=progress)
    table = {}
    try:
        with ex.scope(phase="calibrate"):
            for (name, op, dtype), plan in plans.items():
                fn = getattr(ex, op)
                sides = ["cpu"] + (["gpu"] if (op, dtype) in on_gpu or op in native_gpu else [])
                rows = []
                for size, args, kwargs in plan:
                    bar.set_postfix_str(f"{name} size={size}")
                    med = {}
                    for side in sides:
                        try:
                            times = []
                            _warm_up(ex, op, side, args, kwargs)
                            # (fewer than three asked for: exactly those, a quick look)
                            for i in range(repeats if repeats < 3 else max(repeats, MAX_REPEATS)):
                                if i >= repeats and (_settled(times) or (
                                        max_seconds_per_op and sum(times) * 1e-6 > max_seconds_per_op)):
                                    break
                                before = ex._core.counters()
                                t0 = time.perf_counter()
                                fn(*args, backend=side, **kwargs)
                                dt = (time.perf_counter() - t0) * 1e6
                                after = ex._core.counters()
                                # a GPU run that fell back ran on the CPU: not a GPU time
                                if after["fallback_operations"] == before["fallback_operations"]:
                                    # the time the model was given (a simulated machine's own clock), else
                                    # the wall time (a run left queued on a stream)
                                    seen = after[f"{side}_time_us"] - before[f"{side}_time_us"]
                                    times.append(seen if seen > 0 else dt)
                            if times:
                                med[side] = float(np.median(times[-3:]))
                            else:
                                log.info("hipsched calibrate: %s on %s at size %d fell back to the CPU", name, side,
                                         size)
                        except (GpuError, NotImplementedError, ImportError) as e:
                            log.info("hipsched calibrate: %s on %s at size %d: %s", name, side, size, e)
                    bar.update(1)
                    rows.append((size, med.get("cpu"), med.get("gpu")))
                    if max_seconds_per_op and (med.get("cpu") or 0) * 1e-6 > max_seconds_per_op:
                        bar.update(len(plan) - len(rows))
                        break
                table[name] = rows
    finally:
        bar.close()
    return table
