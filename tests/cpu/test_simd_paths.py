"""Every SIMD level the CPU has below the one a plain run uses: rerun every tests/cpu/test_cpu_*.py in a
fresh interpreter with HIPSCHED_CPU_FEATURES=<level> (the level is fixed once per process). On an
AVX2 machine that is the scalar level; on an AVX-512 one, AVX2 and scalar. One interpreter runs every
family per level, because starting one (pytest, NumPy, PyTorch, the extensions) cost more than most
families' tests; each family still passes or fails as its own test here, from that run's JUnit
report. The property tests read HIPSCHED_CPU_FEATURES to run fewer examples on the scalar level: they
already ran on the default path, and that rerun must stay cheap.
On a CPU with AVX512_BF16 a plain run multiplies bfloat16 by bfloat16 on vdpbf16ps (matmul, attention's
Q.K^T: cpu_features()["bf16_dot"]); the families that have such kernels are rerun at
HIPSCHED_CPU_FEATURES=avx512 too, the same level without it, so their widening bfloat16 path stays
tested on that CPU."""
import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import hipsched

HERE = os.path.dirname(os.path.abspath(__file__))
CPU_TESTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "test_cpu_*.py")))
LEVELS = ("scalar", "avx2", "avx512")   # lowest first
DETECTED = hipsched.cpu_features()["detected"]
BELOW = LEVELS[:LEVELS.index(DETECTED)] if DETECTED in LEVELS else ("scalar",)
BF16_DOT_TESTS = ("test_cpu_attention.py", "test_cpu_similarity.py")  # families with vdpbf16ps kernels
assert set(BF16_DOT_TESTS) <= set(CPU_TESTS)
BF16_DOT = hipsched.cpu_features()["bf16_dot"]


def test_scalar_path_is_selectable():
    from simd_features import run_with_features
    out = run_with_features("import hipsched; f = hipsched.cpu_features(); print(f['simd'], f['detected'])")
    simd, detected = out.split()
    assert simd == "scalar" and detected in LEVELS


_runs: dict = {}


@pytest.fixture(scope="module")
def level_run(tmp_path_factory):
    """(level, files) -> (returncode, output, {file: [(test, outcome, message)]}) of those families (all
    of them by default) run at that level."""
    def run(level, files=tuple(CPU_TESTS)):
        if (level, files) not in _runs:
            _runs[level, files] = _run_families(tmp_path_factory, level, files)
        return _runs[level, files]
    return run


def _run_families(tmp_path_factory, level, files):
    report = tmp_path_factory.mktemp(level) / "report.xml"
    env = dict(os.environ, HIPSCHED_CPU_FEATURES=level)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                        f"--junitxml={report}",
                        *(os.path.join(HERE, f) for f in files)],
                       env=env, capture_output=True, text=True, timeout=1800, cwd=os.path.dirname(os.path.dirname(HERE)))
    cases = {}
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            # classname is the dotted module path (tests.cpu.test_cpu_norm), plus the class for a method;
            # a module that failed to import has no classname and its dotted path as the name
            parts = (case.get("classname") or case.get("name", "")).split(".")
            family = next((f for f in CPU_TESTS if f[:-len(".py")] in parts), None)
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome, message = tag, (el.get("message") or "") + "\n" + (el.text or "")
                    break
            cases.setdefault(family, []).append((case.get("name"), outcome, message))
    return r.returncode, r.stdout + r.stderr, cases


@pytest.mark.parametrize("level", BELOW)
@pytest.mark.parametrize("test_file", CPU_TESTS)
def test_cpu_family_at_lower_level(level_run, level, test_file):
    _check_family(level_run(level), level, test_file)


@pytest.mark.skipif(not BF16_DOT, reason="no vdpbf16ps kernels run here (no AVX512_BF16, or a lower level asked)")
@pytest.mark.parametrize("test_file", BF16_DOT_TESTS)
def test_bf16_family_without_avx512_bf16(level_run, test_file):
    _check_family(level_run("avx512", BF16_DOT_TESTS), "avx512", test_file)


def _check_family(run, level, test_file):
    returncode, output, cases = run
    mine = cases.get(test_file, [])
    # no report at all (the interpreter died), or none of this family's tests in it: the run's output says why
    assert mine, f"{test_file}: no results at the {level} level (pytest exit {returncode}):\n{output[-6000:]}"
    bad = [(name, outcome, message) for name, outcome, message in mine if outcome in ("failure", "error")]
    assert not bad, f"{test_file} failed at the {level} level:\n" + "\n".join(
        f"{name} ({outcome}): {message[-3000:]}" for name, outcome, message in bad)
    # the run as a whole must have ended normally (1: failures, reported per family above)
    assert returncode in (0, 1), f"pytest exit {returncode} at the {level} level:\n{output[-6000:]}"
    if all(outcome == "skipped" for _, outcome, _ in mine):  # as the family itself decided (test_cpu_levels)
        pytest.skip(f"{test_file}: every test skipped at the {level} level: {mine[0][2].strip()[:200]}")
