"""One decision path: for random calls over every op, sizes around the batch minimum and the device
memory, forced and automatic, `select_backend(op, args=..., kwargs=..., backend=...)` predicts exactly
the backend and reason the real call then takes from the same model state (the prediction changes
nothing; the call then records and moves the model and the exploration counters for the next pair).
On the fake GPU (scripted refusals, a tight memory) and on the kernel emulator (the real GpuBackend:
real planners, device_bytes_needed, resident-cache transfers)."""
import numpy as np
import pytest

import gpu_emulator
from hipsched import Executor, quantize
from hipsched.backends.gpu import GpuBackend
from graph_data import random_graph

from fake_gpu import FakeGpuBackend

ALL_OPS = ("add", "scale", "softmax", "cosine_similarity", "top_k", "matmul", "dequantize", "qmatmul", "attention",
           "spread_activation")


def random_call(rng, big):
    """(op, args, kwargs) with shapes from empty to `big` elements-ish."""
    op = ALL_OPS[rng.integers(len(ALL_OPS))]
    r = lambda lo, hi: int(rng.integers(lo, hi + 1))
    f = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    if op in ("add", "scale", "softmax"):
        x = f(r(0, 4), r(1, big // 4))
        if op == "add":
            return op, (x, f(*x.shape) if rng.random() < 0.5 else f(x.shape[-1])), {}
        return op, ((x, float(rng.standard_normal())) if op == "scale" else (x,)), \
            ({} if op == "scale" else {"axis": r(-2, 1)})
    if op in ("cosine_similarity", "top_k"):
        d = r(0, 16)
        q = f(d) if rng.random() < 0.5 else f(r(1, 3), d)
        T = f(r(1, big // 8), d)
        return op, ((q, T, r(1, 1100 if rng.random() < 0.2 else 20)) if op == "top_k" else (q, T)), {}
    if op == "matmul":
        m, k, n = r(1, 24), r(0, 24), r(1, 24)
        return op, (f(r(1, 2), m, k), f(k, n)) if rng.random() < 0.3 else (f(m, k), f(k, n)), {}
    if op in ("dequantize", "qmatmul"):
        w = quantize(f(r(1, 16), 32 * r(1, 3)), "q8_0" if rng.random() < 0.5 else "q4_0")
        return op, ((w,) if op == "dequantize" else (w, f(w.shape[1]) if rng.random() < 0.5 else
                                                      f(w.shape[1], r(1, 12)))), {}
    if op == "attention":
        b, h, s, hd = r(1, 2), r(1, 2), r(1, 8), (r(1, 40) if rng.random() < 0.9 else 260)
        return op, tuple(f(b, h, s, hd) for _ in range(3)), {"causal": bool(rng.random() < 0.5)}
    n = r(1, 40)
    return op, (random_graph(rng, n, r(0, 4 * n)), rng.random(n, dtype=np.float32)), \
        {"decay": 0.5, "steps": r(0, 3), "threshold": 0.1}


def check_predictions(ex, rng, calls, big):
    seen = set()
    for i in range(calls):
        op, args, kwargs = random_call(rng, big)
        backend = ("auto", "auto", "cpu", "gpu")[rng.integers(4)]
        sel = ex.select_backend(op, args=args, kwargs=kwargs, backend=backend)
        before = ex.stats().total_operations
        getattr(ex, op)(*args, backend=backend, **kwargs)
        assert ex.stats().total_operations == before + 1
        event = ex.events[-1]   # the ring holds one event: reading it stays O(1) per call
        got = (event["backend"], event["reason"], event.get("detail"))
        assert got == (sel.backend_id, sel.reason.value, sel.detail), (i, op, backend, [getattr(a, "shape", a)
                                                                                         for a in args])
        seen.add(got[:2])
    return seen


def test_predictions_are_the_calls_decisions_on_the_fake_gpu(rng, tmp_path):
    refuse = (lambda call: "fake: wide rows" if call.args and getattr(call.args[0], "shape", (0,))[-1] == 7
              else None)
    gpu = FakeGpuBackend(ops=ALL_OPS, dtypes=("float32", "q8_0", "q4_0"), free_memory=20_000, unsupported=refuse,
                         cost_us=lambda call: 1.0 + call.size * 1e-5)
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), telemetry_ring_size=1,
                  gpu_min_batch_size=64, min_samples=2, exploration_share=0.3, reprobe_interval=7) as ex:
        seen = check_predictions(ex, np.random.default_rng(11), 3000, 4096)
    reasons = {r for _, r in seen}
    # the run went through every rule a fake GPU can reach
    assert {"user_preference", "below_min_batch", "memory_constraint", "gpu_unsupported", "exploring",
            "cost_model"} <= reasons, seen
    assert ("gpu", "user_preference") in seen and {("gpu", "cost_model"), ("gpu", "exploring")} & seen


@pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")
def test_predictions_are_the_calls_decisions_on_the_emulated_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    rt = gpu_emulator.EmuRuntime(32)
    gpu = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt)
    assert gpu.available, gpu.unavailable_reason
    try:
        with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), gpu_min_batch_size=64,
                      telemetry_ring_size=1, min_samples=2, exploration_share=0.3, reprobe_interval=7) as ex:
            seen = check_predictions(ex, np.random.default_rng(12), 400, 1024)
        reasons = {r for _, r in seen}
        assert {"user_preference", "below_min_batch", "gpu_unsupported"} <= reasons, seen
        assert any(b == "gpu" for b, _ in seen)
    finally:
        gpu.close()
        rt.close()


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_sched_select.py): select_backend answers as a real call would: a call below gpu_min_batch_size is `below_min_batch`,
# never `memory_constraint`, since a real call that small never queries device memory.
# ----------------------------------------------------------------------------------------------------
from hipsched import Executor
from hipsched.scheduling import SelectionReason



def test_small_call_is_below_min_batch_even_when_memory_is_short():
    gpu = FakeGpuBackend(ops=("add",), free_memory=1000)
    with Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None, gpu_min_batch_size=64) as ex:
        small = ex.select_backend("add", size=8, nbytes=10_000)
        assert small.backend_id == "cpu" and small.reason == SelectionReason.BELOW_MIN_BATCH
        big = ex.select_backend("add", size=1 << 20, nbytes=10_000)
        assert big.backend_id == "cpu" and big.reason == SelectionReason.MEMORY_CONSTRAINT
