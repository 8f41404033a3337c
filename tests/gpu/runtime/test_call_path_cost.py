"""What a GPU call on device arrays costs the host once its launch plan is known (the compiled call path,
hipsched/gpu/launch/_callpath.pyx and hipsched/_dispatch.pyx): no Python function between the Executor's method
and the driver, one launch per kernel, nothing else asked of the driver that the call does not need.
Counted on the C fake libcuda (tests/support/fake_libcuda.c), whose calls return at once; times are
bench/dispatch.py's business, counts are exact and belong here."""
import sys

import numpy as np
import pytest

import fake_libcuda

import hipsched as hs
from hipsched.gpu.memory.device_array import DeviceArray, to_device

pytestmark = pytest.mark.skipif(not fake_libcuda.available(), reason="no C compiler to build the fake libcuda")

# The bound: Python function calls per GPU call on device arrays
MAX_PY_CALLS = 25


def python_calls(fn):
    """(Python function calls, C function calls) made by fn() (sys.setprofile's events), fn's own
    frame not counted."""
    counts = {"call": 0, "c_call": 0}

    def prof(frame, event, arg):
        if event in counts:
            counts[event] += 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts["call"] - 1, counts["c_call"]


@pytest.fixture
def gpu_ex(monkeypatch):
    be = fake_libcuda.backend(monkeypatch)
    assert be.callpath is not None, "the ctypes CUDA runtime on a C library must offer the compiled path"
    ex = hs.Executor(gpu_backend=be, persist_model=False)
    yield ex, be
    ex.close()


def dev(be, host):
    return to_device(np.ascontiguousarray(host), runtime=be._ctx.rt)


@pytest.mark.parametrize("op", ["add", "scale", "softmax", "top_k", "cosine_similarity"])
def test_a_replayed_call_runs_no_python_function(gpu_ex, op):
    ex, be = gpu_ex
    rng = np.random.default_rng(0)
    x = dev(be, rng.standard_normal(8).astype(np.float32))
    T = dev(be, rng.standard_normal((100, 8)).astype(np.float32))
    args = {"add": (x, x), "scale": (x, 0.5), "softmax": (x,), "top_k": (x, T, 5), "cosine_similarity": (x, T)}[op]
    call = getattr(ex, op)
    call(*args, backend="gpu")   # the first: the glue runs, recorded
    assert ex._fast.plan_count == 1
    py, _ = python_calls(lambda: call(*args, backend="gpu"))
    # the op method itself is the one Python frame; nothing else may creep in
    assert py <= 1 < MAX_PY_CALLS, f"{op}: {py} Python calls on a replayed GPU call"


def test_replay_launches_what_the_glue_launched(gpu_ex, monkeypatch):
    ex, be = gpu_ex
    q = dev(be, np.ones(8, np.float32))
    T = dev(be, np.ones((5000, 8), np.float32))
    fake_libcuda.reset()
    ex.top_k(q, T, 3, backend="gpu")
    glue_launches = fake_libcuda.launches()
    runs = []
    real = type(be)._run
    monkeypatch.setattr(type(be), "_run", lambda self, *a: runs.append(a) or real(self, *a))
    fake_libcuda.reset()
    out = ex.top_k(q, T, 3, backend="gpu")
    assert runs == []                               # the glue did not run
    assert fake_libcuda.launches() == glue_launches > 1
    idx, scores = out
    assert isinstance(idx, DeviceArray) and idx.shape == (3,) and idx.dtype == np.int64
    assert scores.shape == (3,) and scores.dtype == np.float32
    ev = ex.events[-1]
    assert (ev["op"], ev["backend"], ev["reason"], ev["fallback"]) == ("top_k", "gpu", "user_preference", None)


