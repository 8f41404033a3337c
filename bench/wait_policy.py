"""CPU call times under OpenMP wait settings, each in its own process (libgomp reads them once, when it
loads): hipsched's default (OMP_WAIT_POLICY=PASSIVE: team threads sleep at once), a short spin before
sleeping (GOMP_SPINCOUNT=3000, about 0.1 ms), a longer one (10000), and the default on half the threads.
Forced-CPU calls 0.2 ms apart, as a program's calls come: add of 128K and 4M floats, top_k over 7 MB
and 38 MB corpora, a 64 MB matvec; mean, p50, p90 and max in us.

Usage: python bench/wait_policy.py [--calls N]
Writes bench/results/wait_policy.md."""
import argparse
import os
import platform
import subprocess
import sys

import checkout  # noqa: F401  (a checkout built in place is what is measured: the children get it first)

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r'''
import sys, time
import numpy as np
import hipsched as hs
rng = np.random.default_rng(0)
a1, a4 = rng.standard_normal(131072, dtype=np.float32), rng.standard_normal(1 << 22, dtype=np.float32)
t7, t38 = rng.standard_normal((2352, 768), dtype=np.float32), rng.standard_normal((12416, 768), dtype=np.float32)
q, W, x = rng.standard_normal(768, dtype=np.float32), rng.standard_normal((2048, 8192), dtype=np.float32), \
    rng.standard_normal(8192, dtype=np.float32)
cases = [("add 128K floats", lambda ex: ex.add(a1, a1)), ("add 4M floats", lambda ex: ex.add(a4, a4)),
         ("top_k over 7 MB", lambda ex: ex.top_k(q, t7, 10)), ("top_k over 38 MB", lambda ex: ex.top_k(q, t38, 10)),
         ("matvec 2048x8192", lambda ex: ex.matmul(W, x))]
with hs.Executor(persist_model=False, strategy="backend_only", backend="cpu", telemetry_enabled=False) as ex:
    for name, fn in cases:
        for _ in range(5):
            fn(ex)
        ts = []
        for _ in range(int(sys.argv[1])):
            t0 = time.perf_counter()
            fn(ex)
            ts.append((time.perf_counter() - t0) * 1e6)
            time.sleep(0.0002)
        ts = np.array(ts)
        print(f"{name}|{ts.mean():.0f}|{np.median(ts):.0f}|{np.percentile(ts, 90):.0f}|{ts.max():.0f}", flush=True)
'''


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=150)
    args = ap.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if checkout.ROOT in sys.path[:1]:
        base["PYTHONPATH"] = os.pathsep.join([checkout.ROOT] + [p for p in [base.get("PYTHONPATH")] if p])
    ncpu = os.cpu_count() or 1
    half = str(max(1, ncpu // 2))
    settings = [("hipsched default (PASSIVE)", {}),
                ("GOMP_SPINCOUNT=3000", {"GOMP_SPINCOUNT": "3000"}),
                ("GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}),
                (f"default, HIPSCHED_NUM_THREADS={half}", {"HIPSCHED_NUM_THREADS": half})]
    lines = [f"## CPU calls under OpenMP wait settings ({platform.machine()}, {ncpu} CPUs; {args.calls} calls each, "
             "0.2 ms apart, forced CPU; microseconds)", "", "| setting | call | mean | p50 | p90 | max |",
             "|---|---|---|---|---|---|"]
    for label, env in settings:
        r = subprocess.run([sys.executable, "-c", CHILD, str(args.calls)], env={**base, **env}, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
            lines.append(f"| {label} | failed: {why} | | | | |")
            continue
        for row in r.stdout.splitlines():
            lines.append(f"| {label} | " + " | ".join(row.split("|")) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "wait_policy.md"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
