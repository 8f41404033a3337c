"""python -m hipsched calibrate [--ops add,softmax ...] [--dtypes float32,float16]: measure ops over a size sweep on every
backend present and save the learned model to the cache directory."""
from __future__ import annotations

import sys


def add_arguments(parser):
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP",
                        help="ops to calibrate (space or comma separated); default: all")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size and backend (median kept)")
    parser.add_argument("--max-seconds", type=float, default=2.0,
                        help="stop an op's sweep after a size whose CPU run takes longer than this")
    parser.add_argument("--dtypes", nargs="+", default=None, metavar="DTYPE",
                        help="float32, float16, bfloat16 (space or comma separated); default: float32")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    # deferred: __main__ imports every command, so this loads only when the command runs (compiled modules)
    from ..executor import Executor
    ops = [o for item in (args.ops or []) for o in item.split(",") if o] or None
    if args.repeats < 1:
        print("hipsched calibrate: --repeats must be >= 1", file=sys.stderr)
        return 2
    with Executor(persist_model=True) as ex:
        try:
            dtypes = tuple(d for item in (args.dtypes or ["float32"]) for d in item.split(",") if d)
            table = ex.calibrate(ops=ops, progress=not args.no_progress, repeats=args.repeats,
                                 max_seconds_per_op=args.max_seconds, dtypes=dtypes)
        except ValueError as e:
            print(f"hipsched calibrate: {e}", file=sys.stderr)
            return 2
        print(f"{'op':<24} {'dtype':<9} {'size':>12} {'cpu us':>12} {'gpu us':>12}")
        for name, rows in table.items():
            op, _, dtype = name.partition("[")
            dtype = dtype.rstrip("]") or "float32"
            for size, c, g in rows:
                cs = f"{c:12.1f}" if c is not None else f"{'-':>12}"
                gs = f"{g:12.1f}" if g is not None else f"{'-':>12}"
                print(f"{op:<24} {dtype:<9} {size:>12} {cs} {gs}")
        caps = ex.capabilities()
        if not caps.gpu_available:
            print("no GPU: only the CPU side was measured (" + "; ".join(caps.reasons) + ")")
        print(f"model saved: {ex.save_model()}")
    return 0
