"""The CPU engine's tests call the public API (hipsched.add, hipsched.attention, ...), which runs on the
process's default executor. On a machine with a GPU that executor sends some calls to the device,
and two calls that a test compares bit for bit can then come from two engines (seen on an H100: eight
such tests differed in the last float32 bit). Here the default executor is a CPU-only one, so these
tests check the CPU kernels wherever they run. The GPU's agreement with the CPU is tests/gpu's concern."""
import pytest

import hipsched


@pytest.fixture(scope="session")
def _cpu_only_executor():
    ex = hipsched.Executor(force_cpu_mode=True, persist_model=False)
    yield ex
    ex.close()


@pytest.fixture(autouse=True)
def _default_executor_is_cpu_only(_cpu_only_executor, monkeypatch):
    monkeypatch.setattr(hipsched, "_default", _cpu_only_executor)
