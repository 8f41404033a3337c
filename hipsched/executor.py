"""Executor: the configuration and the public API of validate -> decide -> run -> (on GpuError) rerun
on CPU -> record.

The per-call path, general path and fallback included, is hipsched/_dispatch.pyx (FastPath); the
decision and the performance model live in the Cython core (hipsched._sched). This module wires them
to the backends, the telemetry and the model store. A GPU failure never reaches the caller unless
allow_fallback is False: the call reruns on the CPU and the event records the error."""
from __future__ import annotations

import inspect
import logging
import math
import re
import sys
import weakref
from contextlib import nullcontext

from . import _dispatch, _sched, priors
from .backends.cpu import CpuBackend
from .backends.interface import GpuBackendBase
from .calibration import calibrate
from .config import HybridConfig
from .faults import FaultInjectingBackend
from .further_gpus import FurtherGpus
from .model_store import ModelPersistence
from .ops import OPS
from .ops.base import Call
from .resident_array import ResidentArray
from .splitting import Side, Splitter
from .batch import Batch
from .submission import Submitter
from .scheduling import (BACKENDS, REASONS, BackendSelection, ExecutorCapabilities, OpCapability,
                         PerformanceTracker, us_or_none)

log = logging.getLogger("hipsched")

_REASON_STR = tuple(r.value for r in REASONS)


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


def _judge_can_defer(gpu) -> bool:
    """Whether the backend's judge takes `wait_for_kernels` (GpuBackendBase's does; an override may not)."""
    try:
        return "wait_for_kernels" in inspect.signature(gpu.judge).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def _further_gpus(config, gpu) -> list:
    """The backends of the devices besides `gpu` that the config lists (gpu_devices; None: every device
    the runtime finds), each on its own view of the runtime; a device that cannot start is logged and
    left out."""
    try:
        wanted = config.gpu_devices if config.gpu_devices is not None else range(gpu.device_count())
    except Exception as e:  # the runtime cannot count its devices: the executor's GPU alone
        log.warning("hipsched: could not list the GPU devices (%s); using device %s alone", e, gpu.device_index)
        return []
    others = []
    for index in wanted:
        if index == gpu.device_index:
            continue
        other = gpu.for_device(index)
        if other.available:
            others.append(other)
        else:
            log.warning("hipsched: GPU device %d left out: %s", index, other.unavailable_reason)
    return others


def _save_models(models):
    for m in models:
        m.save_quietly()


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



# where one runtime's reason ends in the backend's "hip: ...; cuda: ..." (detect.unavailable_reason): a
# "; " before a runtime's name. A runtime's own reason may hold "; " too (hip-python's does), and split at
# every "; " it printed as bullets cut in the middle of a sentence.
_NEXT_RUNTIME = re.compile(r";\s+(?=(?:hip-python|hip|cuda|HIPSCHED_GPU_RUNTIME)\b)")


def _reason_lines(reason: str) -> tuple:
    return tuple(p.strip() for p in _NEXT_RUNTIME.split(reason) if p.strip())


