"""tests/support/requires: a package of the `test` extra that does not import fails the test that
needs it (CI must not pass on skips); a package outside the extra is skipped. A tool CI installs (g++
for the kernel emulator, a C compiler, hiprtc, llvm-objdump) fails the tests that need it where
HIPSCHED_REQUIRE_TOOLS is set, and skip_policy fails any skip that reads like a missing install there."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from requires import extra_modules, missing_tool, need, reads_as_missing_install


def test_the_extra_is_read_from_pyproject():
    assert {"torch", "gguf", "ml_dtypes", "scipy", "faiss", "dask", "distributed", "jsonschema",
            "hypothesis", "hip"} <= extra_modules()
    assert not {"cupy", "matplotlib"} & extra_modules()


def test_a_test_extra_package_that_does_not_import_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)   # `import gguf` raises ImportError
    with pytest.raises(pytest.fail.Exception, match="gguf is in the `test` extra"):
        need("gguf")
    monkeypatch.setitem(sys.modules, "scipy.special", None)
    with pytest.raises(pytest.fail.Exception):
        need("scipy.special", reason="SciPy's softmax is the reference")


def test_a_package_outside_the_extra_is_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(pytest.skip.Exception):
        need("cupy")


def test_an_importable_package_is_returned():
    import numpy
    assert need("numpy") is numpy and need("scipy.special").__name__ == "scipy.special"


# --- tools: under HIPSCHED_REQUIRE_TOOLS (CI), what would skip for a missing install fails instead ---

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"


def _pytest(args, cwd, strict, path_prefix=None):
    env = {k: v for k, v in os.environ.items() if k != "HIPSCHED_REQUIRE_TOOLS"}
    if strict:
        env["HIPSCHED_REQUIRE_TOOLS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT), env.get("PYTHONPATH", "")])
    if path_prefix:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_skip_for_a_missing_install_fails_where_tools_are_required(tmp_path):
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n"
        "def test_tool():\n    pytest.skip('frobnicator not installed (apt-get install frob)')\n"
        "@pytest.mark.skipif(True, reason='needs gcc to build it')\ndef test_marker():\n    pass\n"
        "def test_hardware():\n    pytest.skip('no GPU on this machine')\n")
    relaxed = _pytest(["-p", "skip_policy", "test_skips.py"], tmp_path, strict=False)
    assert relaxed.returncode == 0 and "3 skipped" in relaxed.stdout, relaxed.stdout
    strict = _pytest(["-p", "skip_policy", "test_skips.py"], tmp_path, strict=True)
    # the two missing installs fail; a missing GPU is the machine, not the install
    assert strict.returncode == 1, strict.stdout
    bad = "".join(l for l in strict.stdout.splitlines() if l.startswith(("FAILED", "ERROR")))  # a setup skip: ERROR
    assert "test_tool" in bad and "test_marker" in bad and "test_hardware" not in bad, strict.stdout


def test_only_the_optional_packages_may_be_missing_where_tools_are_required():
    assert reads_as_missing_install("could not import 'faiss': No module named 'faiss'")
    assert not reads_as_missing_install("could not import 'cupy': No module named 'cupy'")
    assert not reads_as_missing_install("could not import 'matplotlib': No module named 'matplotlib'")
    assert not reads_as_missing_install("no GPU: no device")


def test_missing_tool_skips_or_fails(monkeypatch):
    monkeypatch.delenv("HIPSCHED_REQUIRE_TOOLS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="frob is missing"):
        missing_tool("frob", "apt-get install frob")
    monkeypatch.setenv("HIPSCHED_REQUIRE_TOOLS", "1")
    with pytest.raises(pytest.fail.Exception, match="frob is missing.*HIPSCHED_REQUIRE_TOOLS"):
        missing_tool("frob", "apt-get install frob")


def test_the_kernel_emulator_without_a_working_gxx_fails_where_tools_are_required(tmp_path):
    """Every emulator module is gated on gpu_emulator.available(): without a C++20 g++ they skip on a
    developer's machine, and under HIPSCHED_REQUIRE_TOOLS the run fails (a g++ that cannot compile
    C++20 counts as none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gxx = bin_dir / "g++"
    gxx.write_text("#!/bin/sh\necho 'g++: error: unrecognized command-line option -std=c++20' >&2\nexit 1\n")
    gxx.chmod(0o755)
    target = "tests/gpu/emulator/test_prelude_conversions.py"
    relaxed = _pytest([target], ROOT, strict=False, path_prefix=bin_dir)
    assert relaxed.returncode == 0 and "skipped" in relaxed.stdout and " passed" not in relaxed.stdout, relaxed.stdout
    strict = _pytest([target], ROOT, strict=True, path_prefix=bin_dir)
    assert strict.returncode not in (0, 5), strict.stdout
    assert "needs g++ with C++20" in strict.stdout + strict.stderr


