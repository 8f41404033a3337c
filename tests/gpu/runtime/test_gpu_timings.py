"""Timing device work with events (issue 19, item 3), through the real ctypes CUDA binding on the fake libcuda
(tests/support/fake_cuda_driver.py): GpuContext records an event before and after a call's work, reads
the pair back without waiting once the work has run, reuses the events, and caps the readings pending."""
import time

from hipsched.gpu.launch import context
from hipsched.gpu.launch.context import GpuContext

from fake_cuda_driver import FakeCudaDriver, install


def _context(monkeypatch):
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    driver = install(monkeypatch, FakeCudaDriver(version=13000, devices=1))
    return GpuContext(CtypesRuntime("cuda")), driver


def test_a_timing_is_read_back_without_waiting_and_its_events_reused(monkeypatch):
    ctx, driver = _context(monkeypatch)
    start = ctx.start_timing(0)
    time.sleep(0.02)                      # the "work" between the two events
    ticket = ctx.stop_timing(start, 0)
    [(got, ms)] = ctx.timings()
    assert got == ticket and 20 <= ms < 2000
    assert "cuEventQuery" in driver.calls and "cuEventSynchronize" not in driver.calls
    assert ctx.timings() == []            # read once
    created = driver.calls.count("cuEventCreate")
    ctx.stop_timing(ctx.start_timing(0), 0)
    assert [t for t, _ in ctx.timings()] == [ticket + 1]
    assert driver.calls.count("cuEventCreate") == created   # from the pool
    ctx.close()


def test_pending_timings_are_capped_and_a_failed_calls_timing_is_dropped(monkeypatch):
    ctx, driver = _context(monkeypatch)
    for _ in range(context.MAX_PENDING_TIMINGS):
        assert ctx.stop_timing(ctx.start_timing(0), 0) is not None
    assert ctx.start_timing(0) is None    # the device is far behind: further calls go untimed
    assert len(ctx.timings()) == context.MAX_PENDING_TIMINGS
    start = ctx.start_timing(0)
    ctx.cancel_timing(start)              # the call failed: nothing to read
    assert ctx.timings() == []
    ctx.close()


def test_a_reading_that_cannot_be_taken_is_reported_lost(monkeypatch):
    ctx, driver = _context(monkeypatch)
    ticket = ctx.stop_timing(ctx.start_timing(0), 0)
    driver.event_times.clear()            # the driver no longer knows the events as recorded
    assert ctx.timings() == [(ticket, None)]
    ctx.close()
