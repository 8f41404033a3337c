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
