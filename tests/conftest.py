"""Shared fixtures. The SIMD level is chosen once per process (HIPSCHED_CPU_FEATURES), so the scalar
path is covered by test_simd_paths.py, which reruns the CPU correctness tests in a subprocess with the
scalar path forced; run_with_features does the same for a snippet."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import settings

# CI runs the same examples every time (a red build must be reproducible); local runs explore new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def run_with_features(code: str, features: str = "scalar", timeout: int = 600) -> str:
    """Run Python `code` in a fresh interpreter with HIPSCHED_CPU_FEATURES set; returns stdout.
    The SIMD level is chosen once per process, so the scalar path needs its own process."""
    env = dict(os.environ, HIPSCHED_CPU_FEATURES=features)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"subprocess failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


@pytest.fixture(scope="module")
def gpu():
    """The real GPU backend, for tests marked `gpu` (skipped where no device answers)."""
    from hipsched.backends.gpu import create_gpu_backend
    be = create_gpu_backend()
    if not be.available:
        pytest.skip(f"no GPU: {be.unavailable_reason}")
    yield be
    be.close()


def _gpu_present() -> bool:
    try:
        from hipsched.gpu import detect
        return detect.gpu_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _gpu_present():
        skip = pytest.mark.skip(reason="no GPU on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def dask_client():
    """One distributed.LocalCluster for the tests/test_dask_*.py modules: 2 worker processes (spawned, as
    LocalCluster does by default) with 1 thread each, started once because a start takes seconds."""
    pytest.importorskip("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
    distributed = pytest.importorskip("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
    from dask_support import start_cluster
    cluster, client = start_cluster(distributed)
    yield client
    client.close()
    cluster.close()
