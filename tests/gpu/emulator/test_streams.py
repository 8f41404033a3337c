"""Stream handle normalisation and StreamPool assignment, events and lifecycle. Without a GPU the pool
runs on RecordingRuntime, a test double that hands out handles and records the calls; the real-device
version is marked gpu."""
import ctypes

import pytest

from hipsched.errors import GpuError
from hipsched.gpu.memory.streams import StreamPool, as_stream_handle


class RecordingRuntime:
    def __init__(self):
        self.next_handle = 100
        self.calls = []

    def _new(self, kind):
        self.next_handle += 1
        self.calls.append((kind, self.next_handle))
        return self.next_handle

    def stream_create(self):
        return self._new("stream_create")

    def event_create(self):
        return self._new("event_create")

    def __getattr__(self, name):   # stream_destroy, event_record, stream_wait_event, ...
        if name.startswith(("stream_", "event_")):
            return lambda *args: self.calls.append((name,) + args)
        raise AttributeError(name)


class CupyLike:
    ptr = 0xAAA0


class TorchLike:
    cuda_stream = 0xBBB0


class Handle:
    handle = 0xCCC0


@pytest.mark.parametrize("obj,expected", [
    (None, 0), (0, 0), (12345, 12345), (CupyLike(), 0xAAA0), (TorchLike(), 0xBBB0), (Handle(), 0xCCC0),
    (ctypes.c_void_p(0xDDD0), 0xDDD0), (ctypes.c_void_p(None), 0),
])
def test_as_stream_handle(obj, expected):
    assert as_stream_handle(obj) == expected


@pytest.mark.parametrize("bad", ["0x10", 1.5, -1, True, object()])
def test_as_stream_handle_rejects(bad):
    with pytest.raises(GpuError):
        as_stream_handle(bad)


def test_round_robin():
    rt = RecordingRuntime()
    pool = StreamPool(rt, n=3)
    assert len(pool) == 3
    got = [pool.next() for _ in range(7)]
    assert got == pool.streams * 2 + pool.streams[:1]
    assert len(set(pool.streams)) == 3


def test_per_phase_is_stable_and_wraps():
    pool = StreamPool(RecordingRuntime(), n=2, mode="per_phase")
    a, b, c = pool.next("reservoir"), pool.next("search"), pool.next("rerank")
    assert pool.next("reservoir") == a and pool.next("search") == b
    assert a != b and c == a                 # third phase wraps onto the first stream
    assert pool.next(None) in pool.streams


def test_sequential_uses_the_null_stream():
    rt = RecordingRuntime()
    pool = StreamPool(rt, n=4, sequential=True)
    assert {pool.next(), pool.next("x")} == {0}
    assert not any(c[0] == "stream_create" for c in rt.calls)
    pool.synchronize()
    assert ("stream_synchronize", 0) in rt.calls


def test_events_order_streams_and_close_releases_everything():
    rt = RecordingRuntime()
    with StreamPool(rt, n=2) as pool:
        s1, s2 = pool.next(), pool.next()
        ev = pool.record(s1)
        pool.wait(s2, ev)
        assert ("event_record", ev, s1) in rt.calls and ("stream_wait_event", s2, ev) in rt.calls
        streams = list(pool.streams)
    assert all(("stream_destroy", s) in rt.calls for s in streams)
    assert ("event_destroy", ev) in rt.calls
    with pytest.raises(GpuError):
        pool.next()
    pool.close()                              # idempotent


def test_bad_arguments():
    with pytest.raises(ValueError):
        StreamPool(RecordingRuntime(), mode="random")
    with pytest.raises(ValueError):
        StreamPool(RecordingRuntime(), n=0)


@pytest.mark.gpu
def test_real_streams_with_events():
    import numpy as np
    from hipsched.gpu.bindings import detect
    from hipsched.gpu.memory.device_array import to_device
    rt = detect.get_runtime()
    with StreamPool(rt, n=2) as pool:
        s1, s2 = pool.next(), pool.next()
        host = np.arange(1 << 20, dtype=np.float32)
        d = to_device(host, runtime=rt, stream=s1)
        ev = pool.record(s1)
        pool.wait(s2, ev)
        out = np.empty_like(host)
        rt.memcpy_dtoh(out.ctypes.data, d.ptr, host.nbytes, s2)
        pool.synchronize()
        np.testing.assert_array_equal(out, host)


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_gpu_streams.py): Review: device inputs written on another stream (CAI v3 "stream") must be waited for before the
# kernels that read them are queued on the call's stream; CAI's legacy stream (1) is the null stream.
# ----------------------------------------------------------------------------------------------------
import numpy as np

import gpu_emulator
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu.memory.device_array import DeviceArray
from hipsched.ops import OPS

_needs_emulator = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


class EmuRecordingRuntime(gpu_emulator.EmuRuntime):
    """The emulator, logging the ordering calls (and still making them: under HIPSCHED_EMU_ASYNC=1 the
    streams really run late, so a missing wait shows in the values too)."""

    def __init__(self, warp=32):
        super().__init__(warp)
        self.log = []

    def event_record(self, event, stream=0):
        self.log.append(("record", event, stream))
        super().event_record(event, stream)

    def stream_wait_event(self, stream, event):
        self.log.append(("wait", stream, event))
        super().stream_wait_event(stream, event)

    def stream_synchronize(self, stream):
        self.log.append(("sync", stream))
        super().stream_synchronize(stream)

    def launch(self, function, grid, block, args, shared_bytes=0, stream=0):
        self.log.append(("launch", stream))
        return super().launch(function, grid, block, args, shared_bytes, stream)


