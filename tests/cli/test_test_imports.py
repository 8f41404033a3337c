"""tests/support/requires.need: a package of the `test` extra that does not import fails the test that
needs it (CI must not pass on skips); a package outside the extra is skipped."""
import sys

import pytest
from requires import need, extra_modules


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
