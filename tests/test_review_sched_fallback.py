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
