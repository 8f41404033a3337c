"""GQA decode attention on the CPU against the time to read its K and V once (docs/benchmarks.md,
"Decode attention"): one query per head, a KV cache of `--keys` positions, 32 query heads sharing 8 KV
heads, head_dim 128, float32 (and the half types with --dtypes). Peers timed in the same run, in the same
process, interleaved with the op: a NumPy sum over K and V's bytes on one thread and split over two
threads (what reading them once costs; the faster of the two is the "read" the ratio is taken against)
and a NumPy copy of K and V; then torch's SDPA on the same call (enable_gqa, the repeated K and V it builds
included), timed on its own after the others: torch's OpenMP threads spin for a while after each call, and
interleaved on a 2-core machine they took the cores of the call timed next. Every timed call comes after an
untimed hipsched CPU op over three buffers of the last-level cache's size: in a decode step a layer's K
and V were last touched a whole step ago, behind every other layer's weights, and the op before
attention ran on the same thread team (see main). The op runs hipsched's own thread count; the ratio asked by issue 34 is
op / read. Medians of `--reps` calls each. Table printed and written to bench/results/decode_attention.md.

    python bench/decode_attention.py [--keys 4096] [--reps 200] [--dtypes float32,float16,bfloat16]"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import checkout  # noqa: E402,F401  (a checkout built in place is what is measured)
import hipsched as hs


def _llc_bytes():
    """The last-level cache's size (sysfs), 32 MiB where it cannot be read."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in os.listdir(base):
            try:
                with open(os.path.join(base, idx, "size")) as f:
                    txt = f.read().strip()
            except OSError:
                continue
            mult = {"K": 2 ** 10, "M": 2 ** 20}.get(txt[-1:], 1)
            best = max(best, int(txt.rstrip("KM")) * mult)
    except (OSError, ValueError):
        pass
    return best or 32 * 2 ** 20


def _median_us(fns, reps, flush):
    """Each function's median wall time and median process CPU time (all threads) over `reps` rounds, the
    functions interleaved within a round (drift hits all), each call after `flush` (untimed). On a machine
    shared past its cores the wall time of a call longer than a scheduler slice counts the slices other
    processes took; the CPU time does not."""
    times = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            flush()
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return ({name: float(np.median(t)) * 1e6 for name, t in times.items()},
            {name: float(np.median(t)) * 1e6 for name, t in cpu.items()})


_HELPER = None


def _sum_on_two_threads(words):
    """words summed as two halves, one on a helper thread kept between calls (a thread started per call
    cost more than the sum's difference), one on this (NumPy's reduction releases the GIL)."""
    global _HELPER
    if _HELPER is None:
        import concurrent.futures
        _HELPER = concurrent.futures.ThreadPoolExecutor(1)
    h = words.size // 2
    other = _HELPER.submit(words[h:].sum)
    return words[:h].sum() + other.result()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--warm", action="store_true",
                    help="no cache flush before each call (the peers then read what the call before left in cache)")
    args = ap.parse_args(argv)
    import ml_dtypes
    import torch
    rng = np.random.default_rng(0)
    b, hq, hkv, d, sk = 1, 32, 8, 128, args.keys
    llc = _llc_bytes()
    # the call before each timed one is a hipsched CPU op over three buffers of the LLC's size (two read,
    # one written), as in a decode step, where the op before attention ran on the same thread team and
    # K and V were last read a step ago: the caches hold none of K and V, and the team is awake. A NumPy
    # flush instead left the team asleep for its 3 ms, and on this VM waking it cost more than the op.
    ea, eb, ec = (np.full(llc // 4, 0.5, np.float32) for _ in range(3))
    flush = (lambda: None) if args.warm else (lambda: hs.silu_mul(ea, eb, out=ec, backend="cpu"))
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
            "sum2": lambda: _sum_on_two_threads(kvf32),
            "copy": lambda: np.copyto(dst, kvf),
        }
        for fn in fns.values():
            fn()
        t, c = _median_us(fns, args.reps, flush)
        sdpa = {"torch": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)}
        sdpa["torch"]()
        t.update(_median_us(sdpa, args.reps, flush)[0])
        mib = kvf.nbytes / 2 ** 20
        rows.append((name, mib, t["op"], t["sum"], t["sum2"], t["copy"], t["torch"], c["op"], c["sum"]))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"GQA decode attention: batch {b}, {hq} query / {hkv} KV heads, 1 query x {sk} keys, head_dim {d} "
             f"(machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
             f"simd={hs.cpu_features()['simd']}, HIPSCHED_NUM_THREADS={os.environ.get('HIPSCHED_NUM_THREADS', 'unset')}, "
             f"load average {load:.0f} at the end, median of {args.reps}, "
             f"{'warm: no flush between calls' if args.warm else f'each call after a hipsched silu_mul over 3 x {llc >> 20} MiB'})", "",
             "| dtype | K+V MiB | hipsched us | sum 1 thread us | sum 2 threads us | NumPy copy us | torch SDPA us | "
             "**op / read** | op / copy | op GB/s | op CPU us | sum CPU us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, mib, op, s, s2, c, tt, cop, csum in rows:
        lines.append(f"| {name} | {mib:.1f} | {op:.0f} | {s:.0f} | {s2:.0f} | {c:.0f} | {tt:.0f} | "
                     f"**{op / min(s, s2):.2f}** | {op / c:.2f} | {mib * 2 ** 20 / op / 1e3:.1f} | {cop:.0f} | {csum:.0f} |")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "decode_attention.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
