"""Review: out-of-memory chunking must give the unchunked result for every operand layout matmul accepts."""
import numpy as np
import pytest

from hipsched import Executor

from fake_gpu import FakeGpuBackend


def make(gpu):
    return Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None)


@pytest.mark.parametrize("sa,sb", [((12, 8), (3, 8, 5)),      # 2-d a broadcast over b's batch
                                   ((8,), (8, 6)),            # 1-d a: rows are not a's axis 0
                                   ((8,), (3, 8, 6)),
                                   ((3, 4, 8), (3, 8, 5)),    # equal batch on both sides
                                   ((3, 4, 8), (8, 5)),
                                   ((12, 8), (8,))])
def test_matmul_chunked_on_oom_equals_unchunked(sa, sb, rng):
    a = rng.standard_normal(sa, dtype=np.float32)
    b = rng.standard_normal(sb, dtype=np.float32)
    want = np.matmul(a, b)
    probe = make(FakeGpuBackend(ops=("matmul",)))
    probe.matmul(a, b, backend="gpu")
    whole = probe.events[-1]["bytes"]
    gpu = FakeGpuBackend(ops=("matmul",), oom_above_bytes=whole * 3 // 4, free_memory=whole)
    ex = make(gpu)
    got = ex.matmul(a, b, backend="gpu")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ev = ex.events[-1]
    assert ev["backend"] == "gpu" and ev["reason"] != "cpu_fallback", ev
    assert ex.gpu_health("matmul")["failures"] == 0


def test_chunking_tries_single_pieces_when_the_estimate_asks_for_more(rng):
    # free memory reads low (a cache the allocator would evict, or a stale reading): the estimate asks
    # for more chunks than there are rows; one row per chunk still fits and must be tried
    a = rng.standard_normal((4, 256), dtype=np.float32)
    row_bytes = 4 * 256 * 3
    gpu = FakeGpuBackend(ops=("add",), oom_above_bytes=row_bytes * 1, free_memory=16)
    ex = make(gpu)
    got = ex.add(a, a, backend="gpu")
    np.testing.assert_array_equal(got, a + a)
    assert ex.events[-1]["backend"] == "gpu" and gpu.ok_runs == 4
