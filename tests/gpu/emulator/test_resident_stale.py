"""The resident cache never serves a stale device copy (issue 19): one element of a 10M-element array
changed in place at 1,000 random positions, and the device copy (or the GPU's answer) checked against
the host after every change, for a writable array (never kept: each call uploads what is there now) and
for a registered one (ex.resident: each update reaches the kept copy). The cache under test is the real
one; the device is the kernel emulator (tests/support/gpu_emulator.py), a host-memory runtime where
only the bytes matter, or, for the tests marked `gpu`, a real GPU.

Before issue 19 a writable array was kept and reused while 256 sampled elements were unchanged, so
`T[i] = v` left the GPU answering from the old bytes while the CPU answered from the new ones."""
import ctypes

import numpy as np
import pytest

import gpu_emulator
from emulated_executor import emulated_executor
from hipsched import Executor
from hipsched.backends.gpu import create_gpu_backend
from hipsched.gpu.memory.resident_cache import ResidentCache
from host_memory import HostMemoryRuntime

N = 10_000_000          # elements: 40 MB of float32
CHANGES = 1000
GPU_CORPUS = (100_000, 128)   # rows x dims of the real-GPU top_k test

_libc = ctypes.CDLL(None)
_libc.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_libc.memcmp.restype = ctypes.c_int

needs_emulator = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


class PooledHostRuntime(HostMemoryRuntime):
    """Host memory standing in for device memory, freed buffers reused as a device's memory pool does,
    so the upload each call of a writable array needs costs one memcpy, not a fresh 40 MB allocation."""

    def __init__(self):
        super().__init__()
        self.spare = {}

    def malloc(self, n):
        bufs = self.spare.get(n)
        buf = bufs.pop() if bufs else np.empty(max(int(n), 1), np.uint8)
        self.buffers[buf.ctypes.data] = buf
        return buf.ctypes.data

    def free(self, ptr):
        buf = self.buffers.pop(ptr)
        self.spare.setdefault(buf.nbytes, []).append(buf)


def host_bytes_equal(dev, host) -> bool:
    """The device copy holds exactly the host's bytes (device memory is host memory here)."""
    return dev.nbytes == host.nbytes and _libc.memcmp(dev.ptr, host.ctypes.data, host.nbytes) == 0


def device_bytes_equal(dev, host) -> bool:
    """The same on a real device: the copy brought back."""
    return np.array_equal(dev.get().view(np.uint32), host.view(np.uint32))


def new_value(x):
    """A float32 that differs from x in every case (x + 1 would not for large x)."""
    return np.float32(-x - 1.0) if x >= 0 else np.float32(-x + 1.0)


@pytest.fixture(scope="module")
def emu():
    runtime = gpu_emulator.EmuRuntime(32)
    yield runtime
    runtime.close()


# ------------------------------------------------------------------ a writable array: never kept

def test_a_writable_array_changed_at_1000_random_positions_is_never_served_stale():
    rng = np.random.default_rng(19)
    cache = ResidentCache(PooledHostRuntime(), max_bytes=1 << 30)
    T = rng.standard_normal(N, dtype=np.float32)
    assert host_bytes_equal(cache.get(T), T)
    for i in rng.choice(N, CHANGES, replace=False):
        T[i] = new_value(T[i])
        dev = cache.get(T)        # what GpuContext.upload hands every kernel
        assert host_bytes_equal(dev, T), f"stale device copy after T[{i}] changed"
    assert cache.bytes == 0 and cache.hits == 0


