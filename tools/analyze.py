#!/usr/bin/env python3
"""tools/analyze.py LOG... [--trace out.json] [--plot DIR] [--json]: offline analysis of hipsched
telemetry logs. A thin wrapper: the same as `python -m hipsched analyze` (hipsched/telemetry/analysis.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout too

from hipsched.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["analyze", *sys.argv[1:]]))
