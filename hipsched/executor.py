"""Executor: validate -> decide -> run -> (on GpuError) rerun on CPU -> record.

The decision and the performance model live in the Cython core (hipsched._sched); this module wires
it to the backends, the telemetry and the model store. A GPU failure never reaches the caller unless
allow_fallback is False: the call reruns on the CPU and the event records the error."""
from __future__ import annotations

import collections
import inspect
import logging
import math
import sys
import threading
import time
import weakref
from contextlib import nullcontext

import numpy as np

from . import _dispatch, _sched
from .backends.cpu import CpuBackend
from .calibration import calibrate
from .chunking import chunkable, run_chunked
from .config import HybridConfig
from .errors import GpuError
from .backends.interface import GpuBackendBase
from .faults import FaultInjectingBackend
from .gguf_blocks import QuantizedTensor
from .model_store import ModelPersistence
from .ops import OPS
from .ops.base import Call
from .resident import ResidentArray
from .scheduling import (BACKENDS, REASONS, BackendSelection, ExecutorCapabilities, OpCapability,
                         PerformanceTracker, us_or_none)

log = logging.getLogger("hipsched")

_perf_ns = time.perf_counter_ns
_F_PRESENT, _F_SUPPORTS, _F_FITS = _sched.F_GPU_PRESENT, _sched.F_GPU_SUPPORTS, _sched.F_FITS
_F_WANT_CPU, _F_WANT_GPU, _F_UNSUPPORTED = _sched.F_WANT_CPU, _sched.F_WANT_GPU, _sched.F_CALL_UNSUPPORTED
_CPU, _GPU, _R_FALLBACK = _sched.BACKEND_CPU, _sched.BACKEND_GPU, _sched.R_CPU_FALLBACK
_REASON_STR = tuple(r.value for r in REASONS)
# Device-data GPU runs timed by events (two records, a query and a reading: a few microseconds of a
# ~170 us launch path on an H100): every one of an (op, dtype)'s first _TIME_FIRST, then 1 in
# _TIME_EVERY, which still refills a model window every few hundred calls.
_TIME_FIRST = 64
_TIME_EVERY = 8

# Host inputs at least this large have their uses counted, so that their upload can be spread over
# the calls that reuse them (Executor._amortized_h2d); smaller uploads cost little next to a launch.
_REUSE_MIN_BYTES = 1 << 20
_REUSE_MAX_TRACKED = 4096   # arrays whose uses are counted at once (dead ones go first when full)
# how many of the last inputs' predicted savings are kept (their median predicts a new input's worth),
# and how many make a prediction
_USE_HISTORY = 32
_USE_HISTORY_MIN = 3


def _large_host_arrays(x, out):
    """(array, trusted) for the host NumPy arrays among a call's arguments of at least _REUSE_MIN_BYTES;
    trusted: a QuantizedTensor's block bytes, which its contract says never change."""
    if isinstance(x, np.ndarray):
        if x.nbytes >= _REUSE_MIN_BYTES:
            out.append((x, False))
    elif isinstance(x, (tuple, list)):
        for item in x:
            _large_host_arrays(item, out)
    elif isinstance(x, QuantizedTensor) and x.data.nbytes >= _REUSE_MIN_BYTES:
        out.append((x.data, True))
    return out


_MAX_PENDING = 1024   # entries of Executor._timed / _early: far more than the device keeps readings for


def _bounded_put(d, key, value):
    """d[key] = value, dropping the oldest entry past _MAX_PENDING (a sample lost, never a wrong one)."""
    if len(d) >= _MAX_PENDING:
        try:
            del d[next(iter(d))]
        except (StopIteration, KeyError, RuntimeError):   # emptied or changed by another thread
            pass
    d[key] = value


class _NoGpu(GpuBackendBase):
    """Stands in when no GPU backend can be created (its module missing or broken)."""

    def __init__(self, reason):
        self.unavailable_reason = reason


def _create_gpu(config):
    try:
        # deferred: the GPU side loads only when an Executor looks for a GPU (it may be missing or broken)
        from .backends.gpu import create_gpu_backend
    except Exception as e:  # the GPU layer is optional: its absence must not break the CPU path
        return _NoGpu(f"hipsched.backends.gpu cannot load: {type(e).__name__}: {e}")
    try:
        return create_gpu_backend(config)
    except Exception as e:  # the contract says it never raises; stay safe if it does
        return _NoGpu(f"GPU backend failed to start: {type(e).__name__}: {e}")


