"""Tests skipped for a missing tool or package: in CI (HIPSCHED_REQUIRE_TOOLS) they must fail instead.
The kernel emulator alone gates some 900 tests on g++ (issue 30, items 1 and 5)."""
from mutants.mutant import Mutant

MUTANTS = [
    Mutant(
        name="emulator-gate-skips-in-ci",
        why="without g++ every emulator module reported 'skipped' and pytest exited 0, in CI too",
        path="tests/support/gpu_emulator.py",
        find="if not _AVAILABLE[0] and requires.tools_required():",
        replace="if False:",
        kill=("tests/cli/test_test_imports.py::test_the_kernel_emulator_without_a_working_gxx_fails_where_tools_are_required",),
    ),
    Mutant(
        name="emulator-gate-any-gxx",
        why="a g++ on PATH that cannot compile C++20 counted as the emulator's compiler",
        path="tests/support/gpu_emulator.py",
        find="            ok = r.returncode == 0\n",
        replace="            ok = True\n",
        kill=("tests/cli/test_test_imports.py::test_the_kernel_emulator_without_a_working_gxx_fails_where_tools_are_required",),
    ),
    Mutant(
        name="missing-install-skips-in-ci",
        why="a test skipping its own way for a missing install passed CI as a skip",
        path="tests/support/skip_policy.py",
        find='            rep.outcome = "failed"\n',
        replace="            pass\n",
        kill=("tests/cli/test_test_imports.py::test_a_skip_for_a_missing_install_fails_where_tools_are_required",),
    ),
    Mutant(
        name="missing-tool-always-skips",
        why="missing_tool skipped in CI as on a developer's machine",
        path="tests/support/requires.py",
        find="    if tools_required():\n        pytest.fail(",
        replace="    if False:\n        pytest.fail(",
        kill=("tests/cli/test_test_imports.py::test_missing_tool_skips_or_fails",),
    ),
    Mutant(
        name="ci-does-not-require-tools",
        why=".ci/run ran the tests without HIPSCHED_REQUIRE_TOOLS, so every gate could skip",
        path=".ci/run",
        find="export HIPSCHED_REQUIRE_TOOLS=1",
        replace="export HIPSCHED_REQUIRE_TOOLS=0",
        kill=("tests/cli/test_test_imports.py::test_ci_requires_the_tools_it_installs",),
    ),
    Mutant(
        name="jsonschema-importorskip",
        why="test_splitting took jsonschema (test extra) with importorskip: a broken install skipped it",
        path="tests/sched/test_splitting.py",
        find='    jsonschema = need("jsonschema")',
        replace='    jsonschema = pytest.importorskip("jsonschema")',
        kill=("tests/cli/test_test_imports.py::test_tests_take_optional_imports_through_requires_only",),
    ),
]
