"""Imports of optional packages for the tests. A package of pyproject's `test` extra is installed by
the README's test command (and so by CI): a test needing it must fail when it does not import, never
skip, or a broken environment would turn some 870 tests into silent skips. Only what the extra does not
install (CuPy, matplotlib: truly optional) is skipped when absent. `need` replaces pytest.importorskip."""
from __future__ import annotations

import importlib
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
