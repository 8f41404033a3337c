"""Imported first by every benchmark: a checkout built in place is what is measured. Run as a script, a
benchmark has bench/ on its path, not the checkout, and an installed hipsched answered instead (on the
development machine an editable install of another worktree: a before/after run in a worktree measured
the other tree twice, with nothing to say so). bench/harness.py does the same for the benchmarks built on
it: the tests load it by path, without bench/ on sys.path, where this module could not be imported."""
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if glob.glob(os.path.join(ROOT, "hipsched", "cpu", "_features*.so")) and ROOT not in sys.path[:1]:
    sys.path.insert(0, ROOT)
