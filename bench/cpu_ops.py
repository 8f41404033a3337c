"""CPU engine benchmark: every op against the library a user would otherwise call, same run.
Usage: python bench/cpu_ops.py [family ...] [--match TEXT ...]   (families: elementwise similarity quant
attention graph; --match keeps the rows whose "op shape" contains one of the TEXTs, e.g. --match bf16)
Each family's cases live in bench/cases_<family>.py as `cases() -> list[Case]`. The title says whether
bfloat16 x bfloat16 (the bf16 matmul and attention rows, goal >= 1x torch) ran on AVX512_BF16's vdpbf16ps
("bf16_dot"); HIPSCHED_CPU_FEATURES=avx512 gives the widening path on the same CPU, for a before/after."""
import importlib
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import CPU_SETTLE_S, run_cases  # noqa: E402

FAMILIES = ["elementwise", "similarity", "quant", "attention", "graph"]


def main(argv):
    import hipsched
    match, fams = [], []
    it = iter(argv)
    for a in it:
        if a == "--match":
            match.append(next(it))
        else:
            fams.append(a)
    cases = []
    for fam in fams or FAMILIES:
        mod = importlib.import_module(f"cases_{fam}")
        cases += mod.cases()
    if match:
        cases = [c for c in cases if any(t in f"{c.op} {c.shape}" for t in match)]
    feats = hipsched.cpu_features()
    title = (f"hipsched CPU ops ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"simd={feats['simd']}, bf16_dot={feats.get('bf16_dot', False)}, threads={feats['threads']}, "
             f"OMP_PROC_BIND={os.environ.get('OMP_PROC_BIND', 'unset')})")
    run_cases(cases, title, "cpu_ops.md", settle=CPU_SETTLE_S)


if __name__ == "__main__":
    main(sys.argv[1:])
