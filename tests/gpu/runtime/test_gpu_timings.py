"""Timing device work with events, through the real ctypes CUDA binding on the fake libcuda
(tests/support/fake_cuda_driver.py): the call engine (GpuContext.engine, gpu/launch/_callpath.pyx) records
an event before and after a glue run's work, reads the pair back without waiting once the work has run,
reuses the events, and caps the readings pending."""
import time

from hipsched.gpu.launch import _callpath
from hipsched.gpu.launch.context import GpuContext

from fake_cuda_driver import FakeCudaDriver, install


def _context(monkeypatch):
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    driver = install(monkeypatch, FakeCudaDriver(version=13000, devices=1))
    ctx = GpuContext(CtypesRuntime("cuda"))
    return ctx, ctx.engine, driver


def test_a_timing_is_read_back_without_waiting_and_its_events_reused(monkeypatch):
    ctx, e, driver = _context(monkeypatch)
    start = e.start_timing(0)
    time.sleep(0.02)                      # the "work" between the two events
    ticket = e.stop_timing(start, 0)
    [(got, us)] = e.read_timings()
    assert got == ticket and 20e3 <= us < 2000e3
    assert "cuEventQuery" in driver.calls and "cuEventSynchronize" not in driver.calls
    assert e.read_timings() == []            # read once
    created = driver.calls.count("cuEventCreate")
    e.stop_timing(e.start_timing(0), 0)
    assert [t for t, _ in e.read_timings()] == [ticket + 1]
    assert driver.calls.count("cuEventCreate") == created   # from the pool
    ctx.close()


def test_pending_timings_are_capped_and_a_failed_calls_timing_is_dropped(monkeypatch):
    ctx, e, driver = _context(monkeypatch)
    for _ in range(_callpath.MAX_PENDING_TIMINGS):
        assert e.stop_timing(e.start_timing(0), 0) is not None
    assert e.start_timing(0) == 0       # the device is far behind: further calls go untimed
    assert len(e.read_timings()) == _callpath.MAX_PENDING_TIMINGS
    start = e.start_timing(0)
    e.cancel_timing(start)              # the call failed: nothing to read
    assert e.read_timings() == []
    ctx.close()


def test_a_reading_that_cannot_be_taken_is_reported_lost(monkeypatch):
    ctx, e, driver = _context(monkeypatch)
    ticket = e.stop_timing(e.start_timing(0), 0)
    driver.event_times.clear()            # the driver no longer knows the events as recorded
    assert e.read_timings() == [(ticket, None)]
    ctx.close()
