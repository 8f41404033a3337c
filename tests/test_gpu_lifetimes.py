"""Stream order and lifetimes of device memory, on the asynchronous kernel emulator (tests/gpu_emulator.py):
every stream runs late on its own thread, frees poison at once, and memcheck reports any use of freed
memory. Each test fails on code that frees or reads too early instead of passing by luck.

- Temporaries a call frees while its kernels are still queued: spreading's accumulators, top_k's
  buffers too large to keep, qmatmul's alignment copy, a scratch buffer replaced by a larger one, an
  upload in a call that mixes host and device inputs. Freed in stream order now (Runtime.free_async),
  after the work of every stream that used them (DeviceArray.record_stream)."""
import gc

import numpy as np
import pytest

import gpu_emulator
from hipsched import Executor, quantize
from hipsched.backends.cpu import CpuBackend
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu import context
from hipsched.gpu.memory import DeviceArray, to_device
from hipsched.gpu.streams import StreamPool
from hipsched.ops import OPS
from test_cpu_graph import random_graph

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

CPU = CpuBackend()
DELAY = 0.02   # per queued item: the host is always well ahead of the streams


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def rt(monkeypatch):
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    runtime = gpu_emulator.EmuRuntime(32, asynchronous=True, delay=DELAY)
    yield runtime
    runtime.close()   # raises if memcheck saw a use of freed memory


def backend(rt, kernel_dir, **config):
    be = GpuBackend({"kernel_cache_dir": kernel_dir, **config}, runtime=rt)
    assert be.available, be.unavailable_reason
    return be


def executor(rt, kernel_dir, tmp_path, **config):
    return Executor(gpu_backend=backend(rt, kernel_dir), persist_model=False, cache_dir=str(tmp_path),
                    allow_fallback=False, **config)


def cpu(op, *args, **kwargs):
    return CPU.run(OPS[op].prepare(*args, **kwargs))


def no_memcheck(rt):
    rt.synchronize()
    assert rt.memcheck_errors == []


# ---------------------------------------------------------------------- temporaries freed too early

def test_spreading_buffers_outlive_a_call_that_fails_half_way(rt, kernel_dir, rng, monkeypatch):
    """Seeds are host arrays, so a successful call synchronises before its buffers go; one whose later
    launch fails leaves the earlier steps queued, reading `acc`, `other` and `out` as they are freed."""
    be = backend(rt, kernel_dir)
    n = 40
    indptr, indices, weights = random_graph(rng, n, 200)
    graph = (indptr.astype(np.int32), indices.astype(np.int32), weights * np.float32(0.5))
    seeds = np.zeros(n, np.float32)
    seeds[:4] = 1
    launches = []
    real = be._ctx.launch

    def launch_then_fail(*args, **kwargs):
        launches.append(1)
        if len(launches) == 5:   # step 3's push: steps 1 and 2 are queued
            raise gpu_emulator.GpuError("launch", "injected", name="hipErrorLaunchFailure")
        return real(*args, **kwargs)
    monkeypatch.setattr(be._ctx, "launch", launch_then_fail)
    with pytest.raises(gpu_emulator.GpuError, match="injected"):
        be.run(OPS["spread_activation"].prepare(graph, seeds, 0.5, 4, 0.01))
    gc.collect()
    no_memcheck(rt)
    monkeypatch.setattr(be._ctx, "launch", real)
    np.testing.assert_allclose(be.run(OPS["spread_activation"].prepare(graph, seeds, 0.5, 3, 0.01)),
                               cpu("spread_activation", graph, seeds, 0.5, 3, 0.01), rtol=1e-5, atol=1e-6)
    be.close()