@needs_emulator
def test_gpu_answers_follow_in_place_changes_of_a_writable_array(emu, tmp_path):
    """The same end to end through the Executor on the emulator (a few positions: an emulated pass
    over 10M elements takes a tenth of a second): every GPU answer equals the CPU's, and every GPU
    event says the whole array was uploaded, nothing reused."""
    rng = np.random.default_rng(20)
    T = rng.standard_normal(N, dtype=np.float32)
    with emulated_executor(emu, tmp_path) as ex:
        np.testing.assert_array_equal(ex.scale(T, 2.0, backend="gpu"), 2.0 * T)
        for i in rng.choice(N, 4, replace=False):
            T[i] = new_value(T[i])
            out = ex.scale(T, 2.0, backend="gpu")
            assert out[i] == 2.0 * T[i], f"GPU answered from the old T[{i}]"
            np.testing.assert_array_equal(out, ex.scale(T, 2.0, backend="cpu"))
        gpu_events = [e for e in ex.events if e["backend"] == "gpu"]
        assert len(gpu_events) == 5
        assert all(e["resident"] == {"uploaded": T.nbytes, "reused": 0} for e in gpu_events)


@needs_emulator
def test_top_k_on_the_gpu_sees_a_row_edited_in_place(emu, tmp_path):
    """The symptom of issue 19: an embedding index edited with T[i] = v, and top_k giving other
    indices depending on which side ran. Each edited row is made the best match, so a stale GPU copy
    cannot hide. The rows are ones a check of 256 evenly spaced elements would not look at, as most
    rows of a real corpus are (the corpus is small: an emulated top_k takes seconds)."""
    rng = np.random.default_rng(21)
    n, d = 1024, 16
    T = rng.standard_normal((n, d), dtype=np.float32)
    q = rng.standard_normal(d, dtype=np.float32)
    step = T.size // 256
    unsampled = [i for i in range(n) if all((i * d + c) % step for c in range(d))]
    with emulated_executor(emu, tmp_path) as ex:
        ex.top_k(q, T, 10, backend="gpu")
        for j, i in enumerate(rng.choice(unsampled, 2, replace=False)):
            T[i] = q * (j + 1)
            gi, gs = ex.top_k(q, T, 10, backend="gpu")
            ci, cs = ex.top_k(q, T, 10, backend="cpu")
            assert gi[0] == i, f"the GPU missed row {i}: stale corpus"
            np.testing.assert_array_equal(gi, ci)
            np.testing.assert_allclose(gs, cs, rtol=1e-5, atol=1e-6)
            T[i] = -q                  # the worst match from now on: the next edited row is the best


# ------------------------------------------------------------------ a registered array: kept, updated

@needs_emulator
def test_a_registered_array_updated_at_1000_random_positions_stays_in_step(emu, tmp_path):
    rng = np.random.default_rng(22)
    T = rng.standard_normal(N, dtype=np.float32)
    with emulated_executor(emu, tmp_path) as ex:
        ctx = ex._gpu._ctx
        idx = ex.resident(T)
        assert idx.host is T and not T.flags.writeable
        uploaded = ctx.resident.transfer_totals()[0]
        for n, i in enumerate(rng.choice(N, CHANGES, replace=False)):
            idx.update(i, new_value(T[i]))
            dev = ctx.upload(T, 0)     # the kept copy every kernel reads
            assert host_bytes_equal(dev, T), f"stale device copy after update({i})"
            if n % 250 == 0:           # and the answers, both sides, through the handle and the array
                out = ex.scale(idx, 2.0, backend="gpu")
                np.testing.assert_array_equal(out, 2.0 * T)
                np.testing.assert_array_equal(ex.scale(T, 2.0, backend="gpu"), out)
                np.testing.assert_array_equal(ex.scale(idx, 2.0, backend="cpu"), out)
                assert ex.events[-2]["resident"] == {"uploaded": 0, "reused": T.nbytes}
        assert ctx.resident.transfer_totals()[0] == uploaded, "a registered array was uploaded again"
        with pytest.raises(ValueError, match="read-only"):
            T[0] = 1.0                 # a direct write raises instead of going stale
        idx.release()
        assert T.flags.writeable and ctx.resident.bytes == 0


