"""Stream handle normalisation and StreamPool assignment, events and lifecycle. Without a GPU the pool
runs on RecordingRuntime, a test double that hands out handles and records the calls; the real-device
version is marked gpu."""
import ctypes

import pytest

from hipsched.errors import GpuError
from hipsched.gpu.streams import StreamPool, as_stream_handle


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
    from hipsched.gpu import detect
    from hipsched.gpu.memory import to_device
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
