"""Measured copies: a GPU backend that times a run's uploads and its kernel apart (Judgement.parts) gives
the model the kernel's time as it is and the link's time per octave of bytes, whatever the link probe
said; one that cannot leaves the split unknown (the modelled copies are taken off its wall time)."""
import numpy as np
import pytest

from hipsched import Executor, _sched
from sim_gpu import GPU_US, SimClock, latency_us, simulated_machine
from sim_machine import Machine

# a real link 2x slower than the probe reports (as noisy-slow-link machines in bench/machines)
SLOW = Machine(name="slow", sigma=0.0, h2d_latency_us=22.2, h2d_pinned_gbps=5.875, h2d_pageable_gbps=5.875,
               pageable_large_gbps=4.25, d2h_gbps=6.1)


def _run_top_k(machine, tmp_path, n=12):
    clock = SimClock()
    rng = np.random.default_rng(0)
    q = rng.standard_normal(768, dtype=np.float32)
    with clock.executor_clock(), Executor(cache_dir=str(tmp_path), persist_model=False, telemetry_enabled=False,
                                          **simulated_machine(clock, machine=machine)) as ex:
        for i in range(n):
            T = rng.standard_normal((2048 * (1 + i % 3), 768), dtype=np.float32)   # writable: uploaded each call
            ex.top_k(q, T, 10, backend="gpu")
        core = ex._core
        s = core.slot("top_k", "float32")
        return core, s, {T.nbytes for T in [np.empty((2048 * (1 + i % 3), 768), np.float32) for i in range(3)]}


def test_uploads_timed_apart_teach_the_link_and_leave_the_kernel_its_own_time(tmp_path):
    core, s, sizes = _run_top_k(SLOW, tmp_path)
    for nbytes in sizes:   # the real link, not the probe's twice-as-fast one
        assert core.upload_us(nbytes) == pytest.approx(SLOW.h2d_us(nbytes, False), rel=0.02)
    assert core.link_model() and all(r == pytest.approx(1.95, rel=0.1) for _, _, r in core.link_model())
    size = 2048 * 768
    assert core.predict(s, _sched.BACKEND_GPU, size) == pytest.approx(latency_us(GPU_US, "top_k", size), rel=0.02)


def test_a_backend_that_cannot_time_its_parts_leaves_the_split_unknown(tmp_path):
    """Without parts the model learns no link (the probe's stays) and the sample is the wall time less
    the probe's copies: on the slow link the kernel looks slower than it is, which is why timing parts
    matters."""
    core, s, sizes = _run_top_k(Machine(**{**SLOW.to_dict(), "times_parts": False}), tmp_path)
    assert core.link_model() == []
    nbytes = min(sizes)
    assert core.upload_us(nbytes) == pytest.approx(11.1 + nbytes / 11.75e3, rel=1e-6)
    size = 2048 * 768
    kernel = latency_us(GPU_US, "top_k", size)
    wall = kernel + SLOW.h2d_us(nbytes + 768 * 4, False)
    assert core.predict(s, _sched.BACKEND_GPU, size) == pytest.approx(
        wall - (11.1 + (nbytes + 768 * 4) / 11.75e3), rel=0.05)
