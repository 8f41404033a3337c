"""No first-call stall while a kernel compiles: on a cold kernel cache, an automatic call whose GPU
kernel is not compiled runs on the CPU while the kernel compiles on a thread of its own (the event says
so), and the GPU takes the calls once it is ready; backend="gpu" waits for it; background_compile=False
keeps the first call waiting. On the kernel emulator, its compiler slowed to 2 s a source."""
import json
import time

import numpy as np
import pytest

import gpu_emulator
from emulated_executor import emulated_executor

emulated = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")
SLOW_S = 2.0


@pytest.fixture
def slow_rt(monkeypatch):
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    rt = gpu_emulator.EmuRuntime(32)
    compile_now = rt.compiler.compile

    def slow(*a, **k):
        time.sleep(SLOW_S)
        return compile_now(*a, **k)
    monkeypatch.setattr(rt.compiler, "compile", slow)
    yield rt
    rt.close()


def _wait_compiled(ex, limit_s=120.0):
    cache = ex._gpu._ctx.cache
    end = time.monotonic() + limit_s
    while cache.compiling() and time.monotonic() < end:
        time.sleep(0.05)
    assert not cache.compiling()
    return cache


@emulated
def test_a_cold_kernel_compiles_while_the_cpu_runs_its_calls(slow_rt, tmp_path):
    x = np.random.default_rng(0).standard_normal((64, 1024), dtype=np.float32)
    ex = emulated_executor(slow_rt, tmp_path, background_compile=True, telemetry_path=str(tmp_path / "ev.jsonl"),
                           allow_fallback=False)
    with ex:
        t0 = time.monotonic()
        first = ex.softmax(x)                   # the GPU would be tried (no estimate yet): its kernel is cold
        took = time.monotonic() - t0
        assert took < SLOW_S / 2, took           # nobody waited for the compiler
        compiling = ex._gpu._ctx.cache.compiling()
        assert list(compiling) == ["softmax.hip"]
        cache = _wait_compiled(ex)
        assert [c[0] for c in cache.compiled_in_background] == ["softmax.hip"]
        assert cache.compiled_in_background[0][1] >= SLOW_S and cache.compiled_in_background[0][2] is None
        ex.softmax(x)                           # ready now: judged on its merits
        t0 = time.monotonic()
        second = ex.softmax(x, backend="gpu")   # and nothing left to compile
        assert time.monotonic() - t0 < SLOW_S / 2
        assert np.array_equal(first, ex.softmax(x, backend="cpu"))
        np.testing.assert_allclose(second, first, rtol=1e-6, atol=1e-7)
    events = [json.loads(line) for line in open(tmp_path / "ev.jsonl")]
    assert events[0]["backend"] == "cpu" and events[0]["reason"] == "gpu_unsupported"
    assert "being compiled in the background" in events[0]["detail"]
    assert events[1]["reason"] != "gpu_unsupported" and events[2]["backend"] == "gpu"


@emulated
def test_a_call_asking_for_the_gpu_waits_for_its_kernel(slow_rt, tmp_path):
    x = np.random.default_rng(1).standard_normal(4096, dtype=np.float32)
    ex = emulated_executor(slow_rt, tmp_path, background_compile=True, allow_fallback=False)
    with ex:
        t0 = time.monotonic()
        ex.scale(x, 2.0, backend="gpu")
        assert time.monotonic() - t0 >= SLOW_S
        assert not ex._gpu._ctx.cache.compiled_in_background   # compiled on the caller's thread


@emulated
def test_without_background_compiles_the_first_call_waits(slow_rt, tmp_path):
    x = np.random.default_rng(2).standard_normal((64, 1024), dtype=np.float32)
    ex = emulated_executor(slow_rt, tmp_path, background_compile=False, telemetry_path=str(tmp_path / "ev.jsonl"))
    with ex:
        t0 = time.monotonic()
        ex.softmax(x)
        assert time.monotonic() - t0 >= SLOW_S   # judged with the kernel compiled on the caller's thread
        assert not ex._gpu._ctx.cache.compiled_in_background
    events = [json.loads(line) for line in open(tmp_path / "ev.jsonl")]
    assert events[0]["reason"] != "gpu_unsupported" and "detail" not in events[0]
