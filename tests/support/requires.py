"""Imports of optional packages and tools for the tests. A package of pyproject's `test` extra is
installed by the README's test command (and so by CI): a test needing it must fail when it does not
import, never skip, or a broken environment would turn some 870 tests into silent skips. Only what the
extra does not install (CuPy, matplotlib: truly optional) is skipped when absent. `need` replaces
pytest.importorskip.

Tools are the same story one level down: g++ for the kernel emulator (about 900 tests), a C compiler
for the fake libcuda, hiprtc from Debian's libamdhip64-dev, llvm-objdump. A developer's machine may
lack one and skip what needs it; CI installs each, so there a missing tool is a broken run. With
HIPSCHED_REQUIRE_TOOLS=1 (.ci/run sets it) `missing_tool` fails instead of skipping, and the conftest
turns any skip that reads like a missing install into a failure, so a new test that skips its own way
cannot slip past."""
from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11: the test extra installs tomli
    import tomli as tomllib

_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# distributions whose import name is not their normalised name
_IMPORT_NAME = {"faiss-cpu": "faiss", "hip-python": "hip"}


def extra_modules() -> frozenset[str]:
    """Top-level import names of the packages the `test` extra installs."""
    with open(_PYPROJECT, "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    names = set()
    for req in extra:
        dist = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
        names.add(_IMPORT_NAME.get(dist, dist.replace("-", "_").replace(".", "_")))
    return frozenset(names)


_EXTRA = extra_modules()


def need(module: str, reason: str | None = None):
    """`module`, imported. One of the test extra's packages that fails to import fails the test (or the
    collection of a module that asks at import time) with the import error; any other is skipped."""
    if module.split(".")[0] not in _EXTRA:
        return pytest.importorskip(module, reason=reason)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is in the `test` extra (pyproject.toml) and must import here, not skip: "
                    f"{type(e).__name__}: {e}. Install it: pip install -e '.[test]'", pytrace=False)


def tools_required() -> bool:
    """Whether a tool the tests need must be there (CI), rather than its tests skipped."""
    return os.environ.get("HIPSCHED_REQUIRE_TOOLS", "") not in ("", "0")


def missing_tool(what: str, install: str, *, allow_module_level: bool = False):
    """Skip, saying what is missing and how to get it; fail instead where tools are required."""
    msg = f"{what} is missing ({install})"
    if tools_required():
        pytest.fail(f"{msg}; HIPSCHED_REQUIRE_TOOLS is set (CI installs it), so this fails instead of skipping",
                    pytrace=False)
    pytest.skip(msg, allow_module_level=allow_module_level)


# A skip reason that says something is not installed: under HIPSCHED_REQUIRE_TOOLS such a skip is a
# failure (tests/conftest.py), unless it names a package the test extra does not install.
_MISSING_INSTALL = re.compile(r"not installed|pip install|apt-get install|no C compiler|needs g\+\+|needs gcc|"
                              r"could not import|no llvm-objdump|no compiler for|not loadable", re.I)
OPTIONAL_PACKAGES = ("cupy", "matplotlib")


def reads_as_missing_install(reason: str) -> bool:
    if not _MISSING_INSTALL.search(reason):
        return False
    return not any(f"'{p}'" in reason or f"{p} " in reason.lower().split(":")[0] for p in OPTIONAL_PACKAGES)
