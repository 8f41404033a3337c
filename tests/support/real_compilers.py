"""The real kernel compilers (hiprtc, NVRTC) as the tests that compile for a named target meet them:
skipped, with the reason, where the compiler for that target is not installed; and one kernel cache
directory for the session, so each source is compiled once per target per run: the cache keys on the
compiler, its version, the target, the options and the source text, so a module finding another's entry
gets the code object it would have compiled (test_kernels_compile.py and test_launch_limits.py compile
the same sources for the same six targets)."""
import pytest

from hipsched.errors import GpuError
from hipsched.gpu.bindings.compilers import get_compiler
from requires import missing_tool


def compiler_or_skip(arch):
    try:
        return get_compiler(arch)
    except GpuError as e:
        missing_tool(f"the compiler for {arch} ({e})",
                     "pip install -e '.[test]' for NVRTC; Debian's libamdhip64-dev for hiprtc")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """A fixture: import it into the test module (`from real_compilers import cache_dir`) to use it. Each
    importing module holds its own copy of the fixture, so the directory is named, not made per call."""
    d = tmp_path_factory.getbasetemp() / "real-compilers-kernel-cache"
    d.mkdir(exist_ok=True)
    return d
