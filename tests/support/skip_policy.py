"""A pytest plugin: under HIPSCHED_REQUIRE_TOOLS, a skip that says something is not installed fails.

CI installs every tool and test-extra package the tests use, so there such a skip hides tests that
never ran. `requires.missing_tool` and `requires.need` already fail in that case; this catches a test
that skips its own way (`pytest.skip("... not installed")`, a skipif with such a reason). tests/conftest.py
loads it; `python -m pytest -p skip_policy` loads it elsewhere."""
import pytest

from requires import reads_as_missing_install, tools_required


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and tools_required() and isinstance(rep.longrepr, tuple):
        reason = str(rep.longrepr[2])
        if reads_as_missing_install(reason):
            rep.outcome = "failed"
            rep.longrepr = (f"skipped for a missing install while HIPSCHED_REQUIRE_TOOLS is set "
                            f"(CI installs every tool and test-extra package): {reason}")
