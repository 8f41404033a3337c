"""The real kernel compilers (hiprtc, NVRTC) as the tests that compile for a named target meet them:
skipped, with the reason, where the compiler for that target is not installed; and one kernel cache
directory per test module, so each source is compiled once per target per module."""
import pytest

from hipsched.errors import GpuError
from hipsched.gpu.compilers import get_compiler


def compiler_or_skip(arch):
    try:
        return get_compiler(arch)
    except GpuError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A fixture: import it into the test module (`from real_compilers import cache_dir`) to use it."""
    return tmp_path_factory.mktemp("kernel-cache")
