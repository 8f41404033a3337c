"""Review: hip-python binding. hipSetDevice is per host thread, so a runtime set to device 1 must
still allocate/launch on device 1 when used from another thread."""
import threading

import pytest

from hipsched.gpu import hip_python


class FakeHip:
    def __init__(self):
        self.tls = threading.local()
        self.calls = []

    def _dev(self):
        return getattr(self.tls, "device", 0)

    def hipGetDeviceCount(self):
        return (0, 2)

    def hipSetDevice(self, index):
        self.tls.device = index
        return (0,)

    def hipMalloc(self, nbytes):
        self.calls.append(("malloc", self._dev()))
        return (0, 4096)

    def hipFree(self, ptr):
        self.calls.append(("free", self._dev()))
        return (0,)

    def hipStreamCreateWithFlags(self, flags):
        self.calls.append(("stream", self._dev()))
        return (0, 8)


@pytest.fixture
def rt(monkeypatch):
    fake = FakeHip()
    monkeypatch.setattr(hip_python, "_import_hip", lambda: fake)
    r = hip_python.HipPythonRuntime()
    r.set_device(1)
    return r, fake


def test_other_thread_uses_selected_device(rt):
    r, fake = rt

    def work():
        r.free(r.malloc(16))
        r.stream_create()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert fake.calls == [("malloc", 1), ("free", 1), ("stream", 1)]


def test_same_thread_unchanged(rt):
    r, fake = rt
    r.malloc(16)
    assert fake.calls == [("malloc", 1)]
