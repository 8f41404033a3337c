"""hipsched COMMAND (the console script; also python -m hipsched COMMAND): each command lives in
hipsched/cli/<command>.py and provides `add_arguments(parser)` and `run(args) -> int`, so commands load
only what they use."""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from .errors import BuildMissingError

COMMANDS = {
    "info": "CPU features, GPU runtimes tried and why, devices, kernel cache",
    "demo": "run a realistic mixed workload with telemetry and print the report",
    "calibrate": "measure every op on both backends over a size sweep and save the model",
    "bench": "run the benchmarks in bench/ and print their tables",
    "monitor": "follow or summarise a telemetry log",
    "analyze": "analyse telemetry logs: tables, crossovers, accuracy, traces, plots",
    "compile": "compile every GPU kernel for a target ahead of time (no GPU needed)",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hipsched", description="hipsched command line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(prog=f"hipsched {name}")
        try:
            mod = importlib.import_module(f"hipsched.cli.{name}")
        except ImportError as e:  # a command whose module is missing says so instead of breaking the others
            p.set_defaults(_missing=str(e) if isinstance(e, BuildMissingError) else f"unavailable ({e})")
            continue
        mod.add_arguments(p)
        modules[name] = mod
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"hipsched {args.command}: {args._missing}", file=sys.stderr)
        return 2
    return _run(modules[args.command], args)


def run_command(name: str, argv, prog: str) -> int:
    """One command as a program of its own (tools/analyze.py): its usage line and messages say `prog`."""
    parser = argparse.ArgumentParser(prog=prog, description=COMMANDS[name])
    mod = importlib.import_module(f"hipsched.cli.{name}")
    mod.add_arguments(parser)
    parser.set_defaults(prog=prog)
    return _run(mod, parser.parse_args(argv))


def _run(mod, args) -> int:
    try:
        rc = int(mod.run(args) or 0)
        sys.stdout.flush()   # inside the try: a reader gone by now fails this flush, not the one at exit
        return rc
    except BuildMissingError as e:   # an unbuilt checkout: the one line that says what to do, no traceback
        print(f"{args.prog}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly, as a Unix tool does. Python would otherwise print a
        # second traceback when it flushes stdout at exit, so stdout is pointed at /dev/null first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + int(getattr(signal, "SIGPIPE", 13))


if __name__ == "__main__":
    sys.exit(main())
