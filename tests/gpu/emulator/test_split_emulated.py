"""Splitting one call across the CPU and the GPU with the real GPU backend and kernels on the emulator
(tests/support/gpu_emulator.py): each part is what its side computes alone for those rows, so the merged
result is exactly the merge of the two sides' own answers, and agrees with the CPU's whole answer to
the GPU kernels' tolerance (the same indices for top_k); a GPU part that fails reruns on the CPU."""
import numpy as np
import pytest

import gpu_emulator
from forced_split import force_split
from hipsched import Executor
from hipsched.backends.gpu import GpuBackend
from hipsched.faults import FaultInjectingBackend

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


@pytest.fixture(scope="module", params=[32, 64], ids=["warp32", "warp64"])
def rt(request):
    runtime = gpu_emulator.EmuRuntime(request.param)
    yield runtime
    runtime.close()


def _executor(rt, tmp_path, share, fault=None):
    gpu = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt)
    assert gpu.available, gpu.unavailable_reason
    if fault:
        gpu = FaultInjectingBackend(gpu, fault)
    ex = Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), exploration_share=0.0)
    return force_split(ex, share)


@pytest.mark.parametrize("share", [0.25, 0.6])
def test_split_is_the_merge_of_each_sides_own_answer(rt, tmp_path, share):
    rng = np.random.default_rng(11)
    T = rng.standard_normal((333, 40), dtype=np.float32)
    T[200] = T[17]                                # a tie across the cut: the lower index first
    q = rng.standard_normal((2, 40), dtype=np.float32)
    x = rng.standard_normal((129, 64), dtype=np.float32)
    with _executor(rt, tmp_path, share) as ex:
        idx, sc = ex.top_k(q, T, 9)
        ev = ex.events[-1]
        assert ev["backend"] == "split" and ev["split"]["parts"][1]["backend"] == "gpu", ev
        cut = ev["split"]["parts"][0]["rows"][1]
        ci, cs = ex.top_k(q, T[:cut], 9, backend="cpu")
        gi, gs = ex.top_k(q, T[cut:], 9, backend="gpu")
        both_i = np.concatenate([ci, gi + cut], axis=1)
        both_s = np.concatenate([cs, gs], axis=1)
        order = np.lexsort((both_i, -both_s.astype(np.float64)), axis=1)[:, :9]
        np.testing.assert_array_equal(idx, np.take_along_axis(both_i, order, axis=1))
        np.testing.assert_array_equal(sc, np.take_along_axis(both_s, order, axis=1))
        wi, ws = ex.top_k(q, T, 9, backend="cpu")
        np.testing.assert_array_equal(idx, wi)
        np.testing.assert_allclose(sc, ws, rtol=1e-5, atol=1e-6)

        cos = ex.cosine_similarity(q, T)
        cut = ex.events[-1]["split"]["parts"][0]["rows"][1]
        np.testing.assert_array_equal(cos[:, :cut], ex.cosine_similarity(q, T[:cut], backend="cpu"))
        np.testing.assert_array_equal(cos[:, cut:], ex.cosine_similarity(q, T[cut:], backend="gpu"))

        sm = ex.softmax(x)
        cut = ex.events[-1]["split"]["parts"][0]["rows"][1]
        np.testing.assert_array_equal(sm[:cut], ex.softmax(x[:cut], backend="cpu"))
        np.testing.assert_array_equal(sm[cut:], ex.softmax(x[cut:], backend="gpu"))
        assert ex.stats().split_operations == 3


