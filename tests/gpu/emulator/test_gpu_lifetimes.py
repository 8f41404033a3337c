"""Stream order and lifetimes of device memory, on the asynchronous kernel emulator (tests/support/gpu_emulator.py):
every stream runs late on its own thread, frees poison at once, and memcheck reports any use of freed
memory. Each test fails on code that frees or reads too early instead of passing by luck.

- Temporaries a call frees while its kernels are still queued: spreading's accumulators, top_k's
  buffers too large to keep, qmatmul's alignment copy, a scratch buffer replaced by a larger one, an
  upload in a call that mixes host and device inputs. Freed in stream order now (Runtime.free_async),
  after the work of every stream that used them (DeviceArray.record_stream).
- Foreign arrays: a producer writing on a non-blocking stream (PyTorch exports CAI version 2, without a
  stream; its DLPack handshake orders our stream), and a caller dropping its tensor right after the
  call while our kernels that read it are queued (held until an event says they ran)."""
import gc
import weakref

import numpy as np
import pytest

import gpu_emulator
from hipsched import Executor, quantize
from hipsched.backends.cpu import CpuBackend
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu.launch import context
from hipsched.gpu.memory import dlpack
from hipsched.gpu.memory.device_array import DeviceArray, to_device
from hipsched.gpu.memory.streams import StreamPool
from hipsched.ops import OPS
from graph_data import random_graph

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
    real = rt.launch   # the runtime's: planned launches reach it without passing GpuContext.launch

    def launch_then_fail(*args, **kwargs):
        launches.append(1)
        if len(launches) == 5:   # step 3's push: steps 1 and 2 are queued
            raise gpu_emulator.GpuError("launch", "injected", name="hipErrorLaunchFailure")
        return real(*args, **kwargs)
    monkeypatch.setattr(rt, "launch", launch_then_fail)
    with pytest.raises(gpu_emulator.GpuError, match="injected"):
        be.run(OPS["spread_activation"].prepare(graph, seeds, 0.5, 4, 0.01))
    gc.collect()
    no_memcheck(rt)
    monkeypatch.setattr(rt, "launch", real)
    np.testing.assert_allclose(be.run(OPS["spread_activation"].prepare(graph, seeds, 0.5, 3, 0.01)),
                               cpu("spread_activation", graph, seeds, 0.5, 3, 0.01), rtol=1e-5, atol=1e-6)
    be.close()


def test_top_k_buffers_too_large_to_keep(rt, kernel_dir, rng, monkeypatch):
    # what happens above 64 MiB, at a size the emulator runs: nothing is kept, every buffer goes at return
    monkeypatch.setattr(context, "SCRATCH_KEEP_BYTES", 0)
    be = backend(rt, kernel_dir)
    T = rng.standard_normal((2500, 6)).astype(np.float32)   # two segments: two selection passes
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


# ---------------------------------------------------------------------- foreign arrays

class TorchLikeTensor:
    """What PyTorch offers for a CUDA tensor, on the emulator: __cuda_array_interface__ version 2 (no
    stream) and __dlpack__(stream=...), which makes the consumer's stream wait for the tensor's stream
    with an event (None or 1: the legacy default stream). Its memory comes from its own allocator,
    which reuses it the moment the tensor goes: freed (poisoned) in __del__."""

    def __init__(self, rt, host, stream, write_after=0.3):
        self.rt, self.stream, self.shape = rt, stream, host.shape
        self.ptr = rt.malloc(host.nbytes)
        self.dlpack_streams = []
        rt.stall(stream, write_after)       # a long kernel first: the data lands late
        rt.memcpy_htod(self.ptr, host.ctypes.data, host.nbytes, stream)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": "<f4", "data": (self.ptr, False), "version": 2, "strides": None}

    def __dlpack_device__(self):
        return (dlpack.kDLCUDA, 0)

    def __dlpack__(self, stream=None):
        self.dlpack_streams.append(stream)
        consumer = 0 if stream in (None, 1) else stream
        if consumer != self.stream:
            event = self.rt.event_create()
            self.rt.event_record(event, self.stream)
            self.rt.stream_wait_event(consumer, event)
            self.rt.event_destroy(event)
        return dlpack.make_capsule(self.ptr, self.shape, None, np.float32, (dlpack.kDLCUDA, 0), owner=self)

    def __del__(self):
        self.rt.free(self.ptr)


def test_producer_on_a_non_blocking_stream_is_waited_for(rt, kernel_dir, tmp_path, rng):
    host = rng.standard_normal(300).astype(np.float32)
    producer = rt.stream_create()
    with executor(rt, kernel_dir, tmp_path) as ex:
        ex.scale(host, 1.0, backend="gpu")   # compiled first: compiling would outlast the producer
        t = TorchLikeTensor(rt, host, producer)
        np.testing.assert_array_equal(ex.scale(t, 2.0, backend="gpu").get(), 2 * host)   # the null stream
        assert t.dlpack_streams == [1]      # CUDA's legacy default stream, as the protocol spells it
        with StreamPool(rt, n=1) as pool:
            s = pool.next()
            t = TorchLikeTensor(rt, host, producer)
            np.testing.assert_array_equal(ex.scale(t, 3.0, backend="gpu", stream=s).get(), 3 * host)
            assert t.dlpack_streams == [s]       # the handshake named the stream that read it
        no_memcheck(rt)


def test_foreign_input_dropped_right_after_the_call(rt, kernel_dir, tmp_path, rng):
    host = rng.standard_normal(300).astype(np.float32)
    with executor(rt, kernel_dir, tmp_path) as ex, StreamPool(rt, n=1) as pool:
        s = pool.next()
        t = TorchLikeTensor(rt, host, s, write_after=0)
        gone = weakref.ref(t)
        out = ex.scale(t, 2.0, backend="gpu", stream=s)
        del t         # the caller is done with it; our kernel is still queued on s
        gc.collect()
        np.testing.assert_array_equal(out.get(), 2 * host)
        assert gone() is not None                # held until a call finds the kernel has read it ...
        ex.scale(np.ones(4, np.float32), 1.0, backend="gpu", stream=s)   # ... and let go by a later call
        gc.collect()
        assert gone() is None
        no_memcheck(rt)


def test_foreign_input_of_a_failed_call_is_held_too(rt, kernel_dir, rng, monkeypatch):
    """A call that fails half way has launched kernels that read the input: hold it all the same."""
    be = backend(rt, kernel_dir)
    host = rng.standard_normal(64).astype(np.float32)
    t = TorchLikeTensor(rt, host, 0, write_after=0)
    gone = weakref.ref(t)
    from hipsched.gpu.ops import elementwise
    real = elementwise.scale

    def scale_then_fail(ctx, call, stream):
        real(ctx, call, stream)
        raise RuntimeError("after the launch")
    monkeypatch.setitem(be._fns, "scale", scale_then_fail)
    call = OPS["scale"].prepare(t, 2.0)
    del t
    with pytest.raises(Exception, match="after the launch"):
        be.run(call)
    del call
    gc.collect()
    assert gone() is not None
    rt.synchronize()
    be._ctx.engine.reap()
    gc.collect()
    assert gone() is None
    no_memcheck(rt)
    be.close()
