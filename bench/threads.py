"""hipsched beside the process's other thread pools (docs/benchmarks.md, "Beside torch and NumPy's BLAS"):
one op timed alone, then interleaved with a torch matmul and a NumPy (OpenBLAS) matmul between its calls,
as a program that mixes the three would run it, with the pools left as they are, with the recipe
(threadpoolctl's threadpool_limits(1, user_api="blas") around the mix: BLAS on one thread, torch and
hipsched as they are), and with every pool capped to one thread. p50 and p90 of the op's own time per
configuration, all in one run. Table printed and written to bench/results/threads.md.

    python bench/threads.py [--calls 400] [--op qmatmul|top_k]"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import threadpoolctl
import torch

import checkout  # noqa: E402,F401  (a checkout built in place is what is measured)
import hipsched as hs


def _op(name, rng):
    if name == "qmatmul":
        w = hs.quantize(rng.standard_normal((1024, 1024), dtype=np.float32), "q8_0")
        x = rng.standard_normal(1024, dtype=np.float32)
        return "qmatmul q8_0 1024x1024 @ (1024,)", lambda: hs.qmatmul(w, x, backend="cpu")
    T = rng.standard_normal((16384, 256), dtype=np.float32)
    q = rng.standard_normal(256, dtype=np.float32)
    return "top_k 16384x256, k=10", lambda: hs.top_k(q, T, 10, backend="cpu")


def _times(op, calls, between):
    out = np.empty(calls)
    for i in range(calls):
        between()
        t0 = time.perf_counter()
        op()
        out[i] = time.perf_counter() - t0
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--op", choices=["qmatmul", "top_k"], default="qmatmul")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    label, op = _op(args.op, rng)
    A = rng.standard_normal((256, 256), dtype=np.float32)
    tA = torch.from_numpy(A.copy())

    def mix():
        A @ A            # NumPy: OpenBLAS's pool
        tA @ tA          # torch: its intra-op pool (OpenMP)

    def nothing():
        pass

    for _ in range(50):   # warm every pool
        mix()
        op()
    info = {i["internal_api"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}
    rows = []

    def measure(name, between, limits=None):
        if limits is None:
            t = _times(op, args.calls, between)
        else:
            with threadpoolctl.threadpool_limits(**limits):
                t = _times(op, args.calls, between)
        rows.append((name, np.percentile(t, 50), np.percentile(t, 90)))

    measure("alone", nothing)
    measure("interleaved with torch and NumPy matmuls", mix)
    measure("interleaved, BLAS limited to 1 thread (the recipe)", mix, {"limits": 1, "user_api": "blas"})
    measure("interleaved, every pool at 1 thread", mix, {"limits": 1})
    measure("alone, hipsched at 1 thread", nothing, {"limits": 1})
    base = rows[0][1]
    lines = [f"## hipsched beside torch and BLAS ({platform.processor() or platform.machine()}, {os.cpu_count()} "
             f"cores; pools: {', '.join(f'{k} {v}' for k, v in sorted(info.items()))}; torch {torch.__version__}; "
             f"shared machine, one run)", "",
             f"{label}, {args.calls} calls per row; between two calls of the interleaved rows: a 256x256 float32 "
             f"matmul in NumPy and one in torch (not timed).", "",
             "| configuration | p50 | p90 | p50 vs alone |", "|---|---|---|---|"]
    for name, p50, p90 in rows:
        lines.append(f"| {name} | {p50 * 1e3:.3f} ms | {p90 * 1e3:.3f} ms | {p50 / base:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "threads.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
