"""Review: the demo when the cache dir or the --log path cannot be written (workload stubbed out)."""
import os

from hipsched.__main__ import main
from hipsched.cli import demo


class _Tiny:
    def __init__(self, ex, quick, seed):
        import numpy as np
        self.ex, self.checks = ex, []
        self.x = np.ones(64, np.float32)

    def search_steps(self):
        yield "add", lambda: self.ex.add(self.x, self.x)

    def transformer_steps(self):
        return iter(())

    def graph_steps(self):
        return iter(())


def test_default_log_falls_back_when_cache_dir_is_not_writable(tmp_path, monkeypatch):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    log = demo._default_log()
    assert log.startswith(str(tmp_path / "tmp"))


def test_demo_with_unwritable_log_path_does_not_crash(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["demo", "--quick", "--no-progress", "--log", str(blocker / "run.jsonl")]) == 0
    assert "could not be written" in capsys.readouterr().out


def test_demo_stubbed_workload_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    log = tmp_path / "run.jsonl"
    assert main(["demo", "--quick", "--no-progress", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "Per op and backend" in out and "add" in out


def test_demo_negative_seed_is_an_argument_error(monkeypatch, capsys):
    import pytest
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    with pytest.raises(SystemExit) as e:
        main(["demo", "--quick", "--seed", "-1"])
    assert e.value.code == 2 and "seed" in capsys.readouterr().err


def test_demo_writes_where_the_environment_says(tmp_path, monkeypatch, capsys):
    # HIPSCHED_TELEMETRY was ignored: the demo always made its own file under the cache dir
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    env_log = tmp_path / "env.jsonl"
    monkeypatch.setenv("HIPSCHED_TELEMETRY", str(env_log))
    assert main(["demo", "--quick", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert env_log.is_file() and env_log.stat().st_size > 0
    assert f"telemetry -> {env_log}" in out


def test_demo_log_argument_wins_over_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_Workload", _Tiny)
    env_log, arg_log = tmp_path / "env.jsonl", tmp_path / "arg.jsonl"
    monkeypatch.setenv("HIPSCHED_TELEMETRY", str(env_log))
    assert main(["demo", "--quick", "--no-progress", "--log", str(arg_log)]) == 0
    assert arg_log.is_file() and not env_log.exists()
    assert f"telemetry -> {arg_log}" in capsys.readouterr().out
