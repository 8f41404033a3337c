"""GQA decode attention on the CPU against the time to read its K and V once (docs/benchmarks.md,
"Decode attention"): one query per head, a KV cache of `--keys` positions, 32 query heads sharing 8 KV
heads, head_dim 128, float32 (and the half types with --dtypes). Peers timed in the same run, in the same
process, interleaved with the op: a NumPy sum over K and V (what reading their bytes once costs through
one thread's loads) and a NumPy copy of K and V; then torch's SDPA on the same call (enable_gqa, the
repeated K and V it builds included), timed on its own after the others: torch's OpenMP threads spin for
a while after each call, and interleaved on a 2-core machine they took the cores of the call timed next. The op runs hipsched's own thread count; the ratio asked by issue 34 is op /
sum. Medians of `--reps` calls each. Table printed and written to bench/results/decode_attention.md.

    python bench/decode_attention.py [--keys 4096] [--reps 200] [--dtypes float32,float16,bfloat16]"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import hipsched as hs


def _median_us(fns, reps):
    """Each function's median wall time and median process CPU time (all threads) over `reps` rounds, the
    functions interleaved within a round (drift hits all). On a machine shared past its cores the wall time
    of a call longer than a scheduler slice counts the slices other processes took; the CPU time does not."""
    times = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return ({name: float(np.median(t)) * 1e6 for name, t in times.items()},
            {name: float(np.median(t)) * 1e6 for name, t in cpu.items()})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--dtypes", default="float32")
    args = ap.parse_args(argv)
    import ml_dtypes
    import torch
    rng = np.random.default_rng(0)
    b, hq, hkv, d, sk = 1, 32, 8, 128, args.keys
    rows = []
    for name in args.dtypes.split(","):
        dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        q = rng.standard_normal((b, hq, 1, d), dtype=np.float32).astype(dt)
        k = rng.standard_normal((b, hkv, sk, d), dtype=np.float32).astype(dt)
        v = rng.standard_normal((b, hkv, sk, d), dtype=np.float32).astype(dt)
        kv_len = np.array([sk], np.int64)
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
        tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(tdt) for x in (q, k, v))
        kvf = np.concatenate([k.reshape(-1).view(np.uint8), v.reshape(-1).view(np.uint8)])  # K and V's bytes
        kvf32 = kvf.view(np.float32)  # summed as float32 words whatever the dtype: one pass over the bytes
        dst = np.empty_like(kvf)
        fns = {
            "op": lambda: hs.attention(q, k, v, causal="lower_right", kv_len=kv_len, backend="cpu"),
            "sum": lambda: kvf32.sum(),
            "copy": lambda: np.copyto(dst, kvf),
        }
        for fn in fns.values():
            fn()
        t, c = _median_us(fns, args.reps)
        sdpa = {"torch": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)}
        sdpa["torch"]()
        t.update(_median_us(sdpa, args.reps)[0])
        mib = kvf.nbytes / 2 ** 20
        rows.append((name, mib, t["op"], t["sum"], t["copy"], t["torch"], c["op"], c["sum"]))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"GQA decode attention: batch {b}, {hq} query / {hkv} KV heads, 1 query x {sk} keys, head_dim {d} "
             f"(machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
             f"simd={hs.cpu_features()['simd']}, HIPSCHED_NUM_THREADS={os.environ.get('HIPSCHED_NUM_THREADS', 'unset')}, "
             f"load average {load:.0f} at the end, median of {args.reps})", "",
             "| dtype | K+V MiB | hipsched us | NumPy sum us | NumPy copy us | torch SDPA us | op / sum | op / copy | "
             "op GB/s | op CPU us | sum CPU us | CPU op / sum |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, mib, op, s, c, tt, cop, csum in rows:
        lines.append(f"| {name} | {mib:.1f} | {op:.0f} | {s:.0f} | {c:.0f} | {tt:.0f} | {op / s:.2f} | {op / c:.2f} | "
                     f"{mib * 2 ** 20 / op / 1e3:.1f} | {cop:.0f} | {csum:.0f} | {cop / max(csum, 1e-9):.2f} |")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "decode_attention.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
