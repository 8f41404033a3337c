"""Unsupported is not unhealthy: a call the GPU cannot run (a parameter past what its kernels take, a
launch past the target's limits) is decided for the CPU before anything is uploaded or launched, with
its own reason `gpu_unsupported` and the refusal's words in the event's `detail`; it never counts
against the GPU's health, and select_backend says the same before the call. One case per op with a
GPU limit, on the kernel emulator (real planners, real launch checks, real glue)."""
import dataclasses
import json

import numpy as np
import pytest
from requires import need

import gpu_emulator
from hipsched import Executor, quantize
from hipsched.backends.gpu import GpuBackend
from hipsched.errors import GpuError
from hipsched.scheduling import SelectionReason as R

from call_counts import count_calls
from fake_gpu import FakeGpuBackend

emulated = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernels"))   # each source compiled once for the module


@pytest.fixture
def emu(kernels, monkeypatch):
    """(runtime, backend, counts of launches, allocations and uploads since the executor started)."""
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    rt = gpu_emulator.EmuRuntime(32)
    counts = count_calls(monkeypatch, rt, ("launch", "malloc", "memcpy_htod"))
    gpu = GpuBackend({"kernel_cache_dir": kernels}, runtime=rt)
    assert gpu.available, gpu.unavailable_reason
    yield rt, gpu, counts
    gpu.close()
    rt.close()


def executor(gpu, tmp_path, **cfg):
    cfg.setdefault("strategy", "gpu_preferred")
    return Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), **cfg)


def decisions(ex):
    return [(e["backend"], e["reason"]) for e in ex.events]


def assert_refused_before_the_device(ex, counts, op, args, kwargs, words):
    """`op(*args, **kwargs)` goes to the CPU as gpu_unsupported, forced or not, with nothing launched,
    allocated or uploaded and the GPU's health untouched; select_backend predicts it, detail and all;
    without fallback a forced call raises the refusal instead."""
    fn = getattr(ex, op)
    for backend in ("auto", "gpu"):
        sel = ex.select_backend(op, args=args, kwargs=kwargs, backend=backend)
        assert (sel.backend_id, sel.reason) == ("cpu", R.GPU_UNSUPPORTED), sel
        assert words in sel.detail
    ex.clear_telemetry()
    counts.update(launch=0, malloc=0, memcpy_htod=0)
    got = fn(*args, backend="gpu", **kwargs)
    fn(*args, **kwargs)
    assert counts == {"launch": 0, "malloc": 0, "memcpy_htod": 0}
    assert decisions(ex) == [("cpu", "gpu_unsupported")] * 2
    assert all(words in e["detail"] and e["fallback"] is None for e in ex.events)
    health = ex.gpu_health(op)
    assert health["state"] == "closed" and health["failures"] == 0 and health["successes"] == 0
    want = fn(*args, backend="cpu", **kwargs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(g, w)
    return got


@emulated
def test_six_large_k_calls_leave_top_k_on_the_gpu(emu, tmp_path):
    """The issue's scenario: six valid top_k(q, T, 1100, backend="gpu") calls (k above the GPU's 1024),
    then ordinary top_k(q, T, 5) calls still run on the GPU, not on the CPU as gpu_unhealthy."""
    rt, gpu, counts = emu
    rng = np.random.default_rng(1)
    T = rng.standard_normal((1200, 16), dtype=np.float32)
    q = rng.standard_normal(16, dtype=np.float32)
    with executor(gpu, tmp_path, breaker_failures=3) as ex:
        counts.update(launch=0, malloc=0, memcpy_htod=0)
        for _ in range(6):
            idx, scores = ex.top_k(q, T, 1100, backend="gpu")
            assert idx.shape == (1100,)
        assert counts == {"launch": 0, "malloc": 0, "memcpy_htod": 0}
        assert decisions(ex) == [("cpu", "gpu_unsupported")] * 6
        assert all("k=1100" in e["detail"] and "1024" in e["detail"] for e in ex.events)
        ex.clear_telemetry()
        for _ in range(3):
            gi, gs = ex.top_k(q, T, 5)
        assert decisions(ex) == [("gpu", "gpu_available")] * 3
        assert counts["launch"] > 0
        ci, cs = ex.top_k(q, T, 5, backend="cpu")
        np.testing.assert_array_equal(gi, ci)
        np.testing.assert_allclose(gs, cs, rtol=1e-5, atol=1e-6)
        assert ex.gpu_health("top_k")["failures"] == 0


@emulated
def test_top_k_k_above_the_gpu_limit(emu, tmp_path):
    rt, gpu, counts = emu
    rng = np.random.default_rng(2)
    T = rng.standard_normal((1100, 8), dtype=np.float32)
    q = rng.standard_normal((2, 8), dtype=np.float32)
    with executor(gpu, tmp_path) as ex:
        assert_refused_before_the_device(ex, counts, "top_k", (q, T, 1025), {}, "above the GPU limit 1024")
        # k beyond n gives n results: 1025 against 1000 targets is k' = 1000, which the GPU takes
        assert ex.select_backend("top_k", args=(q, T[:1000], 1025)).backend_id == "gpu"


@emulated
def test_attention_head_dim_above_256(emu, tmp_path):
    rt, gpu, counts = emu
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 3, 260), dtype=np.float32) for _ in range(3))
    with executor(gpu, tmp_path) as ex:
        assert_refused_before_the_device(ex, counts, "attention", (q, k, v), {"causal": True},
                                         "head_dim 260 exceeds")


