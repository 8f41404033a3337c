"""Shared fixtures. The SIMD level is chosen once per process (HIPSCHED_CPU_FEATURES), so the scalar
path is covered by cpu/test_simd_paths.py, which reruns the CPU correctness tests in a subprocess with
the scalar path forced; support/simd_features.run_with_features does the same for a snippet."""
import os
import sys

import numpy as np
import pytest
from hypothesis import settings

# Shared helpers (fake GPU, kernel emulator, fake CUDA driver, telemetry logs, Dask cluster...) live in
# tests/support and are imported as top-level modules (`from fake_gpu import FakeGpuBackend`).
SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

from gpu_presence import gpu_present  # noqa: E402  (tests/support, on the path from here on)
from requires import need  # noqa: E402
# CI's rule that a skip for a missing install fails (a hook: pytest finds it in this module's namespace)
from skip_policy import pytest_runtest_makereport  # noqa: E402,F401

# A test sees a GPU kernel compiled when its first call needs it: with background compiles on (the
# default), an automatic call on a cold kernel cache would run on the CPU while the kernel compiles, and
# every test would depend on the compiler's speed. tests/gpu/emulator/test_background_compile.py turns
# them on. (setdefault: a run may still ask for them with HIPSCHED_BACKGROUND_COMPILE=1.)
os.environ.setdefault("HIPSCHED_BACKGROUND_COMPILE", "0")

# CI runs the same examples every time (a red build must be reproducible); local runs explore new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(scope="module")
def gpu():
    """The real GPU backend, for tests marked `gpu` (skipped where no device answers)."""
    from hipsched.backends.gpu import create_gpu_backend
    be = create_gpu_backend()
    if not be.available:
        pytest.skip(f"no GPU: {be.unavailable_reason}")
    yield be
    be.close()


def pytest_collection_modifyitems(config, items):
    # the `gpu` marker, not the keyword: a test's keywords also hold its folder's name (tests/gpu/...)
    if any(item.get_closest_marker("gpu") for item in items) and not gpu_present():
        skip = pytest.mark.skip(reason="no GPU on this machine")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


# distributed's Nanny writes its workers' environment (distributed.nanny.pre-spawn-environ) into the
# environment of the process that starts a LocalCluster, for good: OMP_NUM_THREADS=1 there made every
# later subprocess of the session (fork-then-exec, the scalar-path reruns) run its kernels on one thread.
_NANNY_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_",
               "PYTHONHASHSEED", "__DASK_PARENT_PID")
_ENV_AT_START = {k: os.environ.get(k) for k in _NANNY_KEYS}


def _restore_nanny_environ():
    for k, v in _ENV_AT_START.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _no_environment_left_by_dask():
    yield
    _restore_nanny_environ()


@pytest.fixture(scope="session")
def dask_client():
    """One distributed.LocalCluster for the tests/dask/test_dask_*.py modules: 2 worker processes (spawned, as
    LocalCluster does by default) with 1 thread each, started once because a start takes seconds."""
    need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
    distributed = need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
    from dask_support import start_cluster
    cluster, client = start_cluster(distributed)
    _restore_nanny_environ()
    yield client
    client.close()
    cluster.close()
