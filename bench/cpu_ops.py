"""CPU engine benchmark: every op against the library a user would otherwise call, same run.
Usage: python bench/cpu_ops.py [family ...]   (families: elementwise similarity quant attention graph)
Each family's cases live in bench/cases_<family>.py as `cases() -> list[Case]`."""
import importlib
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import CPU_SETTLE_S, run_cases  # noqa: E402

FAMILIES = ["elementwise", "similarity", "quant", "attention", "graph"]


def main(argv):
    import hipsched
    fams = argv or FAMILIES
    cases = []
    for fam in fams:
        mod = importlib.import_module(f"cases_{fam}")
        cases += mod.cases()
    feats = hipsched.cpu_features()
    title = (f"hipsched CPU ops ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"simd={feats['simd']}, threads={feats['threads']})")
    run_cases(cases, title, "cpu_ops.md", settle=CPU_SETTLE_S)


if __name__ == "__main__":
    main(sys.argv[1:])
