"""A child forked after the parent ran OpenMP kernels must not hang (libgomp's pool does not survive
fork): multiprocessing's fork start method and worker pools do exactly this. The child runs kernels
single-threaded, with the same results; a spawned child (fresh process) keeps all threads."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp
    import numpy as np
    import hipsched as hs

    def child(_):
        # quant, graph and attention are first imported here, after the fork
        x = np.random.default_rng(1).random((512, 512), dtype=np.float32)
        w = hs.quantize(x, "q8_0")
        g = (np.arange(513, dtype=np.int64), np.arange(512, dtype=np.int64), np.ones(512, np.float32))
        a = hs.attention(x[None, None, :128, :64].copy(), x[None, None, :128, :64].copy(),
                         x[None, None, :128, :64].copy())
        return (float(hs.softmax(x).sum()), float(hs.qmatmul(w, x[0]).sum()),
                float(hs.spread_activation(g, np.ones(512, np.float32), 0.5, 2, 0.0).sum()),
                float(a.sum()), hs.cpu_features()["threads"])

    if __name__ == "__main__":
        x = np.random.default_rng(1).random((2048, 2048), dtype=np.float32)
        hs.softmax(x)  # the parent starts OpenMP's thread pool
        with mp.get_context("fork").Pool(2) as pool:
            results = pool.map(child, range(4))
        parent = child(0)[:4]  # after the pool, so the children were first to import these modules
        for r in results:
            assert r[4] == 1, r
            assert all(abs(a - b) <= 1e-3 * max(1.0, abs(b)) for a, b in zip(r[:4], parent)), (r, parent)
        with mp.get_context("spawn").Pool(1) as pool:
            spawned = pool.apply(hs.cpu_features)["threads"]
        assert spawned == hs.cpu_features()["threads"], spawned
        print("ok", results[0][4], spawned)
""")


def test_forked_children_do_not_hang(tmp_path):
    script = tmp_path / "fork_check.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok 1 ")