class Foreign:
    """A CAI v3 producer whose data was written on `stream`."""

    def __init__(self, dev, stream):
        self._dev, self._stream = dev, stream

    @property
    def __cuda_array_interface__(self):
        cai = dict(self._dev.__cuda_array_interface__)
        cai["stream"] = self._stream
        return cai


@pytest.fixture
def be(tmp_path, monkeypatch):
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    rt = EmuRecordingRuntime()
    b = GpuBackend({"kernel_cache_dir": str(tmp_path)}, runtime=rt)
    assert b.available, b.unavailable_reason
    yield b, rt
    b.close()
    rt.close()


def _device(rt, host):
    from hipsched.gpu.memory.device_array import to_device
    return to_device(host, runtime=rt)


@_needs_emulator
def test_foreign_stream_waited_before_launch(be):
    b, rt = be
    a = np.arange(8, dtype=np.float32)
    d = _device(rt, a)
    x = DeviceArray.from_external(Foreign(d, 77), runtime=rt)
    rt.log.clear()
    out = b.run(OPS["scale"].prepare(x, 2.0), stream=5)
    np.testing.assert_array_equal(out.get(), a * 2)
    first_launch = next(i for i, e in enumerate(rt.log) if e[0] == "launch")
    before = rt.log[:first_launch]
    waited = [e for e in before if e[0] == "wait" and e[1] == 5] + [e for e in before if e == ("sync", 77)]
    recorded = {e[1] for e in before if e[0] == "record" and e[2] == 77}
    assert any(e[0] == "sync" for e in waited) or any(e[2] in recorded for e in waited if e[0] == "wait"), rt.log


@_needs_emulator
def test_same_stream_needs_no_wait(be):
    b, rt = be
    d = _device(rt, np.ones(8, np.float32))
    x = DeviceArray.from_external(Foreign(d, 5), runtime=rt)
    rt.log.clear()
    b.run(OPS["scale"].prepare(x, 2.0), stream=5)
    # no cross-stream ordering; the one record is the marker after the launch that holds the foreign
    # input alive until the kernel has read it
    assert not [e for e in rt.log if e[0] == "wait"], rt.log
    assert [e[0] for e in rt.log] == ["launch", "record"] and rt.log[-1][2] == 5, rt.log


@_needs_emulator
def test_cai_legacy_stream_is_null_stream(be):
    _, rt = be
    d = _device(rt, np.ones(4, np.float32))
    x = DeviceArray.from_external(Foreign(d, 1), runtime=rt)
    # 1 (CU_STREAM_LEGACY) is no stream handle on HIP: the legacy default stream is the null stream
    assert x.stream == 0
    np.testing.assert_array_equal(x.get(), np.ones(4, np.float32))


class DLPackProducer:
    """A DLPack producer (the capsule comes from a DeviceArray)."""

    def __init__(self, dev):
        self._dev = dev

    def __dlpack__(self, stream=None, **kwargs):
        return self._dev.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._dev.__dlpack_device__()


@_needs_emulator
def test_dlpack_input_ordered_after_legacy_stream(be):
    # __dlpack__() without a stream: the producer only guarantees the data for the legacy default
    # stream, so a call on another stream must wait on the null stream first.
    b, rt = be
    a = np.arange(8, dtype=np.float32)
    d = _device(rt, a)
    x = DeviceArray.from_external(DLPackProducer(d), runtime=rt)
    rt.log.clear()
    out = b.run(OPS["scale"].prepare(x, 3.0), stream=5)
    np.testing.assert_array_equal(out.get(), a * 3)
    first_launch = next(i for i, e in enumerate(rt.log) if e[0] == "launch")
    before = rt.log[:first_launch]
    recorded = {e[1] for e in before if e[0] == "record" and e[2] == 0}
    assert any(e[0] == "wait" and e[1] == 5 and e[2] in recorded for e in before), rt.log


@_needs_emulator
def test_dlpack_export_waits_for_null_stream_work(be):
    _, rt = be
    d = _device(rt, np.ones(4, np.float32))
    d.stream = 0   # written on the null stream, not yet complete
    rt.log.clear()
    d.__dlpack__(stream=5)   # consumer on another stream: it waits for the null stream's work, the host does not
    recorded = {e[1] for e in rt.log if e[0] == "record" and e[2] == 0}
    assert any(e[0] == "wait" and e[1] == 5 and e[2] in recorded for e in rt.log), rt.log
    assert not [e for e in rt.log if e[0] == "sync"], rt.log
    # the consumer's kernels read it on its stream: its free waits for them too
    assert 5 in d._allocation().streams
    rt.log.clear()
    d.__dlpack__()           # consumer on the legacy default stream: same stream, nothing to wait for
    d.__dlpack__(stream=-1)  # the consumer opted out
    assert not [e for e in rt.log if e[0] == "sync"], rt.log