def test_top_k_buffers_too_large_to_keep(rt, kernel_dir, rng, monkeypatch):
    # what happens above 64 MiB, at a size the emulator runs: nothing is kept, every buffer goes at return
    monkeypatch.setattr(context, "SCRATCH_KEEP_BYTES", 0)
    be = backend(rt, kernel_dir)
    T = rng.standard_normal((5000, 6)).astype(np.float32)   # three segments: two selection passes
    q = rng.standard_normal((2, 6)).astype(np.float32)
    gi, gs = be.run(OPS["top_k"].prepare(to_device(q, runtime=rt), to_device(T, runtime=rt), 5))
    ci, cs = cpu("top_k", q, T, 5)
    np.testing.assert_array_equal(gi.get(), ci)
    np.testing.assert_allclose(gs.get(), cs, atol=5e-6)
    no_memcheck(rt)
    be.close()


def test_qmatmul_alignment_copy_outlives_the_call(rt, kernel_dir, rng):
    be = backend(rt, kernel_dir)
    W = quantize(rng.standard_normal((16, 64)).astype(np.float32), "q8_0")
    x = rng.standard_normal(64).astype(np.float32)
    base = to_device(np.concatenate([[0.0], x]).astype(np.float32), runtime=rt)
    misaligned = DeviceArray(base.ptr + 4, (64,), np.float32, rt, owner=base)   # not 16-byte aligned
    out = be.run(OPS["qmatmul"].prepare(W, misaligned))
    np.testing.assert_allclose(out.get(), cpu("qmatmul", W, x), rtol=1e-5, atol=1e-5)
    no_memcheck(rt)
    be.close()


def test_scratch_buffer_replaced_while_its_kernels_are_queued(rt, kernel_dir, rng):
    be = backend(rt, kernel_dir)
    T = rng.standard_normal((300, 8)).astype(np.float32)
    small, large = (rng.standard_normal((m, 8)).astype(np.float32) for m in (2, 9))
    dT = to_device(T, runtime=rt)
    # both on the null stream, nothing waited for between them: the second grows "scores" and "qinv"
    first = be.run(OPS["top_k"].prepare(to_device(small, runtime=rt), dT, 4))
    second = be.run(OPS["top_k"].prepare(to_device(large, runtime=rt), dT, 4))
    for (gi, gs), q in ((first, small), (second, large)):
        ci, cs = cpu("top_k", q, T, 4)
        np.testing.assert_array_equal(gi.get(), ci)
        np.testing.assert_allclose(gs.get(), cs, atol=5e-6)
    no_memcheck(rt)
    be.close()


def test_upload_in_a_mixed_host_and_device_call(rt, kernel_dir, rng):
    be = backend(rt, kernel_dir, resident_bytes=0)   # nothing kept resident: the upload goes at return
    a, b = rng.standard_normal((2, 999)).astype(np.float32)
    out = be.run(OPS["add"].prepare(to_device(a, runtime=rt), b))
    assert isinstance(out, DeviceArray)
    np.testing.assert_array_equal(out.get(), a + b)
    no_memcheck(rt)
    be.close()


def test_array_read_on_another_stream_is_freed_after_that_read(rt, kernel_dir, tmp_path, rng):
    x_host = rng.standard_normal(512).astype(np.float32)
    with executor(rt, kernel_dir, tmp_path) as ex, StreamPool(rt, n=2) as pool:
        made_on, read_on = pool.next(), pool.next()
        x = to_device(x_host, runtime=rt, stream=made_on)
        out = ex.scale(x, 2.0, backend="gpu", stream=read_on)
        del x      # its free must wait for the kernel queued on read_on, not only for made_on
        gc.collect()
        np.testing.assert_array_equal(out.get(), 2 * x_host)
        no_memcheck(rt)


def test_frees_after_the_pool_destroyed_the_stream(rt, kernel_dir, tmp_path, rng):
    x_host = rng.standard_normal(64).astype(np.float32)
    with executor(rt, kernel_dir, tmp_path) as ex:
        pool = StreamPool(rt, n=1)
        out = ex.scale(to_device(x_host, runtime=rt), 3.0, backend="gpu", stream=pool.next())
        got = out.get()
        pool.close()
        del out     # made on a stream that no longer exists: freed on the null stream instead
        gc.collect()
        np.testing.assert_array_equal(got, 3 * x_host)
        no_memcheck(rt)
