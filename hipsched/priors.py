"""The roofline prior: what each op should cost on each side before anything of it was measured.

A side's time for `work` units of an op is its fixed cost per call (a CPU call's overhead, a GPU call's
launch and host time) plus work x (bytes per unit / the side's memory bandwidth + flops per unit / its
peak rate), the op's bytes and flops per unit declared in its spec (OpSpec.cost). The machine's part
is measured at executor start, in a background thread (never on a caller's path), in a few
milliseconds: a backend that can say its own figures answers `roofline_properties()` (the GPU's from
its device properties and a few timed launches), and the CPU's are timed here with NumPy (a copy for
the bandwidth, a small matrix product for the rate, a tiny call for the overhead).

A prior is a guess with an uncertainty of about a factor of e (the scheduler's exploration rule reads
it so: hipsched/_sched.pyx), and the first measurement of a side replaces it; with one point measured,
the prior still gives the shape between sizes (how time grows with work), which one point cannot."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from .ops import OPS

log = logging.getLogger("hipsched")


def measure_cpu(budget_s: float = 0.02) -> dict:
    """{"launch_us", "gbps", "gflops"} of this host as NumPy sees it, in about `budget_s` seconds: the
    best of a few timed runs each (the least disturbed)."""
    def best(fn, n):
        t = float("inf")
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            t = min(t, time.perf_counter() - t0)
        return t
    a = np.ones(1 << 21, np.float32)   # 8 MB: past most L2s, a few ms at tens of GB/s
    b = np.empty_like(a)
    m = np.ones((256, 256), np.float32)
    tiny = np.ones(8, np.float32)
    deadline = time.perf_counter() + budget_s
    copy = best(lambda: np.copyto(b, a), 3)
    mm = best(lambda: m @ m, 3) if time.perf_counter() < deadline else None
    call = best(lambda: np.add(tiny, tiny), 20)
    return {"launch_us": call * 1e6, "gbps": 2 * a.nbytes / copy / 1e9,
            "gflops": (2 * 256 ** 3 / mm / 1e9) if mm else None}


def op_priors(cpu: dict | None, gpu: dict | None, ops=None) -> dict:
    """{op: {"cpu": (fixed us, us per work unit), "gpu": (...)}} for the ops with a declared cost, from
    each side's {"launch_us", "gbps", "gflops"} (a side left out, or a figure missing, gives none)."""
    out = {}
    for name, spec in (ops or OPS).items():
        if spec.cost is None:
            continue
        nbytes, flops = spec.cost
        sides = {}
        for side, props in (("cpu", cpu), ("gpu", gpu)):
            if not props or not props.get("gbps") or not props.get("gflops") or props.get("launch_us") is None:
                continue
            per = nbytes / (props["gbps"] * 1e3) + flops / (props["gflops"] * 1e3)
            sides[side] = (float(props["launch_us"]), float(per))
        if sides:
            out[name] = sides
    return out


def start(core, cpu_backend, gpu_backend, gpu_present: bool):
    """Measures both sides in a daemon thread and hands the priors to `core` (SchedCore.set_op_priors);
    returns the thread (None when the backends answered without measuring). A failure leaves the model
    without priors (as before this existed). A backend's `roofline_properties()` must answer at once
    (its device properties, figures it measured when it opened)."""
    cpu_props = getattr(cpu_backend, "roofline_properties", None)
    try:
        gpu_figures = gpu_backend.roofline_properties() if gpu_present else None
    except Exception as e:  # noqa: BLE001 - as below: no prior
        log.debug("hipsched: no GPU roofline figures (%s: %s)", type(e).__name__, e)
        gpu_figures = None
    if gpu_figures is None:
        # a prior on the CPU side alone would only delay the GPU's first run (a side with no estimate
        # is tried at once), and the choice is between the two
        return None
    gpu_props = lambda: gpu_figures  # noqa: E731

    def run():
        try:
            cpu = cpu_props() if cpu_props is not None else measure_cpu()
            gpu = gpu_props() if gpu_props is not None else None
            core.set_op_priors(op_priors(cpu, gpu))
        except Exception as e:  # noqa: BLE001 - a prior is an optimisation; the model works without one
            log.debug("hipsched: no roofline prior (%s: %s)", type(e).__name__, e)
    if cpu_props is not None:
        # both sides say their figures without measuring (nothing to time): no thread to wait for, and
        # the first call already has its prior
        run()
        return None
    t = threading.Thread(target=run, name="hipsched-prior", daemon=True)
    t.start()
    return t