def _create_telemetry(config, device):
    if not config.telemetry_enabled:
        return None
    try:
        # deferred and guarded: a telemetry that cannot load costs the event log only
        from .telemetry import Telemetry, path_from_env
    except ImportError as e:
        log.warning("hipsched: telemetry unavailable (%s); only counters are kept", e)
        return None
    return Telemetry(path=config.telemetry_path or path_from_env(), ring_size=config.telemetry_ring_size,
                     queue_size=config.telemetry_queue_size, rotate_bytes=config.telemetry_rotate_bytes,
                     device=device, worker=config.telemetry_worker, job=config.telemetry_job)


class Executor:
    """Runs each op on the backend predicted to finish first. `config` is a HybridConfig (None: read
    the TOML file and HIPSCHED_* variables); keyword `overrides` set config fields; `gpu_backend`
    replaces the GPU backend (an object implementing the GpuBackend interface); `cpu_backend` replaces
    the CPU engine with an object that has CpuBackend's `run(call)` and `run_device_data(call)` (a
    simulated machine in tests/support): every call then takes the general path, none the compiled
    kernels directly."""

    def __init__(self, config=None, *, gpu_backend=None, cpu_backend=None, **overrides):
        if config is None:
            config = HybridConfig(**overrides)
        elif overrides:
            values = {k: v for k, v in config.as_dict().items() if k != "num_threads"}
            values.update(overrides)
            config = HybridConfig(config_file=False, env={}, **values)
        self.config = cfg = config
        self._cpu = cpu_backend if cpu_backend is not None else CpuBackend()
        # what a CPU run of device data copies: the backend's own count, else CpuBackend's (it depends on
        # the call alone)
        self._device_copy_bytes = getattr(self._cpu, "device_copy_bytes", CpuBackend.device_copy_bytes)
        gpu = gpu_backend if gpu_backend is not None else _create_gpu(cfg)
        self._injector = None
        if cfg.fault_inject and gpu.available:
            gpu = self._injector = FaultInjectingBackend(gpu, cfg.fault_inject)
        self._gpu = gpu
        self._gpu_present = bool(gpu.available)
        # GPU runs on device data return with their work queued: they are timed by events on their
        # stream, read on a later call (see _learn_gpu_times); a backend without them is not
        self._run_timed = gpu.run_timed if self._gpu_present else None
        self._timed = {}            # ticket -> (slot, size, host us) of such runs not yet learned from
        # ticket -> device us of readings that came before their run stored its entry (another thread
        # polled in between); bounded, like _timed, so a reading or an entry that never meets its
        # other half cannot grow them for the life of the process
        self._early = {}
        self._timed_runs = {}       # slot -> device-data GPU runs so far (which to time)
        self._core = _sched.SchedCore(
            window=cfg.performance_window_size, min_batch=cfg.gpu_min_batch_size, min_samples=cfg.min_samples,
            exploration_share=cfg.exploration_share, reprobe_interval=cfg.reprobe_interval,
            strategy=cfg.strategy, backend_only=cfg.backend, force_cpu=cfg.force_cpu_mode,
            breaker_failures=cfg.breaker_failures, health_min_samples=cfg.health_min_samples,
            success_threshold=cfg.gpu_success_rate_threshold, speedup_threshold=cfg.gpu_speedup_threshold,
            cooldown_s=cfg.breaker_cooldown_s)
        self._tel = _create_telemetry(cfg, gpu.device_name if self._gpu_present else "cpu")
        self._slots = {}            # (op, dtype) -> (core slot, capability flags, GPU max size, CPU fn, HotOp)
        self._prepare = {name: spec.prepare for name, spec in OPS.items()}
        # id(host array) -> [weakref, calls that passed it, a GPU run took it, predicted us those calls
        # would save on the GPU with it resident]
        self._uses = {}
        # predicted time saved on the GPU by the calls that passed each of the last new inputs, by the
        # time the next new one came (see _amortized_h2d), and the entry of the newest
        self._gain_history = collections.deque(maxlen=_USE_HISTORY)
        self._newest_use = None
        self._uses_lock = threading.Lock()
        self._tls = threading.local()   # .what_if: deciding for select_backend; .h2d: (id(call), real bytes)
        self._warned = set()
        self._warn_lock = threading.Lock()
        self._closed = False
        self.performance_tracker = PerformanceTracker(self._core)
        self._fast = _dispatch.FastPath(self._core, self._prepare, self._slots, self._slot, self._prepare_missing,
                                     self._gpu_terms, self._run_gpu, self._run_other,
                                     self._tel.recorder if self._tel is not None else None, cfg.gpu_min_batch_size,
                                     cfg.allow_fallback, _REASON_STR,
                                     gpu.callpath if self._gpu_present else None,
                                     self._compiled_gpu_failed)
        self._run = self._fast.run  # (op, backend, stream, *args, **kwargs): every op method goes through it
        version = getattr(sys.modules.get("hipsched"), "__version__", "0")
        self._model = ModelPersistence(self._core, cfg.cache_dir,
                                       gpu.device_name if self._gpu_present else None, version)
        self._save_at_exit = None
        if cfg.persist_model:
            self._model.load()
            # the model outlives processes that never call close() (the module-level default executor)
            self._save_at_exit = weakref.finalize(self, self._model.save_quietly)
        if self._gpu_present and not self._model.transfer_known:
            self._measure_transfer()

    def _run_on_stream(self, op, backend, stream, *args, **kwargs):
        """`_run` for a call given a stream: foreign device arrays among its arguments are taken with
        that stream as the consumer (DeviceArray.from_external), so their producer orders exactly the
        stream that reads them after its pending writes."""
        # deferred: the GPU layer loads only for a call given a stream (it may be missing or broken)
        from .gpu.memory.device_array import consumer_stream
        with consumer_stream(stream):
            return self._run(op, backend, stream, *args, **kwargs)

    def _measure_transfer(self):
        try:
            self._core.set_transfer(**self._gpu.measure_transfer())
            self._model.transfer_known = True
        except Exception as e:  # keep the default link model; the GPU may still work
            log.warning("hipsched: could not measure host<->device transfers (%s); assuming a PCIe link", e)

    def save_model(self, path=None) -> str:
        """Writes the learned model to its file in the cache directory (or to `path`); returns the path."""
        return self._model.save(path)

    # ------------------------------------------------------------------ the hot path
    def _slot(self, op, dtype):
        """(core slot, capability flags, GPU max size, CPU function or None, HotOp or None) of (op, dtype),
        cached."""
        key = (op, dtype)
        s = self._slots.get(key)
        if s is None:
            flags, max_size = 0, 0
            if self._gpu_present:
                flags |= _F_PRESENT
                try:
                    if self._gpu.supports(op, dtype):
                        flags |= _F_SUPPORTS
                        max_size = int(self._gpu.max_elements(op))
                except Exception as e:
                    log.warning("hipsched: GPU capability query for %s/%s failed (%s); using the CPU", op, dtype, e)
            try:
                fn = self._cpu._fns.get(op) or self._cpu._load(op)
            except (ImportError, KeyError, AttributeError):
                fn = None  # reported when a call needs it (select_backend works without it)
            spec = OPS.get(op)
            hot = spec.hot_op() if spec is not None and dtype == "float32" and fn is not None else None
            s = self._slots[key] = (self._core.slot(op, dtype), flags, max_size, fn, hot)
        return s

    def _gpu_terms(self, call, flags, max_size):
        """(capability flags, host->device bytes, device->host bytes, detail) for a call that could go
        to the GPU, from the backend's judgement of it (GpuBackendBase.judge). A refusal (a shape the
        kernels do not take, a launch past this target's limits) is found there, before anything is
        uploaded or launched; detail is its text, or, when the queries find the GPU gone (a driver that
        refuses our code, a forked child), why."""
        gpu = self._gpu
        if not gpu.available:  # it went away since (forked child, driver refused our code)
            return flags & ~_F_PRESENT, 0, 0, None
        if call.size > max_size:
            return flags & ~_F_SUPPORTS, 0, 0, None
        try:
            why, fits, h2d, d2h = gpu.judge(call)
            if why is not None:
                return flags | _F_UNSUPPORTED, 0, 0, why
            if not gpu.available:  # a query found the GPU gone
                return flags & ~_F_PRESENT, 0, 0, gpu.unavailable_reason
            if not fits:
                flags &= ~_F_FITS
            # device data: the copies the CPU would make (the core charges them to the CPU side)
            if call.on_device:
                h2d, d2h = self._device_copy_bytes(call)
        except Exception as e:  # a failing query means the GPU cannot be trusted with this call
            log.debug("hipsched: GPU query failed for %s: %s", call.op, e)
            return flags & ~_F_SUPPORTS, 0, 0, None
        self._tls.h2d = (id(call), h2d)   # the id, not the call: holding it would keep its inputs alive
        if not call.on_device:
            h2d = self._amortized_h2d(call, h2d)
        return flags, h2d, d2h, None

    def _amortized_h2d(self, call, h2d):
        """The upload a decision charges this call: an input the GPU would keep resident (the backend's
        `would_keep`: bytes that cannot change unseen, within the resident budget) and that earlier
        calls already passed is charged its upload divided by its uses so far, this one included.
        Charging every call the whole upload made the scheduler keep a reused corpus on the CPU for
        good, since only a GPU run makes it resident (on the H100, 64
        top_k calls over one 231 MB corpus ran on the CPU at 7.7 ms, against 0.33 ms resident). With
        this rule the upload is paid once the CPU time lost by not paying it would exceed it (the
        ski-rental rule: at most twice the best of either choice in hindsight). The reduction is
        capped at the call's upload, which counts only inputs not already resident.
        The rule also learns what inputs are worth: for each of the last new inputs it notes what the
        calls that passed it would have saved on the GPU with it resident (the model's predictions), by
        the time the next new input came. With a few noted, a call is charged the upload in proportion
        to its own saving over the median of those totals, when that is less: the upload is then worth
        paying exactly when the calls over an input are predicted to save more than it costs, and each
        call gains (how the oracle of `hipsched demo --oracle` shares an upload, learned from the calls
        so far instead of known in hindsight; a search that runs each new corpus slice through 8 top_k
        queries and then a 32-query cosine pays the slice's upload at its first query, which the
        cosine would pay anyway). An input still in use when the next comes (weights reused by every
        layer) is noted short of its total, so the prediction errs towards the plain rule. A writable array
        is uploaded by every GPU call that takes it (a change to it could not be seen), so its upload
        is never shared, and neither is any on a backend that cannot say what it keeps."""
        keeps, resident = self._gpu.would_keep, self._gpu.is_resident
        arrays = _large_host_arrays(call.args, [])
        if not arrays:
            return h2d
        commit = not getattr(self._tls, "what_if", False)
        saved = 0.0
        gain = self._resident_gain(call)
        with self._uses_lock:
            uses = self._uses
            history = self._gain_history
            worth = sorted(history)[len(history) // 2] if len(history) >= _USE_HISTORY_MIN else 0.0
            for a, trusted in arrays:
                e = uses.get(id(a))
                if e is not None and e[0]() is not a:   # a dead array's id, reused
                    e = None
                k = e[1] if e is not None else 0
                # an input a GPU run already took and that this call would upload again was not kept
                # (a backend without a resident cache, or evicted): its uploads are not shared
                kept = e is None or not e[2] or h2d < a.nbytes
                # an input already resident is not in h2d: nothing of it to spread
                if kept and keeps(a, trusted) and not resident(a):
                    share = 1.0 / (k + 1)
                    if worth > 0.0 and gain > 0.0:
                        share = min(share, gain / worth)
                    saved += a.nbytes * (1.0 - share)
                if commit:
                    if e is None:
                        if len(uses) >= _REUSE_MAX_TRACKED:
                            for key in [key for key, v in uses.items() if v[0]() is None]:
                                del uses[key]
                            if len(uses) >= _REUSE_MAX_TRACKED:
                                uses.clear()
                        try:
                            entry = [weakref.ref(a), 1, False, gain]
                        except TypeError:
                            continue
                        uses[id(a)] = entry
                        if self._newest_use is not None:
                            history.append(self._newest_use[3])
                        self._newest_use = entry
                    else:
                        e[1] += 1
                        e[3] += gain
        return max(0.0, h2d - saved)

    def _resident_gain(self, call) -> float:
        """Microseconds the model predicts this call saves on the GPU with its inputs resident (0 when
        it would not, or a side is not known yet): a what-if decision, which changes nothing."""
        entry = self._slots.get((call.op, call.dtype))
        if entry is None:
            return 0.0
        pc, pg = self._core.decide(entry[0], call.size, 0.0, 0.0, 0, False)[2:]
        gain = pc - pg
        return gain if gain > 0.0 else 0.0   # NaN (a side unknown) compares false: no gain

    def _run_other(self, call, slot, reason, pc, pg, want, detail, stream):
        """CPU runs off the compiled common path (hipsched._dispatch.FastPath.run, which is `_run`, and
        which decided the call): device data, a CPU family that is not built, or backend='gpu' without
        fallback."""
        if want == _F_WANT_GPU and not self.config.allow_fallback:
            if detail is not None:
                raise GpuError("unsupported", f"{call.op}: backend='gpu' was asked for but the GPU cannot run this "
                               f"call: {detail}")
            raise GpuError("unavailable", f"{call.op}: backend='gpu' was asked for but the GPU cannot take this "
                           f"call ({_REASON_STR[reason]}; {self._gpu.unavailable_reason})")
        if call.on_device:
            return self._run_cpu_device(call, slot, reason, pc, pg, stream, detail=detail)
        t0 = _perf_ns()
        out = self._cpu.run(call)  # raises the CPU family's ImportError when it is not built
        self._finish(call, slot, _CPU, reason, (_perf_ns() - t0) * 1e-3, pc, pg, stream, detail=detail)
        return out

    def _prepare_missing(self, op):
        if op in OPS:  # registered after this executor was built
            self._prepare[op] = OPS[op].prepare
            return self._prepare[op]
        raise NotImplementedError(f"hipsched: op {op!r} is not available (its family is not built or registered)")

    def _run_cpu_device(self, call, slot, reason, pc, pg, stream, fallback=None, detail=None):
        """CPU run of device inputs: its time includes the copies both ways, which the model takes
        off the sample (it holds the kernel's time; a decision on device data adds them back)."""
        t0 = _perf_ns()
        out = self._cpu.run_device_data(call)
        dur = (_perf_ns() - t0) * 1e-3
        up, down = self._device_copy_bytes(call)
        self._finish(call, slot, _CPU, reason, dur, pc, pg, stream, fallback, up, down, detail=detail)
        return out

    def _finish(self, call, slot, be, reason, dur, pc, pg, stream, fallback=None, h2d=0, d2h=0, detail=None,
                resident=None):
        # A GPU run on device data returns with the work still queued on the stream: its wall time is
        # not a completion time, so it counts here (-1: no sample) and is learned from once its timing
        # events have been read (_learn_gpu_times)
        sample = -1.0 if be == _GPU and call.on_device else dur
        self._core.record(slot, be, call.size, sample, h2d, d2h, True, True, fallback is not None)
        if self._tel is not None:
            self._tel.record(call.op, BACKENDS[be], _REASON_STR[reason], call.size, call.dtype, call.nbytes, dur,
                             pc, pg, stream, fallback, detail, resident)
        if self._timed:
            self._learn_gpu_times()

    def _learn_gpu_times(self):
        """Learn from the timed device-data GPU runs whose work has run by now (never waits). Such a
        run's completion time is the larger of its host time (launching, which its caller waited for)
        and the device time between its events: recorded before its first launch and after its last
        kernel, that span already holds the launch gaps an idle device waited through, and on a device
        busy with earlier work only this call's own share. A reading that arrives before its run has
        stored its entry (another thread polled in between) waits for it in _early."""
        for ticket, device_us in self._gpu.gpu_times():
            entry = self._timed.pop(ticket, None)
            if entry is None:
                if device_us is not None:
                    _bounded_put(self._early, ticket, device_us)
            elif device_us is not None:
                slot, size, host_us = entry
                self._core.learn(slot, _GPU, size, max(host_us, device_us))

    def _run_gpu(self, call, slot, reason, pc, pg, h2d, d2h, stream):
        # the decision may have charged an amortized upload; the copies this run makes are the real one
        real = getattr(self._tls, "h2d", None)
        if real is not None and real[0] == id(call):
            h2d = real[1]
        self._tls.h2d = None
        if h2d and not call.on_device:
            with self._uses_lock:
                for a, _ in _large_host_arrays(call.args, []):
                    e = self._uses.get(id(a))
                    if e is not None and e[0]() is a:
                        e[2] = True
        timed = ticket = None
        before = None if call.on_device else self._gpu.transfer_totals()
        if call.on_device:
            h2d = d2h = 0   # the decision's copies were the CPU's: on the GPU device data moves nowhere
            n = self._timed_runs[slot] = self._timed_runs.get(slot, 0) + 1
            if n <= _TIME_FIRST or n % _TIME_EVERY == 0:
                timed = self._run_timed
        t0 = _perf_ns()
        try:
            try:
                if timed is not None:
                    out, ticket = timed(call, stream)
                else:
                    out = self._gpu.run(call, stream)
            except GpuError as e:
                if e.kind != "oom" or not chunkable(call):
                    raise
                self._gpu.forget_free_memory()
                out = run_chunked(self._gpu, call, stream, e)
        except Exception as e:  # noqa: BLE001 - any GPU-side failure falls back, whatever its type
            dur = (_perf_ns() - t0) * 1e-3
            err = e if isinstance(e, GpuError) else GpuError("runtime", f"{type(e).__name__}: {e}")
            if err.kind == "unsupported":
                # the device cannot run this call (refused before any launch): a fact about the call, not
                # the GPU's health, so the breaker does not see it; the call still reruns on the CPU
                self._core.release_probe(slot)
            else:
                self._core.record(slot, _GPU, call.size, dur, h2d, d2h, False, False, False)
            if err.kind == "oom":
                self._gpu.forget_free_memory()
            return self._fallback(call, slot, err, pc, pg, stream)
        except BaseException:  # interrupted (KeyboardInterrupt, SystemExit): the run has no outcome, but
            # the GPU health must still see one, or a half-open probe would keep the breaker wedged
            self._core.record(slot, _GPU, call.size, -1.0, h2d, d2h, False, False, False)
            raise
        dur = (_perf_ns() - t0) * 1e-3
        if ticket is not None:
            device_us = self._early.pop(ticket, None)
            if device_us is not None:   # read by another thread's call before this line
                self._core.learn(slot, _GPU, call.size, max(dur, device_us))
            else:
                _bounded_put(self._timed, ticket, (slot, call.size, dur))
        resident = None
        if before is not None:   # host inputs: what the call uploaded and what it read from kept copies
            after = self._gpu.transfer_totals()
            resident = {"uploaded": after[0] - before[0], "reused": after[1] - before[1]}
        self._finish(call, slot, _GPU, reason, dur, pc, pg, stream, None, h2d, d2h, resident=resident)
        return out

    def _compiled_gpu_failed(self, e, op, args, kwargs, slot, reason, pc, pg, stream, dur):
        """A launch plan replayed by the compiled GPU path (hipsched._dispatch) failed: as a failed run of
        _run_gpu, the failure is recorded against the GPU's health and the call reruns on the CPU."""
        call = (self._prepare.get(op) or self._prepare_missing(op))(*args, **kwargs)
        err = e if isinstance(e, GpuError) else GpuError("runtime", f"{type(e).__name__}: {e}")
        if err.kind == "unsupported":
            self._core.release_probe(slot)
        else:
            self._core.record(slot, _GPU, call.size, dur, 0, 0, False, False, False)
        if err.kind == "oom":
            self._gpu.forget_free_memory()
        elif err.kind == "unavailable":
            self._gpu.disable(err.message)
        return self._fallback(call, slot, err, pc, pg, stream)

    def _fallback(self, call, slot, err, pc, pg, stream):
        if not self.config.allow_fallback:  # no result, so no event; the op's GPU health saw the failure
            raise err
        key = (call.op, err.kind)
        if key not in self._warned:
            with self._warn_lock:
                first = key not in self._warned
                self._warned.add(key)
            if first:  # logged outside the lock: a handler may run code that calls this executor
                log.warning("hipsched: %s failed on the GPU (%s); rerunning on the CPU. Later %s failures "
                            "of this op fall back silently (see telemetry 'fallback').", call.op, err, err.kind)
        reason = _R_FALLBACK
        if call.on_device:
            return self._run_cpu_device(call, slot, reason, pc, pg, stream, ("gpu", str(err)))
        t0 = _perf_ns()
        out = self._cpu.run(call)
        self._finish(call, slot, _CPU, reason, (_perf_ns() - t0) * 1e-3, pc, pg, stream, ("gpu", str(err)))
        return out

    # ------------------------------------------------------------------ residency
    def resident(self, array, *, copy=False):
        """Keep `array` on the GPU for the long run -> a ResidentArray handle (hipsched.resident).

        Pass the handle (or its `.host`) wherever the array is taken: the GPU reads its device copy (no
        upload, and the scheduler charges none), the CPU the host array, the same bytes. Change it with
        `handle.update(rows, values)`, which writes the host rows and the device copy together; the host
        array is read-only while registered, so a direct write raises instead of going stale. End with
        `handle.release()` or a `with` block. `array` is registered in place when it is a C-contiguous
        NumPy array that owns its memory (or is already read-only), else (or with `copy=True`) a copy is.
        Without a GPU, or when the upload fails (logged), the handle works on the host alone."""
        handle = ResidentArray.register(array, copy=copy)
        if self._gpu_present and self._gpu.available:
            try:
                self._gpu.keep_resident(handle)
            except Exception as e:  # the host side still works; the GPU uploads it on first use if it can
                log.warning("hipsched: could not keep an array of %d bytes on the GPU (%s); it is uploaded "
                            "when a GPU call needs it", handle.nbytes, e)
        return handle

    # ------------------------------------------------------------------ decisions without running
    def select_backend(self, op, size=None, dtype="float32", *, nbytes=None, on_device=False,
                       backend="auto", args=None, kwargs=None) -> BackendSelection:
        """The decision a call would get now, without running anything or changing any state, through
        the same path real calls take (FastPath._decide_call). Given `args` (and `kwargs`), the call
        `getattr(ex, op)(*args, **kwargs, backend=backend)` is validated and judged exactly, shapes and
        parameters included (a call the GPU refuses is `gpu_unsupported`). Given only `size` (and
        `nbytes`, the call's device bytes, `on_device`), it is judged as a call of that work measure
        whose shapes the GPU takes."""
        if op not in OPS:
            raise ValueError(f"select_backend: unknown op {op!r}; ops: {', '.join(sorted(OPS))}")
        if args is not None or kwargs is not None:
            if size is not None or nbytes is not None or on_device:
                raise ValueError("select_backend: give either args/kwargs (a concrete call) or size/nbytes/on_device")
            call = OPS[op].prepare(*(args or ()), **(kwargs or {}))
        else:
            if not isinstance(size, (int, float)) or isinstance(size, bool) or size < 0 or not math.isfinite(size):
                raise ValueError(f"select_backend: size must be a finite number >= 0, got {size!r}")
            call = Call(op, (), {}, size, 0 if nbytes is None else nbytes, dtype, bool(on_device))
        self._tls.what_if = True   # a question, not a call: the inputs' uses are not counted
        try:
            be, reason, pc, pg, detail = self._fast.decide_call(call, backend)
        finally:
            self._tls.what_if = False
        return BackendSelection(BACKENDS[be], REASONS[reason], {"cpu": us_or_none(pc), "gpu": us_or_none(pg)}, detail)

    def capabilities(self) -> ExecutorCapabilities:
        from . import cpu_features  # deferred: the package's, which reports an unbuilt _features as BuildMissingError
        feats = cpu_features()
        ops = [OpCapability(op, "cpu", spec.cpu_dtypes, sys.maxsize, None) for op, spec in OPS.items()]
        reasons = ()
        present = self._gpu_present and bool(self._gpu.available)
        if present:
            for op, spec in OPS.items():
                try:
                    dts = tuple(d for d in spec.gpu_dtypes if self._gpu.supports(op, d))
                    if dts:
                        ops.append(OpCapability(op, "gpu", dts, int(self._gpu.max_elements(op)), "gpu"))
                except Exception:
                    continue
        else:
            r = self._gpu.unavailable_reason or "no GPU backend"
            reasons = tuple(p.strip() for p in str(r).split(";") if p.strip())
        if self.config.force_cpu_mode:
            reasons += ("force_cpu_mode is set",)
        return ExecutorCapabilities(
            gpu_available=present, gpu_device_name=self._gpu.device_name,
            cpu_simd_level=feats.get("simd", "scalar"), reasons=reasons,
            gpu_runtime=self._gpu.runtime_name, gpu_arch=self._gpu.device_arch,
            cpu_threads=int(feats.get("threads", 1)), ops=tuple(ops))

    def gpu_health(self, op) -> dict:
        """Breaker state and success rate of `op` on the GPU."""
        return self._core.health(op)

    # ------------------------------------------------------------------ telemetry
    def stats(self):
        """BackendStats: exact counts and times per backend since start (or clear_telemetry)."""
        if self._tel is not None:
            return self._tel.stats()
        c = self._core.counters()
        try:
            from .telemetry import BackendStats  # deferred and guarded: without telemetry, the counters as a dict
            return BackendStats(**c)
        except ImportError:
            return c

    @property
    def events(self):
        return self._tel.events if self._tel is not None else []

    @property
    def telemetry(self):
        return self._tel

    def summary(self):
        return self._tel.summary() if self._tel is not None else None

    def operations_by_type(self, op):
        return self._tel.operations_by_type(op) if self._tel is not None else {}

    def print_debug_summary(self, file=None):
        if self._tel is not None:
            self._tel.print_debug_summary(file)
        else:
            print(f"hipsched: telemetry disabled; counters: {self._core.counters()}", file=file or sys.stderr)

    def clear_telemetry(self):
        if self._tel is not None:
            self._tel.clear()
        self._core.reset_counters()

    def scope(self, phase=None, **tags):
        if self._tel is not None:
            return self._tel.scope(phase, **tags)
        return nullcontext()

    # ------------------------------------------------------------------ calibration and lifecycle
    def calibrate(self, ops=None, progress=True, repeats=3, max_seconds_per_op=None, dtypes=("float32",)):
        """Sweeps sizes of each op on both backends (forced), feeding the model; saves it. Returns a
        {op: [(size, cpu_us, gpu_us or None)]} table of medians; `dtypes` adds float16/bfloat16 sweeps
        (keyed "op[dtype]") for the ops that take them."""
        table = calibrate(self, ops=ops, progress=progress, repeats=repeats, max_seconds_per_op=max_seconds_per_op,
                          dtypes=dtypes)
        if self.config.persist_model:
            self.save_model()
        return table

    def close(self):
        """Saves the model (persist_model), flushes telemetry and releases the GPU. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._timed:
            self._learn_gpu_times()   # what has run by now still counts for the saved model
        self._fast.forget_plans()
        if self._save_at_exit is not None:
            self._save_at_exit()  # saves now, and not again at exit
        if self._tel is not None:
            self._tel.close()
        try:
            self._gpu.close()
        except Exception as e:
            log.warning("hipsched: GPU backend close failed: %s", e)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---------------------------------------------------------------------- op methods
# Every op's method is generated from its spec: the parameters are its prepare's (so help(),
# inspect.signature and IDE completion show them) plus keyword-only `backend` and `stream`, the
# docstring is the prepare's, and the body is the one a hand-written method would have: the arguments
# go straight on to _run, required ones positionally and those with a default by keyword, with no
# binding work per call. Adding an op takes no edit of this class.
_OP_METHOD_NAMES = ("self", "backend", "stream")


def _op_method(name, spec):
    """The Executor method of op `name`, compiled from the signature of its spec's prepare."""
    P = inspect.Parameter
    params, call_args, ns = [], [], {}
    kw_only, last_positional_only = False, 0
    for p in inspect.signature(spec.prepare).parameters.values():
        if p.name in _OP_METHOD_NAMES:
            raise TypeError(f"op {name}: prepare's parameter {p.name!r} would shadow the Executor method's own")
        default = ""
        if p.default is not P.empty:
            ns[f"_default_{p.name}"] = p.default
            default = f"=_default_{p.name}"
        if p.kind is P.VAR_POSITIONAL:
            params.append(f"*{p.name}")
            call_args.append(f"*{p.name}")
            kw_only = True
        elif p.kind is P.VAR_KEYWORD:
            params.append(f"**{p.name}")
            call_args.append(f"**{p.name}")
        else:
            if p.kind is P.KEYWORD_ONLY and not kw_only:
                params.append("*")
                kw_only = True
            params.append(p.name + default)
            if p.kind is P.POSITIONAL_ONLY:
                last_positional_only = len(params)
            call_args.append(p.name if p.kind is P.POSITIONAL_ONLY or (p.kind is P.POSITIONAL_OR_KEYWORD and
                                                                      p.default is P.empty)
                             else f"{p.name}={p.name}")
    if last_positional_only:
        params.insert(last_positional_only, "/")
    # backend and stream go before a **kwargs (keyword-only either way)
    own = ([] if kw_only else ["*"]) + ['backend="auto"', "stream=None"]
    if params and params[-1].startswith("**"):
        params[-1:-1] = own
    else:
        params += own
    src = (f"def {name}(self, {', '.join(params)}):\n"
           f"    return (self._run if stream is None else self._run_on_stream)({name!r}, backend, stream"
           f"{''.join(', ' + a for a in call_args)})\n")
    exec(compile(src, f"<hipsched op method {name}>", "exec"), ns)
    method = ns[name]
    method.__qualname__ = f"Executor.{name}"
    method.__module__ = __name__
    method.__doc__ = spec.prepare.__doc__
    return method


for _name, _spec in OPS.items():
    setattr(Executor, _name, _op_method(_name, _spec))
del _name, _spec
