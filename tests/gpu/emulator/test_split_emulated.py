"""Splitting one call across the CPU and the GPUs with the real GPU backend and kernels on the emulator
(tests/support/gpu_emulator.py), with one emulated device and with two: each part is what its side
computes alone for those rows, so the merged result is exactly the merge of the sides' own answers, and
agrees with the CPU's whole answer to the GPU kernels' tolerance (the same indices for top_k); a GPU
part that fails reruns on the CPU."""
import numpy as np
import pytest

import gpu_emulator
from forced_split import force_split
from half_formats import TYPE_IDS, TYPES
from planted_ties import exact_query, expected_head, plant
from hipsched import Executor, HybridConfig
from hipsched.backends.gpu import GpuBackend
from hipsched.executor import _further_gpus
from hipsched.ops import OPS
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


def _assert_merged(ex, got, answers, q, T, k):
    """`got` (a split top_k's indices and scores) is the merge of each side's own answer for its rows
    ([((lo, hi), (indices, scores)), ...]: ties to the lower index), and agrees with the CPU's whole answer."""
    both_i = np.concatenate([i + lo for (lo, _), (i, _) in answers], axis=1)
    both_s = np.concatenate([s for _, (_, s) in answers], axis=1)
    order = np.lexsort((both_i, -both_s.astype(np.float64)), axis=1)[:, :k]
    np.testing.assert_array_equal(got[0], np.take_along_axis(both_i, order, axis=1))
    np.testing.assert_array_equal(got[1], np.take_along_axis(both_s, order, axis=1))
    wi, ws = ex.top_k(q, T, k, backend="cpu")
    np.testing.assert_array_equal(got[0], wi)
    np.testing.assert_allclose(got[1], ws, rtol=1e-5, atol=1e-6)


def _planted(rng, n, d, m, rows, dtype=np.float32):
    """A corpus (n, d) and m exact queries, each with the rows `rows[i]` = (best, second) planted
    (tests/support/planted_ties.py): ties that head the top k, to be ordered by ascending index."""
    T = rng.standard_normal((n, d), dtype=np.float32)
    q = np.stack([exact_query(rng, d) for _ in range(m)])
    for qi, (best, second) in zip(q, rows):
        plant(rng, T, qi, best, second)
    return q.astype(dtype), T.astype(dtype)


def _assert_ties_first(idx, rows):
    for got, (best, second) in zip(idx, rows):
        want = expected_head(best, second)
        assert list(got[:len(want)]) == want, (got[:len(want)], want)


# One device: the CPU's rows end at 250 (GPU share 0.25) or 133 (0.6); every tie group has a row on each side
TIES_1 = (((0, 166, 332), (1, 331)), ((2, 250, 330), (100, 300)))


@pytest.mark.parametrize("share", [0.25, 0.6])
def test_split_is_the_merge_of_each_sides_own_answer(rt, tmp_path, share):
    rng = np.random.default_rng(11)
    q, T = _planted(rng, 333, 40, 2, TIES_1)     # ties inside the top 9, across the cut: the lower index first
    x = rng.standard_normal((129, 64), dtype=np.float32)
    with _executor(rt, tmp_path, share) as ex:
        idx, sc = ex.top_k(q, T, 9)
        ev = ex.events[-1]
        assert ev["backend"] == "split" and ev["split"]["parts"][1]["backend"] == "gpu", ev
        cut = ev["split"]["parts"][0]["rows"][1]
        assert cut == round((1 - share) * len(T))      # where the plan cut
        _assert_ties_first(idx, TIES_1)
        _assert_merged(ex, (idx, sc), [((0, cut), ex.top_k(q, T[:cut], 9, backend="cpu")),
                                       ((cut, len(T)), ex.top_k(q, T[cut:], 9, backend="gpu"))], q, T, 9)

        cos = ex.cosine_similarity(q, T)
        cut = ex.events[-1]["split"]["parts"][0]["rows"][1]
        np.testing.assert_array_equal(cos[:, :cut], ex.cosine_similarity(q, T[:cut], backend="cpu"))
        np.testing.assert_array_equal(cos[:, cut:], ex.cosine_similarity(q, T[cut:], backend="gpu"))

        sm = ex.softmax(x)
        cut = ex.events[-1]["split"]["parts"][0]["rows"][1]
        np.testing.assert_array_equal(sm[:cut], ex.softmax(x[:cut], backend="cpu"))
        np.testing.assert_array_equal(sm[cut:], ex.softmax(x[cut:], backend="gpu"))
        assert ex.stats().split_operations == 3


