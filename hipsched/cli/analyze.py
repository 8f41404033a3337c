"""python -m hipsched analyze [LOG...] [--trace out.json] [--plot DIR] [--json]: per op/backend tables,
speedup by size, crossovers, routing accuracy and regret, fallbacks and advice (telemetry/analysis.py)."""
from __future__ import annotations

import argparse
import json
import sys

from .logs import default_log


def _positive(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return v


def add_arguments(p):
    p.add_argument("logs", nargs="*", metavar="LOG", help="JSONL telemetry logs (rotated LOG.1, LOG.2 ... are "
                   "included); default: $HIPSCHED_TELEMETRY, else the last demo log")
    p.add_argument("--trace", metavar="OUT.json", help="write Chrome trace events (Perfetto opens them)")
    p.add_argument("--plot", metavar="DIR", help="write latency-vs-size PNGs per op (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    p.add_argument("--no-rotated", action="store_true", help="read only the named files, not their rotated siblings")
    p.add_argument("--min-samples", type=int, default=3, help="calls needed on each side of a size bucket (default 3)")
    p.add_argument("--tie-band", type=float, default=0.05,
                   help="relative difference under which both sides count as right (default 0.05)")
    p.add_argument("--pcie-gbps", type=_positive, default=25.0,
                   help="host-device bandwidth assumed for the copy-share estimate (default 25)")


def run(args) -> int:
    # deferred: __main__ imports every command, so this loads only when the command runs (monitor needs neither)
    from ..telemetry import analysis, report
    if not args.logs:
        log = default_log(args.prog)
        if log is None:
            return 2
        args.logs = [log]
    opts = dict(min_samples=args.min_samples, tie_band=args.tie_band, pcie_gbps=args.pcie_gbps)
    try:
        res = analysis.analyze(args.logs, trace=args.trace, rotated=not args.no_rotated, **opts)
    except OSError as e:
        print(f"{args.prog}: {e}", file=sys.stderr)
        return 2
    notes = []
    if args.trace:
        notes.append(f"trace written: {args.trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    if args.plot:
        from ..telemetry.plots import write_plots  # deferred: plots need matplotlib, optional and heavy
        try:
            notes += write_plots(res, args.plot)
        except OSError as e:
            print(f"{args.prog}: plots not written: {e}", file=sys.stderr)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        for n in notes:
            print(n, file=sys.stderr)
    else:
        print(report.render(res))
        for n in notes:
            print(n)
    return 0
