"""A search over a host corpus, by where the corpus lives: top_k of one query (and of 64) against a
500,000 x 384 float32 corpus (768 MB), the case that showed the resident cache too small on an H100
(88 ms a call, every call uploading the corpus, against 7.5 ms on the CPU and 0.54 ms resident).

Rows: the CPU; the GPU on a writable corpus (uploaded on every call, by design: a write to it could not
be seen); the GPU on the same corpus read-only (kept implicitly); the GPU through `ex.resident(T)`, and
after a 1,000-row update; and what backend="auto" picks for the resident corpus. Each figure is the
median of `--repeat` calls after a warm-up call, with the default resident budget unless
HIPSCHED_RESIDENT_BYTES says otherwise; the budget and where it comes from are printed first.

Usage: python bench/resident_corpus.py [--rows 500000] [--dims 384] [--repeat 20]
Without a GPU only the CPU rows are printed."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import checkout  # noqa: E402,F401  (a checkout built in place is what is measured)
import hipsched as hs


def timed(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--dims", type=int, default=384)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    T = rng.standard_normal((args.rows, args.dims), dtype=np.float32)
    q = rng.standard_normal(args.dims, dtype=np.float32)
    Q = rng.standard_normal((64, args.dims), dtype=np.float32)
    with hs.Executor(persist_model=False) as ex:
        gpu = ex._gpu
        summary = gpu.resident_summary() if getattr(gpu, "available", False) else None
        print(f"corpus {args.rows} x {args.dims} float32 = {T.nbytes / 1e6:.0f} MB; device: "
              f"{getattr(gpu, 'device_name', None) or 'none'}")
        if summary:
            print(f"resident budget: {summary['budget_bytes'] / 2**30:.1f} GiB ({summary['budget_source']})")
        rows = [("cpu", "1 query", timed(lambda: ex.top_k(q, T, 10, backend="cpu"), args.repeat)),
                ("cpu", "64 queries", timed(lambda: ex.top_k(Q, T, 10, backend="cpu"), max(3, args.repeat // 4)))]
        if summary:
            rows.append(("gpu, writable corpus (uploaded per call)", "1 query",
                         timed(lambda: ex.top_k(q, T, 10, backend="gpu"), max(3, args.repeat // 4))))
            T.flags.writeable = False
            rows.append(("gpu, read-only corpus (kept)", "1 query",
                         timed(lambda: ex.top_k(q, T, 10, backend="gpu"), args.repeat)))
            T.flags.writeable = True
            with ex.resident(T) as idx:
                rows.append(("gpu, ex.resident(T)", "1 query",
                             timed(lambda: ex.top_k(q, idx, 10, backend="gpu"), args.repeat)))
                rows.append(("gpu, ex.resident(T)", "64 queries",
                             timed(lambda: ex.top_k(Q, idx, 10, backend="gpu"), args.repeat)))
                n = min(1000, args.rows)
                changed = rng.choice(args.rows, n, replace=False)
                t = time.perf_counter()
                idx.update(changed, rng.standard_normal((n, args.dims), dtype=np.float32))
                rows.append((f"idx.update of {n:,} random rows", "", (time.perf_counter() - t) * 1e3))
                gi, _ = ex.top_k(q, idx, 10, backend="gpu")
                ci, _ = ex.top_k(q, idx, 10, backend="cpu")
                rows.append(("gpu after the update, same answer as cpu: " + str(bool((gi == ci).all())), "1 query",
                             timed(lambda: ex.top_k(q, idx, 10, backend="gpu"), args.repeat)))
                for _ in range(30):
                    ex.top_k(q, idx, 10)
                picks = [e["backend"] for e in ex.events[-10:]]
                last = ex.events[-1]
                print(f"auto on the resident corpus, last 10 calls: {picks.count('gpu')} gpu, "
                      f"{picks.count('cpu')} cpu; last event resident={last.get('resident')}")
        width = max(len(r[0]) for r in rows)
        for name, what, ms in rows:
            print(f"  {name:<{width}}  {what:<10}  {ms:9.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