def _each_op(rng, dtype):
    """(op, args, kwargs) of the split ops with float inputs, small, in `dtype`."""
    t = TYPES[dtype]
    f = lambda *s: rng.standard_normal(s, dtype=np.float32).astype(t)  # noqa: E731
    return [("top_k", (f(24), f(250, 24), 7), {}), ("cosine_similarity", (f(2, 24), f(130, 24)), {}),
            ("add", (f(70, 33), f(33)), {}), ("add", (f(1000), f(1000)), {}), ("scale", (f(90, 17), -1.5), {}),
            ("softmax", (f(65, 40),), {"axis": -1}), ("rms_norm", (f(66, 48), f(48)), {"eps": 1e-5})]


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


def test_a_failing_gpu_part_reruns_on_the_cpu_exactly(rt, tmp_path):
    """Every split op: the GPU part's launch fails, its rows rerun on the CPU, and the call is exactly
    the CPU's whole answer (every row computed there)."""
    rng = np.random.default_rng(12)
    with _executor(rt, tmp_path, 0.5, fault="launch=1.0,seed=3") as ex:
        for op, args, kwargs in _each_op(rng, "float32"):
            got = getattr(ex, op)(*args, **kwargs)
            ev = ex.events[-1]
            assert ev["backend"] == "split" and ev["fallback"]["backend"] == "gpu", (op, ev)
            assert [p["backend"] for p in ev["split"]["parts"]] == ["cpu", "cpu"], op
            assert _same(got, getattr(ex, op)(*args, **kwargs, backend="cpu")), op


@pytest.mark.parametrize("dtype", TYPES, ids=TYPE_IDS)
def test_each_split_ops_rows_are_what_each_side_computes_alone(rt, tmp_path, dtype):
    """add, scale, softmax, rms_norm and cosine_similarity in every float type, cut at 0.4: the CPU's rows
    are the CPU's answer for them and the GPU's rows the GPU kernels' (the emulator's, not the CPU
    kernels a fake GPU would run); the GPU's rows of a top_k are the merge of the sides' answers."""
    rng = np.random.default_rng(15)
    with _executor(rt, tmp_path, 0.4) as ex:
        for op, args, kwargs in _each_op(rng, dtype):
            got = getattr(ex, op)(*args, **kwargs)
            ev = ex.events[-1]
            assert ev["backend"] == "split" and [p["backend"] for p in ev["split"]["parts"]] == ["cpu", "gpu"], ev
            assert ev["dtype"] == dtype
            call = OPS[op].prepare(*args, **kwargs)
            part = OPS[op].partition(call)
            cut = ev["split"]["parts"][0]["rows"][1]
            assert cut == round(0.6 * part.rows), (op, cut, part.rows)
            if op == "top_k":
                continue    # the merge: test_half_top_k_split_orders_ties_across_the_cut
            bounds = [(0, cut), (cut, part.rows)]
            sides = [backend.run(call.part(part.args(lo, hi), (hi - lo) / part.rows))
                     for (lo, hi), backend in zip(bounds, (ex._cpu, ex._gpu))]
            assert _same(got, part.merge(sides, bounds)), op
            assert got.dtype == sides[0].dtype == sides[1].dtype


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"], ids=["half-float16", "half-bfloat16"])
def test_half_top_k_split_orders_ties_across_the_cut(rt, tmp_path, dtype):
    rng = np.random.default_rng(16)
    q, T = _planted(rng, 333, 40, 2, TIES_1, TYPES[dtype])
    with _executor(rt, tmp_path, 0.6) as ex:
        idx, sc = ex.top_k(q, T, 9)
        ev = ex.events[-1]
        assert ev["backend"] == "split" and ev["dtype"] == dtype and ev["split"]["parts"][1]["backend"] == "gpu"
        cut = ev["split"]["parts"][0]["rows"][1]
        _assert_merged(ex, (idx, sc), [((0, cut), ex.top_k(q, T[:cut], 9, backend="cpu")),
                                       ((cut, len(T)), ex.top_k(q, T[cut:], 9, backend="gpu"))], q, T, 9)
        _assert_ties_first(idx, TIES_1)
        assert (sc[:, :3] == 1).all() and (sc[:, 3:5] == 0.75).all()    # exact on both sides


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