def test_the_key_tells_calls_apart(gpu_ex):
    """Every input a call's plan depends on is in its key: shapes, dtypes, scalars, overlapping inputs."""
    ex, be = gpu_ex
    x, y = dev(be, np.ones(8, np.float32)), dev(be, np.ones(8, np.float32))
    ex.add(x, y, backend="gpu")
    ex.add(x, y, backend="gpu")
    assert ex._fast.plan_count == 1
    ex.add(x, x, backend="gpu")                      # the same shapes, but one input twice
    ex.add(dev(be, np.ones(16, np.float32)), dev(be, np.ones(16, np.float32)), backend="gpu")
    ex.add(dev(be, np.ones(8, np.float16)), dev(be, np.ones(8, np.float16)), backend="gpu")
    ex.scale(x, 0.5, backend="gpu")
    ex.scale(x, 2.0, backend="gpu")
    assert ex._fast.plan_count == 6


def test_small_writable_host_arrays_are_staged_and_others_take_the_glue(gpu_ex):
    """A small writable host array is uploaded on every call: the compiled path stages it (one copy up,
    one down, one wait). A read-only one may be kept resident, and a large one has its uploads shared
    across calls: those are the resident cache's, through the glue."""
    ex, be = gpu_ex
    a = np.ones(64, np.float32)
    ex.add(a, a, backend="gpu")
    assert ex._fast.plan_count == 1
    py, _ = python_calls(lambda: ex.add(a, a, backend="gpu"))
    out = ex.add(a, a, backend="gpu")
    assert isinstance(out, np.ndarray) and out.shape == (64,) and out.dtype == np.float32
    assert py == 1
    assert ex.events[-1]["resident"] == {"uploaded": 512, "reused": 0}   # a, twice, as the glue uploads it
    frozen = np.ones(64, np.float32)
    frozen.flags.writeable = False
    big = np.ones(1 << 18, np.float32)   # 1 MiB
    for x in (frozen, big):
        ex.add(x, x, backend="gpu")
        ex.add(x, x, backend="gpu")
    assert ex._fast.plan_count == 1


def test_a_closed_backend_replays_nothing(gpu_ex):
    """The very call whose plan is kept (same arrays, same key) after the backend closed: nothing reaches
    the driver's launch, and the CPU gives the answer (the fake's device memory is host memory, so its
    inputs can be read back; its kernels never run, so a GPU answer would not be this one)."""
    ex, be = gpu_ex
    a = np.random.default_rng(3).standard_normal(8).astype(np.float32)
    x = dev(be, a)
    ex.add(x, x, backend="gpu")
    ex.add(x, x, backend="gpu")
    assert ex._fast.plan_count == 1 and ex.events[-1]["backend"] == "gpu"
    be.close()
    assert not be.callpath.enabled
    fake_libcuda.reset()
    out = ex.add(x, x, backend="gpu")   # falls back, no crash
    assert fake_libcuda.launches() == 0
    ev = ex.events[-1]
    # decided for the CPU because the GPU is gone, not a replay that failed and fell back
    assert (ev["op"], ev["backend"], ev["reason"], ev["fallback"]) == ("add", "cpu", "gpu_unavailable", None), ev
    assert isinstance(out, DeviceArray)   # where its inputs live, as any device-data call
    np.testing.assert_array_equal(out.get(), a + a)


def test_info_says_how_gpu_calls_reach_the_driver(monkeypatch, capsys):
    """`hipsched info` names the call path: compiled on a runtime with C entry points (the fake libcuda
    under the ctypes binding), the glue only on one without (a test double)."""
    from hipsched.cli import info
    from hipsched.gpu.bindings import detect
    rt = fake_libcuda.runtime(monkeypatch)
    monkeypatch.setattr(detect, "get_runtime", lambda: rt)
    monkeypatch.setattr(detect, "attempts", lambda: [detect.RuntimeAttempt("cuda", True, None)])
    got = info.gather()["call_path"]
    assert got["compiled"] and got["vendor"] == "cuda" and got["host_staging"]
    info.run(type("Args", (), {"json": False})())
    assert "GPU call path: compiled (cuda driver entry points from " in capsys.readouterr().out

    class Double:
        name = "double"

        def c_entry_points(self):
            return None
    assert info._call_path(Double()) == {"compiled": False, "why": "the double runtime offers no C entry points: "
                                                                    "every GPU call runs the Python launch glue"}
