"""Calls on data that lives on a further GPU (an executor's device other than its own GPU): such a call
runs on that device, where its data is, decided by that device's own core (its breaker, its measured
times) from its backend's judgement of the call. The dispatcher (hipsched/_dispatch.pyx) hands a call
here once it has found that all its device inputs live on one further device; a failure there is
handled as any GPU failure, in the dispatcher's one place for it (FastPath._gpu_failed), and a call the
device will not take runs on the CPU with its copies."""
from __future__ import annotations

import logging

from . import _dispatch
from ._sched import (BACKEND_GPU as GPU, F_CALL_UNSUPPORTED, F_FITS, F_GPU_PRESENT, F_GPU_SUPPORTS, F_ON_DEVICE,
                     F_WANT_GPU, R_GPU_UNAVAILABLE, R_GPU_UNSUPPORTED)
from .device_arrays import device_indices
from .errors import GpuError

log = logging.getLogger("hipsched")


class FurtherGpus:
    """An executor's further GPUs, each a splitting.Side (its backend and its own core), by device index.
    `fast` is the executor's FastPath: its core (the CPU's predictions: one CPU), its count of a CPU run's
    copies, its CPU run of device data, its failure handling and telemetry."""

    def __init__(self, sides, fast):
        self.by_index = {s.backend.device_index: s for s in sides}
        self.fast, self.core = fast, fast.core
        self.device_copy_bytes = fast.device_copy_bytes
        self.allow_fallback, self.reason_str = fast.allow_fallback, fast.reason_str

    def sides(self) -> list:
        return list(self.by_index.values())

    def side_for(self, call):
        """The further GPU all of `call`'s device inputs live on, or None (inputs on the executor's own GPU
        or on several devices take the executor's GPU's decision: for mixed devices, the CPU, which can
        read every array)."""
        devices = device_indices(call.args)
        return self.by_index.get(devices.pop()) if len(devices) == 1 else None

    def decide(self, side, call, slot: int, want: int, commit: bool):
        """(the device core's slot, backend, reason, predicted cpu us, predicted gpu us, detail) of a call
        on a further GPU's data. That device's own core decides, from its backend's judgement of the call
        and its breaker: it decides as gpu_preferred (Executor._device_core), so a device that is up,
        takes the call and is healthy runs it where its data is. The executor's model, which weighs the
        CPU's copies against its own GPU's measured times, has no such times for this device (its runs
        leave their work queued and are not timed). The CPU's prediction is the executor's core's (one
        CPU), the GPU's this device's own, else the executor's GPU's."""
        g, core = side.backend, side.core
        flags = F_GPU_PRESENT | F_GPU_SUPPORTS | F_FITS | F_ON_DEVICE | want
        detail = None
        try:
            if not g.available:
                flags &= ~F_GPU_PRESENT
                detail = g.unavailable_reason
            elif not g.supports(call.op, call.dtype) or call.size > g.max_elements(call.op):
                flags &= ~F_GPU_SUPPORTS
            else:
                j = call.judged = g.judge(call)
                if j.refusal is not None:
                    flags |= F_CALL_UNSUPPORTED
                    detail = j.refusal
                elif not g.available:   # a query found the device gone
                    flags &= ~F_GPU_PRESENT
                    detail = g.unavailable_reason
                elif not j.fits:
                    flags &= ~F_FITS
        except Exception as e:  # a failing query means the device cannot be trusted with this call
            log.debug("hipsched: GPU %s query failed for %s: %s", g.device_index, call.op, e)
            flags &= ~F_GPU_SUPPORTS
        up, down = self.device_copy_bytes(call)
        s_slot = core.slot(call.op, call.dtype)
        be, reason, _, pg = core.decide(s_slot, call.size, up, down, flags, commit)
        _, _, pc, main_pg = self.core.decide(slot, call.size, up, down, F_ON_DEVICE, False)
        if pg != pg:   # NaN: not measured on this device yet
            pg = main_pg
        if reason != R_GPU_UNSUPPORTED and reason != R_GPU_UNAVAILABLE:
            detail = None
        return s_slot, be, reason, pc, pg, detail

    def run(self, side, call, slot: int, want: int, stream):
        """Run a call on a further GPU's data on that device, through its backend: the result stays
        there, as a run on the executor's GPU leaves it. Its health is that device's core's (the one its
        split parts answer to), never the executor's GPU's; a failure reruns on the CPU, as there."""
        s_slot, be, reason, pc, pg, detail = self.decide(side, call, slot, want, True)
        g, core, fast = side.backend, side.core, self.fast
        if be != GPU:
            if want == F_WANT_GPU and not self.allow_fallback:
                raise GpuError("unsupported" if reason == R_GPU_UNSUPPORTED else "unavailable",
                               f"{call.op}: backend='gpu' was asked for but GPU {g.device_index}, where its inputs "
                               f"live, cannot take this call ({self.reason_str[reason]}"
                               f"{': ' + str(detail) if detail else ''})")
            return fast._run_cpu_device(call, slot, reason, pc, pg, stream, detail=detail)
        clock = _dispatch._perf_ns   # the general path's clock (a simulated one in tests/support/sim_gpu.py)
        t0 = clock()
        try:
            out = g.run(call, stream)
        except Exception as e:  # noqa: BLE001 - any GPU-side failure falls back, whatever its type
            return fast._gpu_failed(core, g, call, slot, s_slot, e, (clock() - t0) * 1e-3, 0.0, 0.0,
                                    pc, pg, stream, side.name, False)
        except BaseException:  # interrupted: the breaker must still see an outcome (see FastPath._run_gpu)
            core.record_gpu_failure(s_slot, call.size)
            raise
        dur = (clock() - t0) * 1e-3
        # the work is left queued on the device: a success for its breaker, but no completion time
        core.record_gpu_queued(s_slot, call.size)
        self.core.count_gpu_run(-1.0)
        if fast.tel is not None:
            fast.tel.record(call.op, "gpu", self.reason_str[reason], call.size, call.dtype, call.nbytes, dur, pc, pg,
                            stream=stream, gpu_device=g.device_index)
        return out