class Executor:
    """Runs each op on the backend predicted to finish first. `config` is a HybridConfig (None: read
    the TOML file and HIPSCHED_* variables); keyword `overrides` set config fields; `gpu_backend`
    replaces the GPU backend (a hipsched.backends.interface.GpuBackendBase); `cpu_backend` replaces
    the CPU engine with an object that has CpuBackend's `run(call)` and `run_device_data(call)` (a
    simulated machine in tests/support): every call then takes the general path, none the compiled
    kernels directly. `gpu_backend` may also be a list of backends, one per device: the first is the
    one backend="gpu" means, the others take parts of split calls and run the calls whose device
    arrays live on them (as the config's gpu_devices would make them)."""

    def __init__(self, config=None, *, gpu_backend=None, cpu_backend=None, **overrides):
        if config is None:
            config = HybridConfig(**overrides)
        elif overrides:
            values = {k: v for k, v in config.as_dict().items() if k != "num_threads"}
            values.update(overrides)
            config = HybridConfig(config_file=False, env={}, **values)
        self.config = cfg = config
        self._cpu = cpu_backend if cpu_backend is not None else CpuBackend()
        if isinstance(gpu_backend, (list, tuple)):
            if not gpu_backend:
                raise ValueError("Executor: gpu_backend=[] names no device; leave it out for the detected ones")
            gpu, others = gpu_backend[0], [g for g in gpu_backend[1:] if g.available]
        else:
            gpu = gpu_backend if gpu_backend is not None else _create_gpu(cfg)
            # Further devices take parts of split calls and whole calls on their own device data. Without
            # splitting only those gpu_devices names are opened: "every device" would otherwise hold a
            # context (and its memory) on each GPU of the machine for data that may never live there.
            others = (_further_gpus(cfg, gpu) if gpu_backend is None and gpu.available
                      and (cfg.split or cfg.gpu_devices is not None) else [])
        self._injector = None
        if cfg.fault_inject and gpu.available:
            gpu = self._injector = FaultInjectingBackend(gpu, cfg.fault_inject)
            others = [FaultInjectingBackend(g, cfg.fault_inject) for g in others]
        self._gpu = gpu
        self._other_gpus = others
        self._gpu_present = bool(gpu.available)
        self._core = _sched.SchedCore(
            window=cfg.performance_window_size, min_batch=cfg.gpu_min_batch_size, min_samples=cfg.min_samples,
            exploration_share=cfg.exploration_share, reprobe_interval=cfg.reprobe_interval,
            strategy=cfg.strategy, backend_only=cfg.backend, force_cpu=cfg.force_cpu_mode,
            breaker_failures=cfg.breaker_failures, health_min_samples=cfg.health_min_samples,
            success_threshold=cfg.gpu_success_rate_threshold, speedup_threshold=cfg.gpu_speedup_threshold,
            cooldown_s=cfg.breaker_cooldown_s)
        # the roofline prior of each op and side, measured off the caller's path (hipsched/priors.py)
        self._prior_thread = priors.start(self._core, self._cpu, gpu, self._gpu_present) \
            if cfg.exploration_share > 0 and cfg.strategy == "automatic" else None
        self._tel = _create_telemetry(cfg, gpu.device_name if self._gpu_present else "cpu")
        self._slots = {}            # (op, dtype) -> (core slot, capability flags, GPU max size, CPU fn, HotOp)
        self._prepare = {name: spec.prepare for name, spec in OPS.items()}
        self._closed = False
        self.performance_tracker = PerformanceTracker(self._core)
        # the whole per-call path, general path and fallback included (hipsched/_dispatch.pyx)
        self._fast = _dispatch.FastPath(self._core, self._prepare, self._slots, self._cpu, gpu,
                                        self._tel.recorder if self._tel is not None else None,
                                        cfg.gpu_min_batch_size, cfg.allow_fallback, _REASON_STR)
        # (a backend whose judge takes no wait_for_kernels, a test double's override, is asked as before)
        self._fast.background_compile = cfg.background_compile and _judge_can_defer(gpu)
        # (op, own keywords, args tuple, kwargs dict or None): every op method goes through it
        self._call = self._fast.call
        self._fast.submitted = weakref.WeakMethod(self._submitted)   # (no cycle through the dispatcher)
        self._run = self._fast.run  # (op, backend, stream, *args, **kwargs): a call that waits
        self._run_whole = self._fast.run_whole   # the same, never split (an op method's split=False)
        if cfg.split and self._gpu_present:
            self._fast.splitter = Splitter(self._core, self._cpu, gpu, cfg.split_min_us, self._record_split,
                                           others, self._device_core)
        if others and self._gpu_present:
            # a call on a further device's data runs there; that device's core is its splitter side's, so
            # one breaker sees both its split parts and its whole calls
            sides = (self._fast.splitter.others if self._fast.splitter is not None else
                     [Side(f"gpu:{g.device_index}", g, self._device_core()) for g in others])
            self._fast.further = FurtherGpus(sides, self._fast)
        version = getattr(sys.modules.get("hipsched"), "__version__", "0")
        self._model = ModelPersistence(self._core, cfg.cache_dir,
                                       gpu.device_name if self._gpu_present else None, version)
        # each further device's model (what its split parts taught it) in a file of its own, keyed by its
        # name and index: two devices of one name may still sit on different links
        self._device_models = [
            ModelPersistence(side.core, cfg.cache_dir, f"{side.backend.device_name} (device {side.backend.device_index})",
                             version)
            for side in (self._fast.further.sides() if self._fast.further is not None else ())]
        self._save_at_exit = None
        if cfg.persist_model:
            for m in (self._model, *self._device_models):
                m.load()
            # the model outlives processes that never call close() (the module-level default executor)
            self._save_at_exit = weakref.finalize(self, _save_models, (self._model, *self._device_models))
        if self._gpu_present and not self._model.transfer_known:
            self._measure_transfer()
        # calls submitted without waiting (hipsched/submission.py): threads started on the first one
        self._submitter = Submitter(self, 1 + (1 + len(others) if self._gpu_present else 0))

    def _device_core(self):
        """The model and circuit breaker of one further GPU: a core whose GPU side is that device, deciding
        gpu_preferred from size 0 so that its answer is the breaker's alone (hipsched/splitting.py)."""
        cfg = self.config
        return _sched.SchedCore(
            window=cfg.performance_window_size, min_batch=0, min_samples=cfg.min_samples, exploration_share=0.0,
            reprobe_interval=0, strategy="gpu_preferred", breaker_failures=cfg.breaker_failures,
            health_min_samples=cfg.health_min_samples, success_threshold=cfg.gpu_success_rate_threshold,
            cooldown_s=cfg.breaker_cooldown_s)

    @property
    def gpu_devices(self) -> list[dict]:
        """The GPUs this executor uses, the one backend="gpu" means first: index, name, and whether it is
        up (a device whose breaker is open for an op is still listed; see gpu_health, which is the first
        device's)."""
        gpus = [self._gpu, *self._other_gpus] if self._gpu_present else []
        return [{"index": g.device_index, "name": g.device_name, "available": bool(g.available)} for g in gpus]

    def _record_split(self, call, duration_us, pred_cpu_us, pred_gpu_us, fallback, split):
        if self._tel is not None:
            self._tel.record(call.op, "split", _REASON_STR[_sched.R_SPLIT], call.size, call.dtype, call.nbytes,
                             duration_us, pred_cpu_us, pred_gpu_us, fallback=fallback, split=split)

    def _measure_transfer(self):
        try:
            self._core.set_transfer(**self._gpu.measure_transfer())
            self._model.transfer_known = True
        except Exception as e:  # keep the default link model; the GPU may still work
            log.warning("hipsched: could not measure host<->device transfers (%s); assuming a PCIe link", e)

    def save_model(self, path=None) -> str:
        """Writes the learned model to its file in the cache directory (or to `path`); returns the path.
        Into the cache directory, the further GPUs' models are written too, each to its own file."""
        if path is None:
            for m in self._device_models:
                m.save()
        return self._model.save(path)

    # ------------------------------------------------------------------ calls in flight
    def submit(self, op, *args, backend="auto", stream=None, split=None, **kwargs):
        """Runs `op` (a name of hipsched.OPS) on `args` without waiting: returns a
        concurrent.futures.Future of what `getattr(ex, op)(*args, ...)` returns. A Future among the
        arguments is a dependency (the call starts once it is done; its result is passed as it is, a
        device array staying on the device). Inside `with ex.batch():` the call is planned with the
        block's others when the block ends. The same as the op method's `wait=False`."""
        return self._submit(op, backend, stream, split, args, kwargs)

    def _submit(self, op, backend, stream, split, args, kwargs, batch=None):
        if op not in self._prepare:
            raise ValueError(f"submit: no op {op!r}; hipsched.OPS lists them")
        self._fast._want_checked(op, backend)
        return self._submitter.submit(op, backend, stream, split, args, kwargs, batch)

    def _thread_stream(self):
        """The GPU stream of the calling submission thread (GpuBackend.stream_for_thread), or None."""
        if not self._gpu_present:
            return None
        try:
            return self._gpu.stream_for_thread()
        except Exception as e:  # a pool that cannot be made leaves the calls on the default stream
            log.debug("hipsched: no stream for a submission thread (%s)", e)
            return None

    def _submitted(self, op, backend, stream, split, wait, *args, **kwargs):
        if wait is not False:
            raise TypeError(f"{op}: wait must be True or False, got {wait!r}")
        return self.submit(op, *args, backend=backend, stream=stream, split=split, **kwargs)

    def batch(self):
        """`with ex.batch() as b:` collects the calls submitted in the block (ex.submit, wait=False,
        b.submit) and, when it ends, plans them over the CPU and the GPU together (calls on each other's
        results as a graph, HEFT; independent ones by their relative speed on each side) and starts
        them; b.plan then holds the plan, b.results() waits for them all."""
        return Batch(self._submitter)

    # ------------------------------------------------------------------ residency
    def resident(self, array, *, copy=False):
        """Keep `array` on the GPU for the long run -> a ResidentArray handle (hipsched.resident_array).

        Pass the handle (or its `.host`) wherever the array is taken: the GPU reads its device copy (no
        upload, and the scheduler charges none), the CPU the host array, the same bytes. Change it with
        `handle.update(index, values, axis=0)`, which writes the host entries and the device copy's same
        bytes together (a KV cache's new position: `update(pos, k, axis=2)`); the host
        array is read-only while registered, so a direct write raises instead of going stale. End with
        `handle.release()` or a `with` block. `array` is registered in place when it is a C-contiguous
        NumPy array that owns its memory (or is already read-only), else (or with `copy=True`) a copy is.
        Without a GPU, or when the upload fails (logged), the handle works on the host alone."""
        handle = ResidentArray.register(array, copy=copy)
        # every device keeps a copy: any of them may take any rows of a split call
        for gpu in ([self._gpu, *self._other_gpus] if self._gpu_present else []):
            if not gpu.available:
                continue
            try:
                gpu.keep_resident(handle)
            except Exception as e:  # the host side still works; the GPU uploads it on first use if it can
                log.warning("hipsched: could not keep an array of %d bytes on GPU %s (%s); it is uploaded "
                            "when a GPU call needs it", handle.nbytes, gpu.device_index, e)
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
        be, reason, pc, pg, detail = self._fast.decide_call(call, backend)
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
            reasons = _reason_lines(str(r))
        if self.config.force_cpu_mode:
            reasons += ("force_cpu_mode is set",)
        return ExecutorCapabilities(
            gpu_available=present, gpu_device_name=self._gpu.device_name,
            cpu_simd_level=feats.get("simd", "scalar"), reasons=reasons,
            gpu_runtime=self._gpu.runtime_name, gpu_arch=self._gpu.device_arch,
            cpu_threads=int(feats.get("threads", 1)), ops=tuple(ops),
            gpu_devices=tuple(d["index"] for d in self.gpu_devices if d["available"]) if present else ())

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
        self._submitter.close()      # submitted calls finish first: none is lost
        self._fast.learn_pending()   # what has run by now still counts for the saved model
        self._fast.forget_plans()
        if self._fast.splitter is not None:
            self._fast.splitter.close()
        if self._save_at_exit is not None:
            self._save_at_exit()  # saves now, and not again at exit
        if self._tel is not None:
            self._tel.close()
        for gpu in (self._gpu, *self._other_gpus):
            try:
                gpu.close()
            except Exception as e:
                log.warning("hipsched: GPU backend close failed: %s", e)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---------------------------------------------------------------------- op methods
