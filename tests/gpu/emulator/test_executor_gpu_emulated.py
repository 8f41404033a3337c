"""The Executor's GPU path end to end on the kernel emulator (tests/support/gpu_emulator.py): real kernel
sources, real GpuBackend and launch glue, real Executor with fallback and telemetry; only the device
is emulated. Covers what the fake backend cannot: device arrays in and out through the Executor,
a forced CPU run on device data (download, compute, upload), injected faults on the real GPU backend
falling back to the CPU's exact answer, and the telemetry those calls leave."""
import numpy as np
import pytest

import gpu_emulator
from emulated_executor import emulated_executor
from graph_data import random_graph
from hipsched import quantize
from hipsched.gpu.memory.device_array import DeviceArray, to_device

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


@pytest.fixture(scope="module")
def rt():
    runtime = gpu_emulator.EmuRuntime(32)
    yield runtime
    runtime.close()


def test_gpu_results_match_cpu_through_the_executor(rt, tmp_path, monkeypatch):
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 300), dtype=np.float32)
    T = rng.standard_normal((200, 40), dtype=np.float32)
    q = rng.standard_normal(40, dtype=np.float32)
    W = quantize(rng.standard_normal((16, 64), dtype=np.float32), "q8_0")
    x = rng.standard_normal(64, dtype=np.float32)
    with emulated_executor(rt, tmp_path) as ex:
        np.testing.assert_array_equal(ex.add(a, b, backend="gpu"), ex.add(a, b, backend="cpu"))
        np.testing.assert_allclose(ex.cosine_similarity(q, T, backend="gpu"),
                                   ex.cosine_similarity(q, T, backend="cpu"), rtol=1e-5, atol=1e-6)
        gi, gs = ex.top_k(q, T, 5, backend="gpu")
        ci, cs = ex.top_k(q, T, 5, backend="cpu")
        np.testing.assert_array_equal(gi, ci)
        np.testing.assert_allclose(gs, cs, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ex.dequantize(W, backend="gpu"), ex.dequantize(W, backend="cpu"))
        np.testing.assert_allclose(ex.qmatmul(W, x, backend="gpu"), ex.qmatmul(W, x, backend="cpu"),
                                   rtol=1e-5, atol=1e-5)
        gpu_events = [e for e in ex.events if e["backend"] == "gpu"]
        assert len(gpu_events) == 5 and all(e["reason"] == "user_preference" for e in gpu_events)
        assert ex.stats().gpu_operations == 5


def test_results_live_where_inputs_live(rt, tmp_path):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 257), dtype=np.float32)
    da, db = to_device(a, runtime=rt), to_device(b, runtime=rt)
    with emulated_executor(rt, tmp_path) as ex:
        on_gpu = ex.add(da, db)
        assert isinstance(on_gpu, DeviceArray)
        np.testing.assert_array_equal(on_gpu.get(), a + b)
        # forced onto the CPU: inputs come down, the result goes back up to where the inputs were
        on_cpu = ex.scale(da, 2.0, backend="cpu")
        assert isinstance(on_cpu, DeviceArray)
        np.testing.assert_array_equal(on_cpu.get(), 2.0 * a)
        host = ex.add(a, b, backend="gpu")
        assert isinstance(host, np.ndarray)


def test_injected_faults_fall_back_to_the_cpu_answer(rt, tmp_path):
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((4, 33), dtype=np.float32) for _ in range(12)]
    with emulated_executor(rt, tmp_path, fault_inject="launch=0.5,seed=11") as ex:
        for x in xs:
            np.testing.assert_allclose(ex.softmax(x, backend="gpu"), ex.softmax(x, backend="cpu"),
                                       rtol=1e-6, atol=1e-7)
        fallbacks = [e for e in ex.events if e["fallback"]]
        assert 0 < len(fallbacks) < len(xs)
        assert all(e["backend"] == "cpu" and e["reason"] == "cpu_fallback" for e in fallbacks)
        assert all(e["fallback"]["backend"] == "gpu" and "launch" in e["fallback"]["error"] for e in fallbacks)
        assert ex.stats().fallback_operations == len(fallbacks)


@pytest.mark.parametrize("warp", [32, 64], ids=["warp32", "warp64"])
def test_attention_and_spreading_on_the_gpu_path(warp, tmp_path):
    """Flash attention (macro-stamped kernels per head_dim class) and CSR spreading, with fallback off so
    a GPU failure cannot hide behind a CPU rerun."""
    rng = np.random.default_rng(6)
    runtime = gpu_emulator.EmuRuntime(warp)
    try:
        with emulated_executor(runtime, tmp_path, allow_fallback=False) as ex:
            for sq, sk, hd in [(17, 17, 8), (33, 20, 64), (5, 70, 40)]:
                q = rng.standard_normal((1, 2, sq, hd), dtype=np.float32)
                k, v = (rng.standard_normal((1, 2, sk, hd), dtype=np.float32) for _ in range(2))
                for causal in (False, True):
                    np.testing.assert_allclose(ex.attention(q, k, v, causal=causal, backend="gpu"),
                                               ex.attention(q, k, v, causal=causal, backend="cpu"),
                                               rtol=2e-5, atol=2e-6)
            n = 50
            indptr, indices, weights = random_graph(rng, n, 300)
            graph = (indptr.astype(np.int32), indices.astype(np.int32), weights * np.float32(0.5))  # int32 path
            seeds = np.zeros(n, np.float32)
            seeds[:5] = 1
            np.testing.assert_allclose(ex.spread_activation(graph, seeds, 0.5, 3, 0.01, backend="gpu"),
                                       ex.spread_activation(graph, seeds, 0.5, 3, 0.01, backend="cpu"),
                                       rtol=1e-5, atol=1e-6)
            assert ex.stats().gpu_operations == 7 and ex.stats().fallback_operations == 0
    finally:
        runtime.close()


@pytest.mark.parametrize("pos", [5, 100])
def test_causal_attention_hidden_inf_value_stays_hidden(rt, tmp_path, pos):
    """An inf in v must not reach queries that cannot see its key (0 * inf = NaN): the GPU kernel skips
    hidden keys exactly as the CPU engine does, wherever the key falls in the tiles."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, 128, 16), dtype=np.float32) for _ in range(3))
    v[0, 0, pos] = np.inf
    with emulated_executor(rt, tmp_path, allow_fallback=False) as ex:
        g = ex.attention(q, k, v, causal=True, backend="gpu")
        c = ex.attention(q, k, v, causal=True, backend="cpu")
    assert np.isfinite(g[0, 0, :pos]).all()
    np.testing.assert_allclose(g, c, rtol=2e-5, atol=2e-6, equal_nan=True)
