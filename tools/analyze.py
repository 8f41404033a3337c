#!/usr/bin/env python3
"""tools/analyze.py LOG... [--trace out.json] [--plot DIR] [--json]: offline analysis of hipsched
telemetry logs. A thin wrapper: the same as `python -m hipsched analyze` (hipsched/telemetry/analysis.py)."""
import os
import sys

# This checkout's own analyzer: pure Python (hipsched.telemetry never loads the compiled modules), so it runs
# on a laptop with nothing built or installed, standard library only.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hipsched.__main__ import run_command  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_command("analyze", sys.argv[1:], prog=os.path.basename(sys.argv[0])))
