"""Review: device inputs written on another stream (CAI v3 "stream") must be waited for before the
kernels that read them are queued on the call's stream; CAI's legacy stream (1) is the null stream."""
import numpy as np
import pytest

import gpu_emulator
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu.memory import DeviceArray
from hipsched.ops import OPS

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


class RecordingRuntime(gpu_emulator.EmuRuntime):
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
    rt = RecordingRuntime()
    b = GpuBackend({"kernel_cache_dir": str(tmp_path)}, runtime=rt)
    assert b.available, b.unavailable_reason
    yield b, rt
    b.close()
    rt.close()


def _device(rt, host):
    from hipsched.gpu.memory import to_device
    return to_device(host, runtime=rt)


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


def test_dlpack_export_waits_for_null_stream_work(be):
    _, rt = be
    d = _device(rt, np.ones(4, np.float32))
    d.stream = 0   # written on the null stream, not yet complete
    rt.log.clear()
    d.__dlpack__(stream=5)   # consumer on another stream: the null stream's work must be finished
    assert ("sync", 0) in rt.log, rt.log
    rt.log.clear()
    d.__dlpack__()           # consumer on the legacy default stream: same stream, nothing to wait for
    d.__dlpack__(stream=-1)  # the consumer opted out
    assert not [e for e in rt.log if e[0] == "sync"], rt.log
