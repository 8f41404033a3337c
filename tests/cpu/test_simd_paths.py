"""The portable (scalar) kernels: rerun every tests/cpu/test_cpu_*.py in a fresh interpreter with
HIPSCHED_CPU_FEATURES=scalar (the SIMD level is fixed once per process), one subprocess per file so a
failure names its family. The property tests read HIPSCHED_CPU_FEATURES to run fewer examples there:
they already ran on the default path, and this rerun must stay cheap."""
import glob
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CPU_TESTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "test_cpu_*.py")))


def test_scalar_path_is_selectable():
    from simd_features import run_with_features
    out = run_with_features("import hipsched; f = hipsched.cpu_features(); print(f['simd'], f['detected'])")
    simd, detected = out.split()
    assert simd == "scalar" and detected in ("avx2", "scalar")


@pytest.mark.parametrize("test_file", CPU_TESTS)
def test_cpu_family_on_scalar_path(test_file):
    env = dict(os.environ, HIPSCHED_CPU_FEATURES="scalar")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", os.path.join(HERE, test_file)],
                       env=env, capture_output=True, text=True, timeout=900, cwd=os.path.dirname(os.path.dirname(HERE)))
    assert r.returncode == 0, f"{test_file} failed on the scalar path:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