# ------------------------------------------------------------------ two devices
@pytest.fixture(scope="module")
def rt2():
    runtime = gpu_emulator.EmuRuntime(32, devices=2)
    yield runtime
    runtime.close()


def _two_device_executor(rt2, tmp_path, shares, fault=None):
    first = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt2)
    second = first.for_device(1)
    assert first.available and second.available, (first.unavailable_reason, second.unavailable_reason)
    assert (first.device_index, second.device_index) == (0, 1)
    gpus = [first, second if not fault else FaultInjectingBackend(second, fault)]
    ex = Executor(gpu_backend=gpus, persist_model=False, cache_dir=str(tmp_path), exploration_share=0.0)
    return force_split(ex, shares)


def test_the_config_picks_the_devices(rt2, tmp_path):
    """gpu_devices=None takes every device the runtime finds, a list only those it names (one not found
    is left out, logged); the executor's own device is never listed twice."""
    first = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt2)
    cfg = lambda **kw: HybridConfig(config_file=False, env={}, **kw)   # noqa: E731
    def indices(config):
        gpus = _further_gpus(config, first)
        for g in gpus:
            g.close()
        return [g.device_index for g in gpus]
    try:
        assert indices(cfg()) == [1]
        assert indices(cfg(gpu_devices=[0])) == []
        assert indices(cfg(gpu_devices=[0, 1, 7])) == [1]
    finally:
        first.close()


# Two devices: cuts at 160 and 281 (shares 0.3, 0.3) or 160 and 361 (0.5, 0.1); each query's copies
# fall one in each of the three parts
TIES_2 = (((0, 200, 400), (1, 399)), ((5, 170, 380), (6, 390)), ((10, 290, 370), (11, 360)))


@pytest.mark.parametrize("shares", [(0.3, 0.3), (0.5, 0.1)])
def test_a_call_split_across_the_cpu_and_two_devices_is_each_sides_own_answer(rt2, tmp_path, shares):
    rng = np.random.default_rng(21)
    q, T = _planted(rng, 401, 40, 3, TIES_2)     # ties inside the top 8, across two cuts: the lower index first
    x = rng.standard_normal((150, 48), dtype=np.float32)
    with _two_device_executor(rt2, tmp_path, shares) as ex:
        assert [d["index"] for d in ex.gpu_devices] == [0, 1] and ex.capabilities().gpu_devices == (0, 1)
        idx, sc = ex.top_k(q, T, 8)
        ev = ex.events[-1]
        assert ev["backend"] == "split" and set(ev["split"]["shares"]) == {"cpu", "gpu:0", "gpu:1"}, ev
        parts = ev["split"]["parts"]
        assert [p["backend"] for p in parts] == ["cpu", "gpu:0", "gpu:1"]
        (a, b), (_, c) = parts[1]["rows"], parts[2]["rows"]
        assert (a, b) == (round((1 - sum(shares)) * len(T)), round((1 - shares[1]) * len(T)))   # the plan's cuts
        _assert_ties_first(idx, TIES_2)
        _assert_merged(ex, (idx, sc), [
            ((0, a), ex.top_k(q, T[:a], 8, backend="cpu")), ((a, b), ex.top_k(q, T[a:b], 8, backend="gpu")),
            # the second device's rows: its own backend, called directly, is what it computes alone
            ((b, c), ex._other_gpus[0].run(OPS["top_k"].prepare(q, T[b:c], 8)))], q, T, 8)

        y = ex.softmax(x)
        parts = ex.events[-1]["split"]["parts"]
        (a, b), (_, c) = parts[1]["rows"], parts[2]["rows"]
        np.testing.assert_array_equal(y[:a], ex.softmax(x[:a], backend="cpu"))
        np.testing.assert_array_equal(y[a:b], ex.softmax(x[a:b], backend="gpu"))
        np.testing.assert_array_equal(y[b:c], ex._other_gpus[0].run(OPS["softmax"].prepare(x[b:c])))
        assert ex.stats().split_operations == 2


