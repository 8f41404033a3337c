"""python -m hipsched bench [SUITE ...]: run the benchmark scripts in bench/ (a source checkout's;
they are not installed with the package) and print their tables."""
from __future__ import annotations

import os
import subprocess
import sys

SUITES = {
    "cpu": "cpu_ops.py",
    "gpu": "gpu_ops.py",
    "dispatch": "dispatch.py",
    "routing": "routing.py",
    "telemetry": "telemetry.py",
}


def add_arguments(p):
    p.add_argument("suites", nargs="*", choices=[*SUITES, "all"], default=["cpu"],
                   help="which benchmarks (default: cpu)")
    p.add_argument("--bench-dir", help="the bench/ folder (default: ./bench or the checkout's)")


def _bench_dir(explicit):
    if explicit:   # a folder named explicitly is used or refused, never silently replaced
        return explicit if os.path.isfile(os.path.join(explicit, "harness.py")) else None
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for d in (os.path.join(os.getcwd(), "bench"), os.path.join(here, "bench")):
        if d and os.path.isfile(os.path.join(d, "harness.py")):
            return d
    return None


def run(args) -> int:
    d = _bench_dir(args.bench_dir)
    if d is None:
        where = f"{args.bench_dir} is not a bench/ folder (no harness.py)" if args.bench_dir else \
            "no bench/ folder found (run from a source checkout or pass --bench-dir)"
        print(f"hipsched bench: {where}", file=sys.stderr)
        return 2
    suites = list(SUITES) if "all" in args.suites else args.suites
    rc = 0
    for s in suites:
        script = os.path.join(d, SUITES[s])
        if not os.path.isfile(script):
            print(f"hipsched bench: {script} is missing", file=sys.stderr)
            rc = 2
            continue
        rc = subprocess.call([sys.executable, script]) or rc
    return rc