@emulated
def test_matmul_batch_beyond_grid_z(emu, tmp_path):
    """The tiled kernel puts the batch on grid z (at most 65535 blocks)."""
    rt, gpu, counts = emu
    rng = np.random.default_rng(4)
    a = rng.standard_normal((65536, 1, 2), dtype=np.float32)
    b = rng.standard_normal((65536, 2, 1), dtype=np.float32)
    with executor(gpu, tmp_path) as ex:
        assert_refused_before_the_device(ex, counts, "matmul", (a, b), {}, "launch-limit-grid-z")
        assert ex.select_backend("matmul", args=(a[:65535], b[:65535])).backend_id == "gpu"


@emulated
def test_qmatmul_columns_beyond_grid_y(emu, tmp_path):
    """The 64x64-tile kernel puts x's columns on grid y. The real limit (65535 tiles, 4M columns) would
    need gigabytes here, so the device's grid y is made 4: 320 columns need 5 tiles."""
    rt, gpu, counts = emu
    gpu._ctx.target = dataclasses.replace(gpu._ctx.target, max_grid=(2**31 - 1, 4, 4))
    rng = np.random.default_rng(5)
    w = quantize(rng.standard_normal((8, 64), dtype=np.float32), "q8_0")
    x = rng.standard_normal((64, 320), dtype=np.float32)
    with executor(gpu, tmp_path) as ex:
        assert_refused_before_the_device(ex, counts, "qmatmul", (w, x), {}, "launch-limit-grid-y")
        assert ex.select_backend("qmatmul", args=(w, x[:, :256])).backend_id == "gpu"


@emulated
def test_top_k_queries_beyond_grid_y(emu, tmp_path):
    rt, gpu, counts = emu
    gpu._ctx.target = dataclasses.replace(gpu._ctx.target, max_grid=(2**31 - 1, 4, 4))
    rng = np.random.default_rng(6)
    T = rng.standard_normal((100, 8), dtype=np.float32)
    q = rng.standard_normal((5, 8), dtype=np.float32)
    with executor(gpu, tmp_path) as ex:
        assert_refused_before_the_device(ex, counts, "top_k", (q, T, 3), {}, "launch-limit-grid-y")


@emulated
def test_no_fallback_raises_the_refusal(emu, tmp_path):
    rt, gpu, counts = emu
    rng = np.random.default_rng(7)
    T = rng.standard_normal((1100, 8), dtype=np.float32)
    with executor(gpu, tmp_path, allow_fallback=False) as ex:
        counts.update(launch=0, malloc=0, memcpy_htod=0)
        with pytest.raises(GpuError) as e:
            ex.top_k(T[0], T, 1100, backend="gpu")
        assert e.value.kind == "unsupported" and "k=1100" in str(e.value)
        assert counts == {"launch": 0, "malloc": 0, "memcpy_htod": 0}
        assert ex.gpu_health("top_k")["failures"] == 0


def test_the_rules_around_an_unsupported_call(rng, tmp_path):
    """The scripted refusal of the fake GPU: asked-for CPU stays user_preference, small calls stay
    below_min_batch (the device is not asked about them), everything else is gpu_unsupported; the
    breaker never sees it, and the JSONL line carries the detail and validates against the schema."""
    jsonschema = need("jsonschema")
    from hipsched.telemetry import schema_path
    gpu = FakeGpuBackend(unsupported=lambda call: "fake: too wide" if call.args[0].shape[-1] > 100 else None)
    log = tmp_path / "events.jsonl"
    wide = rng.standard_normal((4, 128), dtype=np.float32)
    narrow = rng.standard_normal((4, 64), dtype=np.float32)
    with Executor(gpu_backend=gpu, persist_model=False, telemetry_path=str(log), strategy="gpu_preferred",
                  breaker_failures=1, gpu_min_batch_size=64) as ex:
        for _ in range(3):
            ex.softmax(wide, backend="gpu")
            ex.softmax(wide)
        ex.softmax(wide, backend="cpu")
        ex.softmax(wide[:, :8].copy())  # 32 elements: below the batch minimum
        ex.softmax(narrow)
        assert decisions(ex) == [("cpu", "gpu_unsupported")] * 6 + [
            ("cpu", "user_preference"), ("cpu", "below_min_batch"), ("gpu", "gpu_available")]
        assert gpu.runs == 1
        assert ex.gpu_health("softmax")["state"] == "closed"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    schema = json.load(open(schema_path()))
    for d in lines:
        jsonschema.validate(d, schema)
    assert [d.get("detail") for d in lines] == ["fake: too wide"] * 6 + [None] * 3


@emulated
@pytest.mark.parametrize("op", ["cosine_similarity", "top_k"])
def test_similarity_with_queries_and_corpus_in_different_dtypes(emu, tmp_path, op):
    """The similarity kernels read q and T in one element type; the CPU scores a float32 q against a
    half corpus exactly (rounding q to half on the GPU would change the scores), so the mix stays on
    the CPU as gpu_unsupported, and q in the corpus's dtype goes to the GPU."""
    rt, gpu, counts = emu
    rng = np.random.default_rng(6)
    T = rng.standard_normal((300, 16)).astype(np.float16)
    q = rng.standard_normal(16, dtype=np.float32)
    args = (q, T, 5) if op == "top_k" else (q, T)
    with executor(gpu, tmp_path) as ex:
        assert_refused_before_the_device(ex, counts, op, args, {}, "q is float32 and T float16")
        same = (q.astype(np.float16),) + args[1:]
        assert ex.select_backend(op, args=same).backend_id == "gpu"
