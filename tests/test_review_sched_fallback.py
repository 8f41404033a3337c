"""Review: the first-fallback warning must not hold a lock while logging (a handler may call the executor)."""
import logging
import threading

import numpy as np

from hipsched import Executor

from fake_gpu import FakeGpuBackend


def test_logging_handler_that_calls_the_executor_does_not_deadlock():
    kinds = iter(["launch", "timeout", "lost", "copy"] + ["launch"] * 100)
    gpu = FakeGpuBackend(ops=("add",), fail=lambda call: next(kinds))
    ex = Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None, breaker_failures=100,
                  health_min_samples=100, gpu_success_rate_threshold=0.0)
    a = np.ones((64, 64), np.float32)

    class Reentrant(logging.Handler):
        depth = 0

        def emit(self, record):
            if Reentrant.depth < 2:
                Reentrant.depth += 1
                ex.add(a, a, backend="gpu")   # fails with the next kind: its own first warning

    h = Reentrant()
    logger = logging.getLogger("hipsched")
    logger.addHandler(h)
    done = []
    t = threading.Thread(target=lambda: done.append(ex.add(a, a, backend="gpu")), daemon=True)
    try:
        t.start()
        t.join(10)
    finally:
        logger.removeHandler(h)
    assert done, "deadlocked: the warning lock was held while logging"
    np.testing.assert_array_equal(done[0], a + a)


def test_interrupted_half_open_probe_does_not_wedge_the_breaker():
    import time

    import pytest
    mode = {"v": "launch"}

    def fail(call):
        if mode["v"] == "interrupt":
            mode["v"] = None
            raise KeyboardInterrupt
        return mode["v"]

    gpu = FakeGpuBackend(ops=("add",), fail=fail)
    ex = Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None, breaker_cooldown_s=0.02,
                  strategy="gpu_preferred")
    a = np.ones((64, 64), np.float32)
    for _ in range(3):
        ex.add(a, a)
    assert ex.gpu_health("add")["state"] == "open"
    time.sleep(0.03)
    mode["v"] = "interrupt"
    with pytest.raises(KeyboardInterrupt):
        ex.add(a, a)          # the half-open probe is interrupted
    assert ex.gpu_health("add")["state"] != "half_open"
    time.sleep(0.03)
    ex.add(a, a)              # the next probe runs and closes the breaker
    assert ex.gpu_health("add")["state"] == "closed"