def test_a_failing_second_device_reruns_its_rows_on_the_cpu_and_its_health_says_so(rt2, tmp_path):
    rng = np.random.default_rng(22)
    T = rng.standard_normal((300, 24), dtype=np.float32)
    q = rng.standard_normal(24, dtype=np.float32)
    with _two_device_executor(rt2, tmp_path, (0.3, 0.3), fault="launch=1.0,seed=5") as ex:
        idx, sc = ex.top_k(q, T, 9)
        ev = ex.events[-1]
        assert ev["fallback"]["backend"] == "gpu" and ev["fallback"]["error"].startswith("gpu:1: ")
        assert [p["backend"] for p in ev["split"]["parts"]] == ["cpu", "gpu:0", "cpu"]
        wi, ws = ex.top_k(q, T, 9, backend="cpu")
        np.testing.assert_array_equal(idx, wi)
        np.testing.assert_allclose(sc, ws, rtol=1e-5, atol=1e-6)
        second = ex._fast.splitter.others[0]
        assert second.core.health("top_k")["failures"] == 1          # that device's, not the executor's GPU
        assert ex.gpu_health("top_k")["failures"] == 0
        # another op: the failed device's rows are the CPU's answer for them, the first device's its own
        x = rng.standard_normal((90, 40), dtype=np.float32)
        y = ex.softmax(x)
        parts = ex.events[-1]["split"]["parts"]
        assert [p["backend"] for p in parts] == ["cpu", "gpu:0", "cpu"]
        (a, b), (_, c) = parts[1]["rows"], parts[2]["rows"]
        np.testing.assert_array_equal(y[:a], ex.softmax(x[:a], backend="cpu"))
        np.testing.assert_array_equal(y[a:b], ex.softmax(x[a:b], backend="gpu"))
        np.testing.assert_array_equal(y[b:c], ex.softmax(x[b:c], backend="cpu"))
        assert second.core.health("softmax")["failures"] == 1


def test_a_further_devices_model_is_saved_and_loaded_in_a_file_of_its_own(rt2, tmp_path):
    """What a further device learned (its split parts' times) outlives the process, as the executor's own
    model does, in its own file: it was lost at every close, so each process split on guesses again."""
    import math

    def make():
        first = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt2)
        return Executor(gpu_backend=[first, first.for_device(1)], persist_model=True,
                        cache_dir=str(tmp_path / "cache"))
    with make() as ex:
        core = ex._fast.further.by_index[1].core
        assert core is ex._fast.splitter.others[0].core        # the core its split parts teach
        s = core.slot("top_k", "float32")
        for _ in range(3):
            core.record(s, 1, 1e6, 250.0)
    assert len(list((tmp_path / "cache").glob("model-*.json"))) == 2
    with make() as ex:
        core = ex._fast.further.by_index[1].core
        assert core.predict(core.slot("top_k", "float32"), 1, 1e6) == pytest.approx(250.0)
        assert math.isnan(ex._core.predict(ex._core.slot("top_k", "float32"), 1, 1e6))   # not the executor's


def test_info_lists_the_devices_an_executor_would_split_across(rt2, monkeypatch, capsys):
    from hipsched.cli import info
    from hipsched.gpu.bindings import detect
    monkeypatch.setattr(detect, "get_runtime", lambda: rt2)
    monkeypatch.setattr(info, "_kernels", lambda rt: {"driver_version": 0, "loader": "", "unavailable": "n/a"})
    for var in ("HIPSCHED_SPLIT", "HIPSCHED_GPU_DEVICES", "HIPSCHED_GPU_DEVICE_ID", "HIPSCHED_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    got = info.gather()
    assert [d["index"] for d in got["devices"]] == [0, 1]
    assert got["splitting"]["devices"] == [0, 1] and got["splitting"]["missing_devices"] == []
    info.run(type("Args", (), {"json": False})())
    assert "devices: 0 (backend='gpu'), then 1 for parts of split calls" in capsys.readouterr().out
    monkeypatch.setenv("HIPSCHED_GPU_DEVICES", "1,3")
    sp = info.gather()["splitting"]
    assert sp["devices"] == [1] and sp["missing_devices"] == [3]