@needs_emulator
def test_top_k_through_a_handle_after_row_updates(emu, tmp_path):
    rng = np.random.default_rng(23)
    T = rng.standard_normal((256, 32), dtype=np.float32)
    q = rng.standard_normal(32, dtype=np.float32)
    with emulated_executor(emu, tmp_path) as ex, ex.resident(T) as idx:
        for j, i in enumerate(rng.choice(len(T), 3, replace=False)):
            idx.update([i], (q * (j + 1))[None, :])
            gi, gs = ex.top_k(q, idx, 10, backend="gpu")
            ci, cs = ex.top_k(q, idx, 10, backend="cpu")
            assert gi[0] == i
            np.testing.assert_array_equal(gi, ci)
            np.testing.assert_allclose(gs, cs, rtol=1e-5, atol=1e-6)
            assert ex.events[-2]["resident"]["uploaded"] == q.nbytes   # the query only
            idx.update(i, -q)


# ------------------------------------------------------------------ on a real GPU

@pytest.fixture
def real_executor(tmp_path):
    gpu = create_gpu_backend()
    if not gpu.available:
        pytest.skip(f"no GPU: {gpu.unavailable_reason}")
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path)) as ex:
        yield ex


@pytest.mark.gpu
def test_gpu_writable_array_changed_at_1000_random_positions(real_executor):
    ex, rng = real_executor, np.random.default_rng(24)
    T = rng.standard_normal(N, dtype=np.float32)
    ex.scale(T, 2.0, backend="gpu")
    for i in rng.choice(N, CHANGES, replace=False):
        T[i] = new_value(T[i])
        out = ex.scale(T, 2.0, backend="gpu")
        assert ex.events[-1]["backend"] == "gpu"
        assert np.array_equal(out, 2.0 * T), f"GPU answered from a stale copy after T[{i}] changed"


@pytest.mark.gpu
def test_gpu_registered_array_updated_at_1000_random_positions(real_executor):
    ex, rng = real_executor, np.random.default_rng(25)
    T = rng.standard_normal(N, dtype=np.float32)
    ctx = ex._gpu._ctx
    with ex.resident(T) as idx:
        uploaded = ctx.resident.transfer_totals()[0]
        for n, i in enumerate(rng.choice(N, CHANGES, replace=False)):
            idx.update(i, new_value(T[i]))
            if n % 10 == 0:
                assert device_bytes_equal(ctx.upload(T, 0), T), f"stale device copy after update({i})"
            out = ex.scale(idx, 2.0, backend="gpu")
            assert np.array_equal(out, 2.0 * T), f"GPU answered from a stale copy after update({i})"
        assert ctx.resident.transfer_totals()[0] == uploaded
        assert device_bytes_equal(ctx.upload(T, 0), T)


@pytest.mark.gpu
def test_gpu_top_k_sees_edited_rows(real_executor):
    ex, rng = real_executor, np.random.default_rng(26)
    T = rng.standard_normal(GPU_CORPUS, dtype=np.float32)
    q = rng.standard_normal(GPU_CORPUS[1], dtype=np.float32)
    ex.top_k(q, T, 10, backend="gpu")
    for j, i in enumerate(rng.choice(len(T), 20, replace=False)):
        T[i] = q * (j + 1)
        gi, _ = ex.top_k(q, T, 10, backend="gpu")
        assert gi[0] == i
        np.testing.assert_array_equal(gi, ex.top_k(q, T, 10, backend="cpu")[0])
        T[i] = -q
    with ex.resident(T) as idx:
        for j, i in enumerate(rng.choice(len(T), 20, replace=False)):
            idx.update(i, q * (j + 100))
            gi, _ = ex.top_k(q, idx, 10, backend="gpu")
            assert gi[0] == i and ex.events[-1]["resident"]["reused"] == T.nbytes
            np.testing.assert_array_equal(gi, ex.top_k(q, idx, 10, backend="cpu")[0])
            idx.update(i, -q)