_OWN_IMPORT_GUARD = re.compile(r"\bpytest\.importorskip\(|^\s*except\s*\(?\s*(ImportError|ModuleNotFoundError)")


def test_tests_take_optional_imports_through_requires_only():
    """pytest.importorskip, or an ImportError caught in a test, turns a broken install of a test-extra
    package into silent skips; requires.need fails for those instead."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == SUPPORT / "requires.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _OWN_IMPORT_GUARD.search(code):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "use requires.need (or missing_tool for a tool):\n" + "\n".join(offenders)


def test_ci_requires_the_tools_it_installs():
    """.ci/run installs g++ (the kernel emulator) and sets HIPSCHED_REQUIRE_TOOLS before the tests run:
    without either, the emulator's some 900 tests could skip and CI still pass."""
    ci = (ROOT / ".ci" / "run").read_text()
    tests_start = ci.index('step "test command')
    assert "missing+=(g++)" in ci[:tests_start]
    assert "export HIPSCHED_REQUIRE_TOOLS=1" in ci[:tests_start]


def imported_test_modules(source: str, test_modules: set[str]) -> list[str]:
    """The test modules (names in `test_modules`) that `source` imports: `import test_x`, `from test_x
    import ...`, `from pkg import test_x` and `importlib.import_module("test_x")`. A test function of the
    same pattern imported from a support module (`from kernel_cases import test_softmax`) is no module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if set(a.name.split(".")) & test_modules]
        elif isinstance(node, ast.ImportFrom):
            if set((node.module or "").split(".")) & test_modules:
                found.append(node.module)
            found += [a.name for a in node.names if a.name in test_modules]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                    and set(node.args[0].value.split(".")) & test_modules:
                found.append(node.args[0].value)
    return found


def test_no_test_module_imports_another():
    """Cases two test modules share live in tests/support/ (op_cases.py, kernel_cases.py): a test module
    imported by another is collected twice, runs only with the other's fixtures by accident, and ties
    the two modules' names and paths together (test_gpu_ops.py had put tests/gpu/emulator on sys.path)."""
    paths = sorted((ROOT / "tests").rglob("*.py"))
    test_modules = {p.stem for p in paths if p.stem.startswith("test_")}
    offenders = [f"{p.relative_to(ROOT)}: {name}" for p in paths
                 for name in imported_test_modules(p.read_text(), test_modules)]
    assert not offenders, "move what both need into tests/support/:\n" + "\n".join(offenders)


def test_the_test_module_import_check_sees_each_form():
    mods = {"test_gpu_kernels_emulated", "test_layers"}
    assert imported_test_modules("from test_gpu_kernels_emulated import test_cosine\n", mods) == \
        ["test_gpu_kernels_emulated"]
    assert imported_test_modules("import test_layers as t\nfrom cli import test_layers\n", mods) == \
        ["test_layers", "test_layers"]
    assert imported_test_modules("importlib.import_module('test_layers')\n", mods) == ["test_layers"]
    assert imported_test_modules("from kernel_cases import test_cosine, test_softmax\nimport test_helpers\n", mods) == []
