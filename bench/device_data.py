"""Device-array pipelines on a real GPU: where hipsched runs calls whose inputs already live on the
device, what it hands back, and what one call costs the host.

Rows, each library that is importable (torch on CUDA/ROCm, CuPy):
- routing: 40 calls of `ex.add` on two 1M-element float32 device arrays with backend="auto" and a cold
  model (a new Executor, persist_model=False): how many ran on the GPU and why (issue 19 asks >= 99%);
- result type: the type of what came back (the caller's own library, zero copy) and whether its values
  equal the library's own `x + y`;
- host time: `ex.add(x, y, backend="gpu")` on two 8-element device arrays against the library's own
  `x + y` in the same run (median of interleaved blocks after a warm-up, synchronised at the end of
  each block so queued work is paid for); issue 20 asks <= 2x;
- host arrays: `ex.add(a, b, backend="gpu")` on two 64-element NumPy arrays (up, add, down: the
  compiled call path stages them through page-locked memory with one wait) against torch's
  `(torch.from_numpy(a).cuda() + torch.from_numpy(b).cuda()).cpu()`; issue 20 asks <= 40 us.

Usage: python bench/device_data.py [--calls 40] [--repeat 7]. Prints a Markdown table and writes it to
bench/results/device_data.md. Without a GPU it says so and exits 0."""
from __future__ import annotations

import argparse
import collections
import os
import sys

from harness import fmt_time, time_pair   # noqa: E402  (bench/ is the script's directory)

import hipsched as hs


def _libraries():
    libs = []
    try:
        import torch
        if torch.cuda.is_available():
            libs.append(("torch", lambda n: torch.randn(n, device="cuda"), torch.cuda.synchronize,
                         lambda a, b: torch.equal(a, b)))
    except ImportError:
        pass
    try:
        import cupy as cp
        libs.append(("cupy", lambda n: cp.random.standard_normal(n, dtype=cp.float32),
                     cp.cuda.Device().synchronize, lambda a, b: bool((a == b).all())))
    except Exception:   # CuPy absent, or present without a usable device
        pass
    return libs


def _host_arrays(repeat):
    """The host-array row: a 64-element add on the GPU from NumPy arrays, against torch doing the same."""
    try:
        import numpy as np
        import torch
        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    a, b = np.ones(64, np.float32), np.ones(64, np.float32)
    with hs.Executor(persist_model=False) as ex:
        def ours():
            ex.add(a, b, backend="gpu")

        def peer():
            (torch.from_numpy(a).cuda() + torch.from_numpy(b).cuda()).cpu()
        to, tp = time_pair(ours, peer, repeat=repeat, min_time=0.2)
        compiled = ex._fast.plan_count > 0
    return (f"| float32 | {fmt_time(to)}{'' if compiled else ' (glue: no compiled plan)'} | {fmt_time(tp)} | "
            f"{to / tp:.2f}x | <= 40 us {'ok' if to <= 40e-6 else 'MISSED'} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    libs = _libraries()
    probe = hs.Executor(persist_model=False, telemetry_enabled=False)
    gpu_name = probe.capabilities().gpu_device_name if probe.capabilities().gpu_available else None
    probe.close()
    if gpu_name is None or not libs:
        print("no GPU (or no torch/CuPy with a device): nothing to measure")
        return 0
    header = ("| library | auto calls on the GPU (cold model) | reasons | result type | equal to the library's "
              "x + y | host time, 8 elements, backend=gpu | library x + y | ratio (ours/library) |")
    rows = []
    for name, make, sync, equal in libs:
        with hs.Executor(persist_model=False) as ex:
            x, y = make(1 << 20), make(1 << 20)
            outs = [ex.add(x, y) for _ in range(args.calls)]
            sync()
            where = collections.Counter((e["backend"], e["reason"]) for e in ex.events if e.get("op") == "add")
            on_gpu = sum(n for (be, _), n in where.items() if be == "gpu")
            out = outs[-1]
            same = equal(out, x + y) if type(out).__module__.split(".")[0] == name else False
            s1, s2 = make(8), make(8)

            def ours():
                ex.add(s1, s2, backend="gpu")

            def peer():
                s1 + s2

            def blocked(f):
                def run():
                    f()
                    sync()
                return run
            to, tp = time_pair(ours, peer, repeat=args.repeat, min_time=0.2)
            tob, tpb = time_pair(blocked(ours), blocked(peer), repeat=args.repeat, min_time=0.1)
        reasons = ", ".join(f"{be}/{r}: {n}" for (be, r), n in sorted(where.items()))
        rows.append(f"| {name} | {on_gpu}/{args.calls} | {reasons} | {type(out).__module__}.{type(out).__name__} | "
                    f"{same} | {fmt_time(to)} ({fmt_time(tob)} synchronised) | {fmt_time(tp)} ({fmt_time(tpb)}) | "
                    f"{to / tp:.1f}x |")
    title = f"## Device-array pipelines ({gpu_name})"
    table = f"{title}\n\n{header}\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    host_row = _host_arrays(args.repeat)
    if host_row is not None:
        table += ("\n| host arrays, 64 floats | ours: ex.add(a, b, backend='gpu') | torch: up, add, down | ratio | "
                  "target |\n|---|---|---|---|---|\n" + host_row + "\n")
    print(table)
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "device_data.md"), "w") as f:
        f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