def test_a_failing_gpu_part_reruns_on_the_cpu_exactly(rt, tmp_path):
    rng = np.random.default_rng(12)
    T = rng.standard_normal((250, 24), dtype=np.float32)
    q = rng.standard_normal(24, dtype=np.float32)
    with _executor(rt, tmp_path, 0.5, fault="launch=1.0,seed=3") as ex:
        idx, sc = ex.top_k(q, T, 7)
        ev = ex.events[-1]
        assert ev["backend"] == "split" and ev["fallback"]["backend"] == "gpu"
        assert [p["backend"] for p in ev["split"]["parts"]] == ["cpu", "cpu"]
        wi, ws = ex.top_k(q, T, 7, backend="cpu")
        np.testing.assert_array_equal(idx, wi)
        np.testing.assert_array_equal(sc, ws)     # every row on the CPU: exactly its whole answer


@pytest.mark.parametrize("kept_by", ["read-only", "resident handle"])
def test_the_gpu_part_reads_a_kept_corpus_in_place(rt, tmp_path, kept_by):
    """A corpus kept on the device (read-only, or registered with Executor.resident) is not uploaded again
    for the GPU's rows of a split: its part reads a view into the kept copy."""
    rng = np.random.default_rng(13)
    T = rng.standard_normal((400, 32), dtype=np.float32)
    q = rng.standard_normal(32, dtype=np.float32)
    with _executor(rt, tmp_path, 0.5) as ex:
        if kept_by == "read-only":
            T.flags.writeable = False
            ex.top_k(q, T, 5, backend="gpu")          # uploads and keeps it
        else:
            T = ex.resident(T).host
        cache = ex._gpu._ctx.resident
        hits, misses = cache.hits, cache.misses
        idx, sc = ex.top_k(q, T, 5)
        ev = ex.events[-1]
        assert ev["backend"] == "split"
        # (the GPU part runs on the splitter's thread: the cache's counts, not this thread's totals)
        assert cache.hits - hits == 1                  # the GPU's rows: a view into the kept copy
        assert cache.misses - misses == 1              # the query, uploaded
        wi, ws = ex.top_k(q, T, 5, backend="cpu")
        np.testing.assert_array_equal(idx, wi)
        np.testing.assert_allclose(sc, ws, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_a_split_qmatmul_reads_its_rows_of_the_kept_weights(rt, tmp_path, qtype):
    """Quantized weights stay on the device in the kernels' row-wise layout: the GPU's rows of a split
    qmatmul (and dequantize) are read from that copy at their rows' offset, not uploaded and repacked,
    and each side's rows are what that side computes for them alone."""
    from hipsched import quantize
    from hipsched.gguf_blocks import QuantizedTensor
    rng = np.random.default_rng(14)
    W = quantize(rng.standard_normal((96, 160), dtype=np.float32), qtype)     # rows padded to a superblock
    x = rng.standard_normal(160, dtype=np.float32)
    with _executor(rt, tmp_path, 0.5) as ex:
        ex.qmatmul(W, x, backend="gpu")                 # uploads and keeps the repacked weights
        cache = ex._gpu._ctx.resident
        hits, misses = cache.hits, cache.misses
        y = ex.qmatmul(W, x)
        ev = ex.events[-1]
        assert ev["backend"] == "split" and ev["split"]["parts"][1]["backend"] == "gpu", ev
        assert cache.hits - hits == 1                   # the GPU's rows, from the kept copy
        assert cache.misses - misses == 1               # x only
        cut = ev["split"]["parts"][0]["rows"][1]
        rows = lambda lo, hi: QuantizedTensor(W.data[lo:hi], (hi - lo, 160), qtype)  # noqa: E731
        np.testing.assert_array_equal(y[:cut], ex.qmatmul(rows(0, cut), x, backend="cpu"))
        np.testing.assert_array_equal(y[cut:], ex.qmatmul(rows(cut, 96), x, backend="gpu"))
        np.testing.assert_allclose(y, ex.qmatmul(W, x, backend="cpu"), rtol=1e-5, atol=1e-5)
        d = ex.dequantize(W)
        assert ex.events[-1]["backend"] == "split"
        np.testing.assert_array_equal(d, ex.dequantize(W, backend="cpu"))   # exact on both sides (gguf's)
