"""No first-call stall while a kernel compiles: on a cold kernel cache, an automatic call whose GPU
kernel is not compiled runs on the CPU while the kernel compiles on a thread of its own (the event says
so), and the GPU takes the calls once it is ready; backend="gpu" waits for it; background_compile=False
keeps the first call waiting. On the kernel emulator, its compiler slowed to 2 s a source."""
import json
import threading
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
def test_a_cold_kernel_compiles_while_the_cpu_runs_its_calls(slow_rt, tmp_path, monkeypatch):
    # the compiler is held until the test lets it go (not timed: a loaded machine would make any time
    # limit a guess), so a call that waited for it could only return once it gave up waiting
    gate, started, gave_up = threading.Event(), [], []
    slow = slow_rt.compiler.compile

    def held(*a, **k):
        started.append(a)
        if not gate.wait(30.0):
            gave_up.append(a)
        return slow(*a, **k)
    monkeypatch.setattr(slow_rt.compiler, "compile", held)
    x = np.random.default_rng(0).standard_normal((64, 1024), dtype=np.float32)
    ex = emulated_executor(slow_rt, tmp_path, background_compile=True, telemetry_path=str(tmp_path / "ev.jsonl"),
                           allow_fallback=False)
    with ex:
        first = ex.softmax(x)                   # the GPU would be tried (no estimate yet): its kernel is cold
        assert not gave_up and not gate.is_set()   # returned while the compiler was held: nobody waited
        compiling = ex._gpu._ctx.cache.compiling()
        assert list(compiling) == ["softmax.hip"]
        gate.set()
        cache = _wait_compiled(ex)
        assert [c[0] for c in cache.compiled_in_background] == ["softmax.hip"]
        assert cache.compiled_in_background[0][1] >= SLOW_S and cache.compiled_in_background[0][2] is None
        ex.softmax(x)                           # ready now: judged on its merits
        compiles = len(started)
        second = ex.softmax(x, backend="gpu")   # and nothing left to compile
        assert len(started) == compiles and not gave_up
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


@emulated
def test_a_failed_background_compile_is_not_tried_again(slow_rt, tmp_path, monkeypatch):
    from hipsched.errors import GpuError
    tries = []

    def broken(source, name, arch, options=()):
        tries.append(name)
        raise GpuError("compile", f"{name}: planted error")
    monkeypatch.setattr(slow_rt.compiler, "compile", broken)
    x = np.random.default_rng(3).standard_normal((64, 1024), dtype=np.float32)
    ex = emulated_executor(slow_rt, tmp_path, background_compile=True)
    with ex:
        ex.softmax(x)
        _wait_compiled(ex)
        for _ in range(4):
            np.testing.assert_array_equal(ex.softmax(x), ex.softmax(x, backend="cpu"))
        assert tries == ["softmax.hip"]    # one compile; later calls meet its error, not the compiler
        assert "softmax.hip: planted error" in ex._gpu._ctx.cache.compiled_in_background[0][2]


@emulated
def test_an_automatic_call_does_not_wait_for_another_threads_compile(slow_rt, tmp_path, monkeypatch):
    gate, started, gave_up = threading.Event(), [], []
    slow = slow_rt.compiler.compile

    def held(*a, **k):   # (as in the first test: held until the test lets it go)
        started.append(a)
        if not gate.wait(30.0):
            gave_up.append(a)
        return slow(*a, **k)
    monkeypatch.setattr(slow_rt.compiler, "compile", held)
    x = np.random.default_rng(4).standard_normal((64, 1024), dtype=np.float32)
    y = np.random.default_rng(5).standard_normal(1 << 16, dtype=np.float32)
    ex = emulated_executor(slow_rt, tmp_path, background_compile=True)
    with ex:
        forced = threading.Thread(target=lambda: ex.softmax(x, backend="gpu"))   # compiles on its thread
        forced.start()
        end = time.monotonic() + 30.0
        while not started and time.monotonic() < end:   # (until its compile has begun)
            time.sleep(0.01)
        assert started
        ex.scale(y, 2.0)                        # its own kernel is cold too: compiled in the background
        assert not gave_up and not gate.is_set()
        gate.set()
        forced.join()
        _wait_compiled(ex)


@emulated
def test_a_backend_whose_judge_takes_only_the_call_keeps_the_gpu(tmp_path):
    """A GPU backend overriding judge(call) (no wait_for_kernels) is asked as before, not dropped."""
    from fake_gpu import FakeGpuBackend
    from hipsched import Executor

    class OwnJudge(FakeGpuBackend):
        judged = 0

        def judge(self, call):
            self.judged += 1
            return super().judge(call)
    # (the fake GPU runs the CPU's kernel, so it is never the faster side: how many calls it takes after
    # exploring depends on the machine's load; that it is asked and runs calls does not)
    gpu = OwnJudge(cost_us=lambda call: 1.0, transfer={"h2d_latency_us": 0.0, "h2d_gbps": 1e6, "d2h_latency_us": 0.0,
                                                       "d2h_gbps": 1e6})
    x = np.ones((512, 1024), np.float32)
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), background_compile=True) as ex:
        for _ in range(20):
            ex.softmax(x)
        assert gpu.judged >= 1 and gpu.ok_runs >= 1
        assert any(e["backend"] == "gpu" for e in ex.events)
