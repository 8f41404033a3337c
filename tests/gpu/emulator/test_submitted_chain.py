"""A chain submitted without waiting on device data stays on the device: rms_norm -> qmatmul -> softmax ->
top_k on GPU-resident inputs, each call's input the previous one's Future. No intermediate is copied to
the host (the emulator counts its device-to-host copies), the results are device arrays, and they equal
the same chain called synchronously, bit for bit. On the kernel emulator."""
import numpy as np
import pytest

import gpu_emulator
from call_counts import count_calls
from emulated_executor import emulated_executor
from hipsched import quantize
from hipsched.gpu.memory.device_array import DeviceArray, to_device

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


@pytest.fixture
def rt(monkeypatch):
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    runtime = gpu_emulator.EmuRuntime(32)
    yield runtime
    runtime.close()


def test_a_device_chain_submitted_without_waiting_copies_nothing_to_the_host(rt, tmp_path, monkeypatch):
    rng = np.random.default_rng(11)
    d, vocab = 256, 512
    x = to_device(rng.standard_normal(d, dtype=np.float32), runtime=rt)
    w = to_device(rng.standard_normal(d, dtype=np.float32), runtime=rt)
    W = quantize(rng.standard_normal((vocab, d), dtype=np.float32), "q8_0")
    T = to_device(rng.standard_normal((300, vocab), dtype=np.float32), runtime=rt)
    with emulated_executor(rt, tmp_path, allow_fallback=False) as ex:
        def chain_sync():
            h = ex.rms_norm(x, w, backend="gpu")
            logits = ex.qmatmul(W, h, backend="gpu")
            return ex.top_k(ex.softmax(logits, backend="gpu"), T, 8, backend="gpu")
        want = chain_sync()       # also compiles the kernels and keeps W's blocks on the device
        counts = count_calls(monkeypatch, rt, ("memcpy_dtoh",))
        h = ex.submit("rms_norm", x, w, backend="gpu")
        logits = ex.submit("qmatmul", W, h, backend="gpu")
        probs = ex.softmax(logits, backend="gpu", wait=False)
        idx, scores = ex.submit("top_k", probs, T, 8, backend="gpu").result(timeout=120)
        assert counts["memcpy_dtoh"] == 0
        assert all(isinstance(f.result(), DeviceArray) for f in (h, logits, probs))
        assert isinstance(idx, DeviceArray) and isinstance(scores, DeviceArray)
        np.testing.assert_array_equal(idx.get(), want[0].get())
        np.testing.assert_array_equal(scores.get(), want[1].get())


def test_submitted_host_calls_run_on_their_threads_own_streams(rt, tmp_path):
    """Calls submitted on host data run on the submission threads, each thread's GPU work on a stream of
    its own (so one call's copies can overlap another's kernel); the results are the calls that wait."""
    import json
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal((64, 256), dtype=np.float32) for _ in range(12)]
    with emulated_executor(rt, tmp_path, allow_fallback=False, telemetry_path=str(tmp_path / "ev.jsonl")) as ex:
        pool = ex._gpu
        futs = [ex.submit("softmax", x, backend="gpu") for x in xs]
        got = [f.result(timeout=120) for f in futs]
        for x, g in zip(xs, got):
            np.testing.assert_array_equal(g, ex.softmax(x, backend="gpu"))
        own = set(pool._stream_pool.streams)
    events = [json.loads(line) for line in open(tmp_path / "ev.jsonl")]
    submitted, waited = events[:12], events[12:]
    assert all(e["backend"] == "gpu" and e["stream"] in own for e in submitted)
    assert all(e["stream"] is None for e in waited)
    assert len(own) == 4 and 0 not in own


def test_a_batch_keeps_a_host_chains_intermediates_on_the_device(rt, tmp_path, monkeypatch):
    """rms_norm -> qmatmul -> softmax on host data, planned on the GPU by a batch: the inputs go up once,
    the intermediates stay on the device (nothing copied to the host while the batch runs), and the
    caller's results are host arrays equal to the calls that wait, bit for bit; the last result comes
    down when it is asked for."""
    import concurrent.futures as cf
    rng = np.random.default_rng(13)
    d, vocab = 256, 512
    x = rng.standard_normal(d, dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    W = quantize(rng.standard_normal((vocab, d), dtype=np.float32), "q8_0")
    with emulated_executor(rt, tmp_path, allow_fallback=False) as ex:
        h_want = ex.rms_norm(x, w, backend="gpu")
        logits_want = ex.qmatmul(W, h_want, backend="gpu")
        want = ex.softmax(logits_want, backend="gpu")      # also keeps W's blocks on the device
        counts = count_calls(monkeypatch, rt, ("memcpy_dtoh",))
        with ex.batch() as b:
            h = ex.submit("rms_norm", x, w, backend="gpu")
            logits = ex.submit("qmatmul", W, h, backend="gpu")
            probs = ex.softmax(logits, backend="gpu", wait=False)
        cf.wait([h, logits, probs], timeout=120)
        assert counts["memcpy_dtoh"] == 0
        assert [p[2] for p in b.plan] == ["gpu"] * 3
        got = probs.result()
        assert counts["memcpy_dtoh"] == 1
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(h.result(), h_want)
        np.testing.assert_array_equal(logits.result(), logits_want)
        assert probs.result() is got


def test_a_kept_chain_gives_a_call_that_refuses_its_device_input_the_host_copy(rt, tmp_path):
    """A batch keeps a chain of host data on the GPU, so its calls take device arrays. add(float16 device,
    float32 host) refuses the device input (it would have to convert it), where the call that waits takes
    a host array and promotes it: the batch's add takes the host copy, and the chain ends as the calls
    that wait do, bit for bit (it failed naming the dtypes before)."""
    rng = np.random.default_rng(1)
    x16 = rng.standard_normal((8, 64)).astype(np.float16)
    y32 = rng.standard_normal((8, 64)).astype(np.float32)
    with emulated_executor(rt, tmp_path, allow_fallback=False) as ex:
        want = ex.softmax(ex.add(ex.scale(x16, 2.0, backend="gpu"), y32, backend="gpu"), backend="gpu")
        with ex.batch() as b:
            s = ex.submit("scale", x16, 2.0, backend="gpu")
            a = ex.submit("add", s, y32, backend="gpu")
            p = ex.submit("softmax", a, backend="gpu")
        got = p.result(timeout=120)
        assert [side for _, _, side, _, _ in b.plan] == ["gpu"] * 3
    assert type(got) is np.ndarray and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