def test_forked_child_gets_its_own_default_executor():
    import os

    import numpy as np

    import hipsched as hs
    hs.add(np.ones(4), np.ones(4))
    parent = hs.default_executor()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        hs.add(np.ones(4), np.ones(4))
        fresh = hs.default_executor()
        os._exit(0 if fresh is not parent and fresh.stats().total_operations == 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert hs.default_executor() is parent


def test_fork_then_exec_gets_all_threads():
    """A forked child that execs a new program is a fresh process: its kernels may use every thread."""
    import os

    import numpy as np

    import hipsched as hs
    hs.softmax(np.ones((64, 64), np.float32))
    threads = hs.cpu_features()["threads"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, then becomes another program
        os.dup2(w, 1)
        os.execv(sys.executable, [sys.executable, "-c", "import hipsched; print(hipsched.cpu_features()['threads'])"])
    os.close(w)
    out = os.read(r, 100).decode().strip()
    os.waitpid(pid, 0)
    assert out == str(threads)


# The GPU side of fork: CUDA and HIP state does not survive fork(), and the child keeps the parent's
# runtime object. The real ctypes CUDA binding runs on tests/support/fake_cuda_driver.py, which answers
# CUDA_ERROR_NOT_INITIALIZED to every call after a fork, as libcuda does.
GPU_SCRIPT = textwrap.dedent("""
    import gc, json, os, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import hipsched as hs
    from hipsched.errors import GpuError
    from hipsched.gpu.bindings import detect, libs
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    from hipsched.gpu.memory.device_array import to_device
    from fake_cuda_driver import FakeCudaDriver, fake_nvrtc

    driver = FakeCudaDriver(version=13000, devices=1)
    real_open = libs.open_library
    libs.open_library = lambda kind: (driver, "/fake/libcuda.so.1") if kind == "cuda" else real_open(kind)
    rt = CtypesRuntime("cuda")
    rt._compiler = fake_nvrtc(13, 0)
    detect._state.update(runtime=rt, attempts=[detect.RuntimeAttempt("cuda", True, None)])  # as a probe leaves it
    ex = hs.Executor(strategy="gpu_preferred", gpu_min_batch_size=1, persist_model=False)
    assert ex.capabilities().gpu_available
    x = np.arange(4096, dtype=np.float32)
    keep = to_device(x, runtime=rt)      # freed in the child, by its finalizer
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = {}
        try:
            before = len(driver.calls)
            out["results_ok"] = all(np.array_equal(ex.add(x, x), x + x) for _ in range(10))
            out["module_ok"] = np.array_equal(hs.add(x, x), x + x)   # the child's own default executor
            del keep
            gc.collect()
            try:
                rt.malloc(16)
            except GpuError as e:
                out["malloc"] = [e.kind, e.name]
            out["driver_calls"] = len(driver.calls) - before
            out["fallbacks"] = [e["fallback"]["error"] for e in ex.events if e["fallback"]]
            out["reasons"] = sorted({e["reason"] for e in ex.events})
            out["detect"] = detect.unavailable_reason()
            caps = hs.default_executor().capabilities()
            out["default_gpu"] = [caps.gpu_available, list(caps.reasons)]
        except BaseException as e:
            out["error"] = repr(e)
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    print(data.decode())
""")


def test_forked_child_falls_back_once_without_touching_the_driver(tmp_path):
    import json
    import os
    from pathlib import Path
    script = tmp_path / "gpu_fork.py"
    script.write_text(GPU_SCRIPT)
    env = dict(os.environ, HIPSCHED_CACHE_DIR=str(tmp_path / "cache"), HIPSCHED_GPU_RUNTIME="auto")
    r = subprocess.run([sys.executable, str(script), str(Path(__file__).resolve().parents[1] / "support")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    assert out["results_ok"] and out["module_ok"]
    assert out["malloc"] == ["unavailable", "forked-child"]
    assert out["driver_calls"] == 0                  # not one call into the parent's driver
    # The first call finds the GPU gone, in the scheduler's free-memory query or (when the parent's
    # answer is still fresh) in the run, which then falls back once with the reason; every later call
    # is decided gpu_unavailable without trying
    assert len(out["fallbacks"]) <= 1 and all("forked child" in f and "spawn" in f for f in out["fallbacks"])
    assert set(out["reasons"]) <= {"cpu_fallback", "gpu_unavailable"} and "gpu_unavailable" in out["reasons"]
    assert "forked child" in out["detect"]
    assert out["default_gpu"][0] is False and any("forked child" in x for x in out["default_gpu"][1])


def test_driver_not_initialized_is_one_reason_not_a_retry_storm(monkeypatch, tmp_path):
    """What the child saw before the fork guard, and what any binding that still reaches a dead driver
    sees: CUDA_ERROR_NOT_INITIALIZED on every call. The backend gives up after the first."""
    import numpy as np

    import hipsched as hs
    from hipsched.backends.gpu import GpuBackend
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    from fake_cuda_driver import FakeCudaDriver, fake_nvrtc, install
    driver = install(monkeypatch, FakeCudaDriver(version=13000, devices=1))
    rt = CtypesRuntime("cuda")
    rt._compiler = fake_nvrtc(13, 0)
    backend = GpuBackend({"kernel_cache_dir": str(tmp_path)}, runtime=rt)
    ex = hs.Executor(gpu_backend=backend, strategy="gpu_preferred", gpu_min_batch_size=1, persist_model=False,
                     telemetry_enabled=True)
    driver.forked = True                             # the driver is gone; the binding does not know
    x = np.arange(4096, dtype=np.float32)
    for _ in range(10):
        np.testing.assert_array_equal(ex.add(x, x), x + x)
    assert driver.calls_after_fork == 1
    assert backend.available is False and "CUDA_ERROR_NOT_INITIALIZED" in backend.unavailable_reason
    assert {e["reason"] for e in ex.events} == {"gpu_unavailable"}
    caps = ex.capabilities()
    assert not caps.gpu_available and any("CUDA_ERROR_NOT_INITIALIZED" in r for r in caps.reasons)
    ex.close()
