"""Review: CLI commands on bad arguments print a clear error and a non-zero status."""
import pytest

from hipsched.__main__ import main


def test_compile_into_an_unwritable_cache_dir_fails(tmp_path, capsys):
    from hipsched.errors import GpuError
    from hipsched.gpu.compilers import get_compiler
    try:
        c = get_compiler("gfx90a")
        if not c.supports("gfx90a"):
            pytest.skip("no compiler for gfx90a")
    except GpuError:
        pytest.skip("no compiler for gfx90a")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["compile", "--arch", "gfx90a", "--cache-dir", str(blocker / "cache")]) == 1
    assert "cannot write the kernel cache" in capsys.readouterr().err


def test_bench_with_a_wrong_bench_dir_fails(tmp_path, capsys):
    assert main(["bench", "--bench-dir", str(tmp_path / "nope"), "telemetry"]) == 2
    assert "bench" in capsys.readouterr().err
