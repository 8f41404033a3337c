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


def test_analyze_rejects_a_zero_bandwidth(tmp_path, capsys):
    import json
    p = tmp_path / "a.jsonl"
    rec = {"v": 1, "ts": "2026-11-21T12:00:00.000100Z", "run": "r", "seq": 0, "host": "h", "device": "d",
           "op": "add", "backend": "gpu", "reason": "cost_model", "size": 1024, "dtype": "float32", "bytes": 4096,
           "duration_us": 10.5, "predicted_us": {"cpu": 1.0, "gpu": None}, "stream": None, "phase": None,
           "tags": {}, "fallback": None}
    p.write_text(json.dumps(rec) + "\n")
    for bad in ("0", "-3", "nan"):
        with pytest.raises(SystemExit) as e:
            main(["analyze", str(p), "--pcie-gbps", bad])
        assert e.value.code == 2
    assert "positive" in capsys.readouterr().err