# Every op's method is generated from its spec: the parameters are its prepare's (so help(),
# inspect.signature and IDE completion show them) plus keyword-only `backend`, `stream`, `split` and
# `wait` (taken as **_own, read by the dispatcher's call in C), the docstring is the prepare's, and the
# body hands the op's arguments straight on to _call, required ones in a tuple and those with a default
# in a dict, with no binding work per call. Adding an op takes no edit of this class. split=False keeps the
# call whole on one side (the config's `split` turns splitting off for every call); True or None leave it
# to the model.
_OP_METHOD_NAMES = ("self", "backend", "stream", "split", "wait", "_own")


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
    if params and params[-1].startswith("**"):
        raise TypeError(f"op {name}: prepare takes **{params[-1][2:]}, which the Executor method's own "
                        f"keywords would mix with")
    # the signature shown (help, inspect) names the method's own keyword-only backend, stream, split and
    # wait; the method takes them as **_own, which the dispatcher's call reads in C: an absent keyword-only
    # parameter costs its default's lookup by name, every call (four of them a sixth of a tiny call's
    # Python), where an empty ** costs an empty dict
    shown = params + ([] if kw_only else ["*"]) + ['backend="auto"', "stream=None", "split=None", "wait=True"]
    exec(compile(f"def {name}(self, {', '.join(shown)}): pass\n", f"<hipsched op signature {name}>", "exec"),
         ns)
    signature = inspect.signature(ns[name])
    # the op's arguments as one tuple and one dict (None without keywords): not packed again in C
    positional = [a for a in call_args if "=" not in a]
    keywords = [a for a in call_args if "=" in a]
    as_tuple = "(" + "".join(a + ", " for a in positional) + ")"
    as_dict = "{" + ", ".join("{0!r}: {1}".format(*a.split("=", 1)) for a in keywords) + "}" if keywords else "None"
    src = (f"def {name}(self, {', '.join(params + ['**_own'])}):\n"
           f"    return self._call({name!r}, _own, {as_tuple}, {as_dict})\n")
    exec(compile(src, f"<hipsched op method {name}>", "exec"), ns)
    method = ns[name]
    method.__qualname__ = f"Executor.{name}"
    method.__module__ = __name__
    method.__doc__ = spec.prepare.__doc__
    method.__signature__ = signature
    return method


for _name, _spec in OPS.items():
    setattr(Executor, _name, _op_method(_name, _spec))
del _name, _spec
