"""The benchmark tables' arithmetic (bench/harness.py verdicts, bench/roofline.py bounds): what a reader
of a GPU run's table trusts without re-deriving it."""
import importlib.util
import os
import re
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def _bench_module(name, as_name=None):
    """bench/<name>.py loaded by path: bench/ on sys.path would shadow packages (bench/distributed.py).
    The benchmarks' first import, bench/checkout.py, is loaded so too, under its own name."""
    if as_name is None and "checkout" not in sys.modules:
        _bench_module("checkout", as_name="checkout")
    spec = importlib.util.spec_from_file_location(as_name or f"hipsched_bench_{name}", os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


harness = _bench_module("harness")
roofline = _bench_module("roofline")


@pytest.mark.parametrize("ratio,goal,floor,text", [
    (0.80, 0.75, 0.6, ">= 0.75x (floor 0.6x) ok"),
    (0.65, 0.75, 0.6, ">= 0.75x (floor 0.6x) below goal"),
    (0.55, 0.75, 0.6, ">= 0.75x (floor 0.6x) MISSED"),
    (0.90, 0.92, None, ">= 0.92x MISSED"),
    (0.92, 0.92, None, ">= 0.92x ok"),
    (3.00, None, None, ""),
])
def test_verdict_against_goal_and_floor(ratio, goal, floor, text):
    assert harness.target_text(ratio, goal, floor) == text


def test_roofline_bounds():
    rows = {(r.op, r.shape): r for r in roofline.rows()}
    add = rows[("add", "256 MiB")]
    assert add.bytes == 3 * 256 * 2**20                       # two inputs read, one output written
    # 805 MB at 2992 GB/s
    assert add.bytes / (roofline.COPY_GBPS * 1e9) == pytest.approx(269.2e-6, rel=1e-3)
    attn = rows[("attention fp16", "(1,8,2048,64)")]
    assert attn.flops == 4 * 8 * 2048 * 2048 * 64 and attn.half
    q4 = rows[("qmatmul", "q4_0 (8192,8192) x vec")]
    assert q4.bytes == pytest.approx(8192 * 8192 * 18 / 32 + 4 * 2 * 8192)   # 18-byte blocks of 32 weights
    causal = rows[("attention", "b1 h8 s2048 d64 causal")]
    assert causal.flops == rows[("attention", "b1 h8 s2048 d64")].flops / 2


def test_roofline_reads_a_measured_table(tmp_path):
    table = tmp_path / "gpu_ops.md"
    table.write_text("## hipsched GPU ops\n\n| op | shape | hipsched | peer | peer time | ratio | target | rate |\n"
                     "|---|---|---|---|---|---|---|---|\n"
                     "| add | 256 MiB | 538.4 us | hbm copy (same bytes) | 279.7 us | 0.52x | | |\n"
                     "| add | 256 MiB | 999.0 us | torch a+b | 288.1 us | 0.29x | | |\n"
                     "| attention fp16 | (1,8,2048,64) | 1.740 ms | torch SDPA (fp16) | 58.4 us | 0.03x | | |\n")
    seen = roofline.measured(str(table))
    assert seen[("add", "256 MiB")] == pytest.approx(538.4e-6)           # the first row of an op and shape
    lines = roofline.table(seen=seen)
    add = next(line for line in lines if line.startswith("| add | 256 MiB"))
    assert add.endswith("| 538.4 us | 0.5 |")                           # 269.2 us of 538.4 us
    attn = next(line for line in lines if line.startswith("| attention fp16 |"))
    assert "| compute |" in attn and attn.endswith("| 1.740 ms | 0.005 |")


def test_split_benchmark_runs_and_its_result_is_exact(tmp_path, monkeypatch):
    """bench/split.py end to end on a small corpus (its timings mean nothing here): the simulated
    device's parts merge to exactly the CPU's answer, and the table is written."""
    split = _bench_module("split")
    monkeypatch.setattr(split.os.path, "dirname", lambda p, _d=os.path.dirname: str(tmp_path)
                        if p == split.__file__ else _d(p))
    monkeypatch.setenv("HIPSCHED_SPLIT_MIN_US", "0")    # calls this small split too
    assert split.main(["--rows", "100000", "--dim", "64", "--calls", "3"]) == 0
    table = (tmp_path / "results" / "split.md").read_text()
    assert "| split result equals the CPU's | yes | yes |" in table and "balancing efficiency" in table
    # how many of the calls split is the model's call on this machine's noise (tests/sched/test_splitting.py
    # checks the planning); the table says it either way
    assert re.search(r"\| split \(automatic\) \| [\d.]+ ms, \d of 3 calls split", table)
