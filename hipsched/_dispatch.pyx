# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The per-call path: an Executor call's validation, decision, run, fallback and record. It drives the
scheduler core (_sched.SchedCore) through its C methods, an op's compiled common case (its HotOp)
through a C vtable, the GPU's compiled call path (gpu/launch/_callpath.pyx) through C, and the telemetry
recorder through C; the general path (an op's prepare, a GPU run through its glue, device data on the
CPU, a failed GPU run rerun on the CPU) is here too, so a call never leaves this module until it has
its result. One concept over 500 lines: the per-call path, from the op method's arguments to its
result (the timing of queued runs is _queued_timing.pyx's, calls on a further GPU's data
further_gpus.py's, the upload sharing rule upload_sharing.py's)."""
from hipsched._sched cimport (CPU, GPU, F_CALL_UNSUPPORTED, F_FITS, F_GPU_PRESENT, F_GPU_SUPPORTS, F_ON_DEVICE,
                              F_WANT_CPU, F_WANT_GPU, R_COST_MODEL, R_CPU_FALLBACK, R_EXPLORING, R_GPU_UNAVAILABLE,
                              R_GPU_UNSUPPORTED, R_SPLIT, ST_BACKEND_ONLY, ST_CPU_PREFERRED,
                              MAX_SLOTS, Params, SchedCore, hs_lock, hs_unlock)
from hipsched._load cimport hs_held_t
from hipsched._clock cimport now_ns
from hipsched.cpu._hot cimport HotOp
from hipsched.gpu.launch._callpath cimport GpuPath, Inputs, Plan
from hipsched._queued_timing cimport PENDING, QueuedTimes
from hipsched.telemetry._record cimport Recorder
from libc.math cimport isnan

import logging
import threading
import time

import numpy as np

from .backends.cpu import CpuBackend
from .chunking import chunkable, run_chunked
from .dlpack_devices import device_indices
from .errors import GpuError
from .ops import OPS
from .ops.base import deliver, run_kernel
from .ops.foreign_arrays import result_converter
from .upload_sharing import REUSE_MIN_BYTES, UploadSharing

# inputs below this size are not followed by upload sharing (a call's total bytes under it hold none)
cdef double _SHARED_MIN_BYTES = REUSE_MIN_BYTES

log = logging.getLogger("hipsched")
# the general path's clock (a module global: tests/support/sim_gpu.py runs it on a simulated clock)
_perf_ns = time.perf_counter_ns
_BACKENDS = ("cpu", "gpu")

cdef enum:
    MAX_PLANS = 4096       # plan cache entries (a program makes the same calls again and again)


cdef class Compiled:
    """A call the compiled GPU path replays: its plan and what deciding it needs (the terms the general
    path worked out for the first call with the same key)."""
    cdef Plan plan
    cdef tuple entry
    cdef double size, nbytes, h2d, d2h
    cdef str dtype
    cdef bint on_device             # a device input: results stay there, and the work is left queued
    cdef long long uploaded         # bytes of host inputs the call uploads


ctypedef struct Decision:
    int slot
    int want
    int backend
    int reason
    double pc
    double pg
    double h2d                      # what the decision charged the GPU for uploads (shared ones spread)
    double d2h
    double real_h2d                 # what its run would upload: the copies a GPU run's sample holds
    long long t0                    # when a committed decision was taken (the core's clock)
    hs_held_t held                  # the common path's hold on its side (others hold on the thread's list)


cdef class FastPath:
    """The Executor's per-call path. For an op's common case (its HotOp accepts the arguments: plain
    float32 host arrays) validation, decision, the CPU kernel, the model's record and the telemetry
    event run here without entering Python; so does a GPU call whose launch plan is known (the
    compiled call path, gpu/launch/_callpath.pyx). Otherwise the op's `prepare` validates, host data on
    the CPU still runs, times and records in C, and GPU runs through the glue, device data on the CPU,
    fallback and errors to raise are this class's Python-level methods (the general path, below).

    Every call's flags and decision are worked out by `_flags` and `_settle`; between them the GPU's
    terms come from its backend's judgement (`_decide_call`: the general path and `decide_call`, what
    Executor.select_backend answers, so a prediction is the decision the same call gets from the same
    state) or from the plan kept for the call's key (`_run_compiled`)."""
    cdef readonly SchedCore core
    cdef dict prepare
    cdef dict slots
    cdef dict hot           # op -> its float32 entry, for calls its HotOp accepts
    cdef object cpu, gpu            # the backends (gpu: the GpuBackendBase interface)
    cdef bint gpu_present
    cdef readonly object device_copy_bytes   # call -> (up, down) bytes a CPU run of device data copies
    cdef object run_timed_fn        # the GPU backend's run_timed, or None
    cdef QueuedTimes times          # the timing of GPU runs left queued (device data): _queued_timing.pyx
    cdef object uploads             # upload_sharing.UploadSharing: the uploads shared between calls
    cdef set warned
    cdef object warn_lock
    cdef GpuPath path               # the GPU backend's compiled call path, or None
    cdef dict plans                 # plan key -> Compiled
    cdef dict unrecordable          # plan keys whose glue run the recorder refused -> why
    cdef public Recorder tel        # the executor's telemetry recorder, or None
    cdef double min_batch
    cdef public object splitter     # hipsched.splitting.Splitter, or None (splitting off, or no GPU)
    cdef public object further      # further_gpus.FurtherGpus (calls on a further GPU's data), or None
    cdef readonly bint allow_fallback
    cdef public bint background_compile   # an automatic call refused while its kernel compiles (config)
    cdef public object submitted    # what an op method's wait=False does (the Executor's, held weakly), or None
    cdef readonly tuple reason_str

    def __init__(self, SchedCore core, dict prepare, dict slots, cpu, gpu, Recorder tel, double min_batch,
                 bint allow_fallback, tuple reason_str):
        """`cpu`: CpuBackend or a stand-in with its run(call) and run_device_data(call); `gpu`: a
        GpuBackendBase (backends/interface.py)."""
        self.core, self.prepare, self.slots = core, prepare, slots
        self.cpu, self.gpu, self.tel = cpu, gpu, tel
        self.gpu_present = bool(gpu.available)
        # what a CPU run of device data copies: the backend's own count, else CpuBackend's (it depends on
        # the call alone)
        self.device_copy_bytes = getattr(cpu, "device_copy_bytes", CpuBackend.device_copy_bytes)
        # GPU runs on device data return with their work queued: they are timed by events on their
        # stream, read on a later call (_queued_timing.pyx); a backend without them is not
        self.run_timed_fn = gpu.run_timed if self.gpu_present else None
        self.times = QueuedTimes(core)
        self.uploads = UploadSharing()
        self.warned = set()
        self.warn_lock = threading.Lock()
        # a backend's compiled path is taken when it is the real one (test doubles have none)
        path = gpu.callpath if self.gpu_present else None
        self.path = path if isinstance(path, GpuPath) else None
        self.plans = {}
        self.unrecordable = {}
        self.min_batch, self.allow_fallback, self.reason_str = min_batch, allow_fallback, reason_str
        self.hot = {}
        self.splitter = None
        self.further = None

    cdef tuple _entry(self, str op, dtype):
        """(core slot, capability flags, GPU max size, CPU function or None, HotOp or None)."""
        entry = self.slots.get((op, dtype))
        if entry is None:
            entry = self._slot(op, dtype)
        return entry

    cdef inline int _want(self, str op, backend) except -1:
        if backend is "auto" or backend == "auto":  # identity first: the literal default is interned
            return 0
        if backend == "cpu":
            return F_WANT_CPU
        if backend == "gpu":
            return F_WANT_GPU
        raise ValueError(f"{op}: backend must be 'auto', 'cpu' or 'gpu', got {backend!r}")

    cdef inline bint _asks_gpu(self, int flags, int want, double size) noexcept:
        """Whether deciding this call needs the GPU's view of it (its refusal, memory, copies). Calls
        that stay on the CPU whatever the GPU says are not asked about: small ones (below the batch
        minimum) keep the device queries off the common path; GPU-bound ones always are asked."""
        cdef Params *p = &self.core.p
        if not flags & F_GPU_SUPPORTS or want & F_WANT_CPU or p.force_cpu:
            return False
        if want & F_WANT_GPU:
            return True
        if p.strategy == ST_BACKEND_ONLY:
            # an executor that only runs on one side asks the GPU only when that side is the GPU (on an
            # H200 host, asking cost a forced-CPU ex.add of 512 floats 15 us against 0.7 us)
            return p.backend_only == GPU
        return size >= self.min_batch

    cdef inline bint _cpu_whatever_copies(self, double size, int flags, Decision *d) noexcept:
        """Whether the core keeps this call of host data on the CPU with the GPU's copies counted as
        nothing: the GPU's judgement (its refusal, memory, copies) could then only add reasons for the
        CPU, so it need not be asked. Not for a decision that explores (a dearer GPU could change which
        side is explored), nor for a call the splitter could cut (it plans with the GPU's copies). The
        judgement is what made every auto call cost 15-25 us of Python on a GPU machine; decode-sized
        calls that stay on the CPU no longer pay it. Such a call is decided on cost (a refusal or a
        memory limit the judgement would have found goes unsaid: the CPU won before either counted); its
        large host inputs still count a use for upload sharing (UploadSharing.count, a walk of its
        arguments). A question (select_backend) gets the same decision, with the GPU's estimate
        including its copies."""
        cdef double pc, pg
        cdef int r
        if flags & F_ON_DEVICE:
            return False   # device data: the copies are the CPU's, and the GPU's terms are what decide
        hs_lock(&self.core.lock)
        r = self.core._decide(self.core.slots[d.slot], size, 0.0, 0.0, flags, &pc, &pg, False)
        hs_unlock(&self.core.lock)
        # (a side still unknown decides nothing yet: the judgement's reasons, memory say, are then the
        # decision's)
        if r & 1 != CPU or r >> 1 == R_EXPLORING or isnan(pc) or isnan(pg):
            return False
        d.reason = r >> 1   # (the question's, which a commit that chose otherwise keeps: _keep_on_cpu)
        return self.splitter is None or not pc >= self.splitter.min_us

    cdef inline int _flags(self, tuple entry, int want, bint on_device, Decision *d) except? -1:
        """A call's flags before the GPU is asked (its capability, what the caller wants, fits until the
        GPU says otherwise), with `d` reset for its decision."""
        cdef int flags = <int>entry[1] | want | F_FITS
        if on_device:
            flags |= F_ON_DEVICE   # the GPU's terms are then the CPU's copies, which the core charges to the CPU
        d.want = want
        d.slot = entry[0]
        d.reason = R_COST_MODEL   # (until a question or a decision says otherwise)
        d.h2d = d.d2h = d.real_h2d = 0.0
        return flags

    cdef void _keep_on_cpu(self, Decision *d, int reason) noexcept:
        """The common path's commit chose the GPU where its question a moment before said the CPU (a
        breaker's cooldown ran out between the two, a queued backlog drained): the call runs on the CPU
        as the question decided, so its hold moves there, and a half-open probe it claimed is given back
        (the breaker open again, its cooldown served: the next eligible call probes)."""
        self.core._unhold(&d.held)
        if d.reason == R_EXPLORING:
            self.core.release_probe(d.slot)
        hs_lock(&self.core.lock)
        self.core._hold(CPU, d.pc, False, d.t0, &d.held)
        hs_unlock(&self.core.lock)
        d.backend = CPU
        d.reason = reason

    cdef inline void _settle(self, double size, int flags, bint commit, Decision *d,
                             bint own_hold=False) noexcept:
        """The core's decision on a call's flags and the copy terms in `d`. A committed call holds its
        side (SchedCore._hold) in d.held with `own_hold` (its caller ends it), else on the thread's list."""
        cdef int r
        if commit:
            d.t0 = self.core._now()   # (the hot path times its kernel from here: one clock read for both)
        hs_lock(&self.core.lock)
        r = self.core._decide(self.core.slots[d.slot], size, d.h2d, d.d2h, flags, &d.pc, &d.pg, commit)
        if commit:
            # the call's predicted time is the side's work until its record
            self.core._hold(r & 1, d.pc if r & 1 == CPU else d.pg, r & 1 == GPU and flags & F_ON_DEVICE, d.t0,
                            &d.held if own_hold else NULL)
        hs_unlock(&self.core.lock)
        d.backend = r & 1
        d.reason = r >> 1

    cdef object _decide_call(self, call, double size, int want, tuple entry, bint commit, Decision *d):
        """Fills `d` with the decision for a call of work `size`, the GPU's terms from its backend's
        judgement; returns the decision's detail (why the GPU refuses the call, or why it was found gone
        deciding it) or None. `call` (the prepared Call) may be None only where `_asks_gpu` is false.
        Without `commit` nothing changes (see SchedCore._decide)."""
        cdef int flags = self._flags(entry, want, call is not None and call.on_device, d)
        detail = None
        if self._asks_gpu(flags, want, size):
            if not want & F_WANT_GPU and self._cpu_whatever_copies(size, flags, d):
                self._settle(size, flags, commit, d)
                if commit:
                    # its large host inputs were passed all the same: a later call over them shares
                    # their upload with this one. Settled without copies, d holds the predictions
                    # _resident_gain would ask the core for again
                    self.uploads.count(call, d.pc - d.pg if d.pc > d.pg else 0.0)
                else:
                    # a question gets the call's decision, and the GPU's estimate with its copies
                    flags_o, h2d_o, d2h_o, detail, real_o = self._gpu_terms(call, flags, entry[2], False)
                    if not flags_o & F_CALL_UNSUPPORTED:
                        d.pg += self.core._xfer(h2d_o, d2h_o)
                return None
            flags_o, h2d_o, d2h_o, detail, real_o = self._gpu_terms(call, flags, entry[2], commit)
            flags, d.h2d, d.d2h, d.real_h2d = flags_o, h2d_o, d2h_o, real_o
        self._settle(size, flags, commit, d)
        return detail if d.reason == R_GPU_UNSUPPORTED or d.reason == R_GPU_UNAVAILABLE else None

    def decide_call(self, call, backend="auto"):
        """(backend, reason index, predicted cpu us, predicted gpu us, detail) the call would get now,
        changing nothing."""
        cdef Decision d
        cdef int want = self._want(call.op, backend)
        entry = self._entry(call.op, call.dtype)
        side = self._further_side(call, entry, want)
        if side is not None:
            return self.further.decide(side, call, entry[0], want, False)[1:]
        detail = self._decide_call(call, call.size, want, entry, False, &d)   # a question: nothing counted
        return d.backend, d.reason, d.pc, d.pg, detail

    cdef object _record_cpu(self, str op, Decision *d, double dur, size, dtype, nbytes, stream, detail,
                            long long end_ns=0):
        """A CPU run's record. `end_ns`: the common path's end of the run, read from the core's clock; its
        hold is then d.held, and the event's wall time follows from that reading (Recorder.record_ended)."""
        hs_lock(&self.core.lock)
        if end_ns:
            self.core._record_held(&d.held, self.core.slots[d.slot], CPU, <double>size, dur, 0.0, 0.0, True, True,
                                   False)
        else:
            self.core._record(self.core.slots[d.slot], CPU, <double>size, dur, 0.0, 0.0, True, True, False)
        hs_unlock(&self.core.lock)
        if self.tel is not None:
            if end_ns and not self.core.clock_ns:   # (a core in virtual time: the event's time is now)
                self.tel.record_ended(end_ns, op, "cpu", self.reason_str[d.reason], size, dtype, nbytes, dur, d.pc,
                                      d.pg, stream, detail)
            else:
                self.tel.record(op, "cpu", self.reason_str[d.reason], size, dtype, nbytes, dur, d.pc, d.pg, stream,
                                None, detail)

    def _want_checked(self, str op, backend):
        """Raises the ValueError a call with this `backend` would (for a call submitted to run later)."""
        self._want(op, backend)

    def call(self, str op, dict own, tuple args, dict kwargs):
        """An op method's call (executor._op_method): `own` holds the method's own keywords given (backend,
        stream, split, wait), checked here in C; the op's arguments come as a tuple and a dict or None (no
        packing of them again, and no empty dict made)."""
        backend, stream, split, wait = "auto", None, None, True
        if own:
            backend = own.pop("backend", "auto")
            stream = own.pop("stream", None)
            split = own.pop("split", None)
            wait = own.pop("wait", True)
            if own:
                raise TypeError(f"Executor.{op}() got an unexpected keyword argument {next(iter(own))!r}")
        if wait is not True:
            submitted = self.submitted() if self.submitted is not None else None
            if submitted is None:
                raise RuntimeError(f"{op}: wait=False needs the Executor that made this call")
            return submitted(op, backend, stream, split, wait, *args, **(kwargs or {}))
        return self._run(op, backend, stream, args, kwargs, split is not False)

    def run(self, str op, backend, stream, *args, **kwargs):
        return self._run(op, backend, stream, args, kwargs, True)

    def run_whole(self, str op, backend, stream, *args, **kwargs):
        """run, never splitting the call across processors (an op method's split=False)."""
        return self._run(op, backend, stream, args, kwargs, False)

    cdef object _run(self, str op, backend, stream, tuple args, dict kwargs, bint split):
        cdef Decision d
        cdef double size, nbytes
        cdef long long t0, t1
        cdef HotOp hot
        cdef int want, flags, mark, reason
        # 1. the op's common case, compiled end to end
        entry = self.hot.get(op)
        if entry is None and op not in self.hot:
            entry = self._entry(op, "float32")
            if entry[4] is None:
                entry = None
            self.hot[op] = entry
        if entry is not None and stream is None:
            hot = <HotOp>entry[4]
            ready = hot.check(args, kwargs, &size, &nbytes)
            if ready is not None:
                want = self._want(op, backend)
                flags = self._flags(entry, want, False, &d)
                # a call the GPU is not asked about, or one it loses with its copies free whose inputs are
                # too small for upload sharing to count (that needs the prepared call)
                if want != F_WANT_GPU and (not self._asks_gpu(flags, want, size) or (
                        nbytes < _SHARED_MIN_BYTES and self._cpu_whatever_copies(size, flags, &d))):
                    reason = d.reason   # the question's, if one was asked
                    self._settle(size, flags, True, &d, True)
                    if d.backend != CPU:
                        self._keep_on_cpu(&d, reason)
                    t0 = d.t0
                    try:
                        out = hot.run(ready)
                    except BaseException:
                        self.core._unhold(&d.held)
                        raise
                    t1 = self.core._now()
                    self._record_cpu(op, &d, (t1 - t0) * 1e-3, <long long>size, "float32", <long long>nbytes,
                                     stream, None, t1)
                    return out
        mark = self.core._held()
        try:
            return self._run_general(op, backend, stream, args, kwargs, split)
        finally:
            self.core._release(mark)   # a call that ended without its record still leaves its side's work

    cdef object _run_general(self, str op, backend, stream, tuple args, dict kwargs, bint split):
        cdef Inputs ins
        cdef GpuPath gp = self.path
        cdef size_t handle = 0
        if kwargs is None:
            kwargs = {}
        # 2. device data whose call the GPU ran before with the same key: its plan, replayed in C
        key = None
        # (a call given out= writes a host array the compiled path's plans know nothing of: prepare's way)
        if gp is not None and gp.enabled and not (kwargs and kwargs.get("out") is not None):
            if stream is not None:
                handle = <size_t>stream if type(stream) is int and stream >= 0 else self._stream_handle(stream)
            keep = []
            key = gp.read_args(op, args, kwargs, handle, &ins, keep)
            if key is not None:
                compiled = self.plans.get(key)
                if compiled is not None:
                    return self._run_compiled(<Compiled>compiled, op, backend, stream, handle, args, kwargs, &ins,
                                              keep)
                if key in self.unrecordable:
                    key = None   # its glue does what a plan cannot hold: not recorded again
                keep = None   # the general path imports the arguments itself
        # 3. everything else: the op's prepare validates and converts. A call given a stream takes its
        # foreign arrays with that stream as the consumer (DeviceArray.from_external), so their producer
        # orders exactly the stream that reads them after its pending writes
        if stream is None:
            out = self._general(op, backend, stream, args, kwargs, key, &ins, split)
        else:
            with self._consumer_stream(stream):
                out = self._general(op, backend, stream, args, kwargs, key, &ins, split)
        # another library's host arrays in (a torch CPU tensor): its arrays out, sharing the result's memory
        # (only here: the compiled paths above take NumPy and device arrays alone)
        convert = result_converter(args, kwargs)
        return out if convert is None else convert(out)

    cdef object _stream_handle(self, stream):
        # deferred: the GPU layer's stream helpers load only for a call given a stream object
        from .gpu.memory.streams import as_stream_handle
        return as_stream_handle(stream)

    cdef object _consumer_stream(self, stream):
        # deferred: as _stream_handle
        from .gpu.memory.device_array import consumer_stream
        return consumer_stream(stream)

    cdef object _general(self, str op, backend, stream, tuple args, dict kwargs, key, Inputs *ins, bint split):
        """The general path: the op's prepare, the decision with the GPU's terms, the run (the first GPU
        run with a plan key recorded for the compiled path), or a split across both sides where the model
        predicts one to finish sooner (a call both sides are measured for, the model's own choice). A
        result given out= reaches it through deliver, whichever way the call ran."""
        prep = self.prepare.get(op)
        if prep is None:
            prep = self._prepare_missing(op)
        call = prep(*args, **kwargs)
        return deliver(call, self._general_call(call, backend, stream, key, ins, split))

    cdef object _general_call(self, call, backend, stream, key, Inputs *ins, bint split):
        cdef Decision d
        cdef int want
        cdef GpuPath gp = self.path
        cdef str op = call.op
        dtype = call.dtype
        entry = self._entry(op, dtype)
        want = self._want(op, backend)
        if call.on_device and self.further is not None:
            side = self._further_side(call, entry, want)
            if side is not None:
                return self.further.run(side, call, entry[0], want, stream)
        detail = self._decide_call(call, call.size, want, entry, True, &d)
        # (not under load: the split plans each side idle, and its parts run on threads that hold nothing)
        if split and d.reason == R_COST_MODEL and self.splitter is not None and not call.on_device and \
                not self.core._shared():
            plan = self.splitter.plan(call, d.slot, d.pc, d.pg, d.h2d, d.d2h)
            if plan is not None:
                return self.splitter.run(plan, call, d.slot, d.pc, d.pg, d.h2d, d.d2h, stream)
        if d.backend == GPU:
            if key is None:
                return self._run_gpu(call, d.slot, d.reason, d.pc, d.pg, d.real_h2d, d.d2h, stream)
            # the first GPU run with this key: the glue's run is recorded as a plan for the next ones
            recorded = [(ins.ptr[i], ins.nbytes[i], ins.host[i]) for i in range(ins.n)]
            gp.request_recording(recorded)
            out = self._run_gpu(call, d.slot, d.reason, d.pc, d.pg, d.real_h2d, d.d2h, stream)
            plan, refused = gp.take_recorded()
            if plan is not None:
                self._keep_plan(key, plan, entry, call, &d, recorded)
            elif refused is not None:
                # the recorder's refusals come from what the key fixes (the vendor BLAS for these shapes, a
                # glue that uses the runtime directly...): every call with this key would record in vain,
                # exporting its arguments each time. A run not recorded at all (failed, cut into pieces)
                # is no refusal and is asked again
                if len(self.unrecordable) >= MAX_PLANS:
                    self.unrecordable.clear()
                self.unrecordable[key] = refused
            return out
        return self._run_cpu(call, entry, &d, detail, stream)

    cdef object _run_cpu(self, call, tuple entry, Decision *d, detail, stream):
        """A call decided for the CPU: host data through its compiled kernel here, anything else (device
        data, a CPU family not built, backend='gpu' without fallback) through _run_other."""
        cdef long long t0
        cdef double dur
        fn = entry[3]
        if fn is None or call.on_device or (d.want == F_WANT_GPU and not self.allow_fallback):
            return self._run_other(call, d.slot, d.reason, d.pc, d.pg, d.want, detail, stream)
        t0 = now_ns()
        out = run_kernel(fn, call)  # the lock is not held while the kernel runs
        dur = (now_ns() - t0) * 1e-3
        self._record_cpu(call.op, d, dur, call.size, call.dtype, call.nbytes, stream, detail)
        return out

    # ------------------------------------------------------------------ the compiled GPU path
    cdef void _keep_plan(self, key, Plan plan, tuple entry, call, Decision *d, list recorded_inputs):
        cdef Compiled c = Compiled.__new__(Compiled)
        c.plan, c.entry, c.dtype = plan, entry, call.dtype
        c.size, c.nbytes, c.h2d, c.d2h = call.size, call.nbytes, d.h2d, d.d2h
        c.on_device = call.on_device
        c.uploaded = sum(n for _, n, host in recorded_inputs if host)
        if len(self.plans) >= MAX_PLANS:
            self.plans.clear()
        self.plans[key] = c

    cdef object _run_compiled(self, Compiled c, str op, backend, stream, size_t s, tuple args, dict kwargs,
                              Inputs *ins, list keep):
        """Decide a call the compiled path can replay, and run it there (or, decided for the CPU, through
        the general CPU path for device data)."""
        cdef Decision d
        cdef int flags, r, want = self._want(op, backend)
        cdef long long t0
        cdef double dur
        cdef void *start = NULL
        cdef GpuPath gp = self.path
        entry = c.entry
        flags = self._flags(entry, want, c.on_device, &d)
        if self._asks_gpu(flags, want, c.size):
            # the GPU's terms are the kept plan's: its memory against the engine's free reading, and the
            # copies the first call with this key was judged to make (device data: the CPU's)
            if c.plan.device_bytes > gp.free_bytes():
                flags &= ~F_FITS
            d.h2d, d.d2h = c.h2d, c.d2h
        self._settle(c.size, flags, True, &d)
        if d.backend != GPU:
            keep.clear()   # the CPU path imports the arguments itself
            prep = self.prepare.get(op)
            if prep is None:
                prep = self._prepare_missing(op)
            return self._run_cpu(prep(*args, **kwargs), entry, &d, None, stream)
        t0 = now_ns()
        # (host calls wait for their results: their time is their completion time)
        if c.on_device and self.times.time_this(d.slot) and self.times.npending < PENDING:
            start = gp.time_mark(s)
        try:
            out = gp.replay(c.plan, ins, keep, s)
        except Exception as e:
            if start != NULL:
                gp.release_event(start)
            return self._compiled_gpu_failed(e, op, args, kwargs, d.slot, d.reason, d.pc, d.pg, stream, (now_ns() - t0) * 1e-3)
        dur = (now_ns() - t0) * 1e-3
        if start != NULL:
            self.times.pend(gp, d.slot, c.size, dur, start, gp.time_mark(s))
        hs_lock(&self.core.lock)
        if c.on_device:
            # not a completion time (the work is still queued): the events time it (_queued_timing.pyx)
            self.core._record(self.core.slots[d.slot], GPU, c.size, -1.0, 0.0, 0.0, True, True, False)
        else:
            self.core._record(self.core.slots[d.slot], GPU, c.size, dur, c.h2d, c.d2h, True, True, False)
        hs_unlock(&self.core.lock)
        if self.tel is not None:
            self.tel.record(op, "gpu", self.reason_str[d.reason], c.size, c.dtype, c.nbytes, dur, d.pc, d.pg, stream,
                            None, None, None if c.on_device else {"uploaded": c.uploaded, "reused": 0})
        if self.times.npending:
            self.times.learn_marks(gp)
        return out

    def forget_plans(self):
        """Drop every kept plan (the GPU context they name was closed), and every refusal with them."""
        self.plans.clear()
        self.unrecordable.clear()

    @property
    def unrecordable_keys(self):
        """How many call keys the recorder refused (their calls keep going through the glue)."""
        return len(self.unrecordable)

    @property
    def plan_count(self):
        return len(self.plans)

    # ------------------------------------------------------------------ the general path
    def _slot(self, op, dtype):
        """(core slot, capability flags, GPU max size, CPU function or None, HotOp or None) of (op, dtype),
        cached."""
        key = (op, dtype)
        s = self.slots.get(key)
        if s is None:
            flags, max_size = 0, 0
            if self.gpu_present:
                flags |= F_GPU_PRESENT
                try:
                    if self.gpu.supports(op, dtype):
                        flags |= F_GPU_SUPPORTS
                        max_size = int(self.gpu.max_elements(op))
                except Exception as e:
                    log.warning("hipsched: GPU capability query for %s/%s failed (%s); using the CPU", op, dtype, e)
            try:
                fn = self.cpu._fns.get(op) or self.cpu._load(op)
            except (ImportError, KeyError, AttributeError):
                fn = None  # reported when a call needs it (select_backend works without it)
            spec = OPS.get(op)
            hot = spec.hot_op() if spec is not None and dtype == "float32" and fn is not None else None
            s = self.slots[key] = (self.core.slot(op, dtype), flags, max_size, fn, hot)
        return s

    def _gpu_terms(self, call, flags, max_size, commit):
        """(capability flags, host->device bytes charged, device->host bytes, detail, host->device bytes
        its run would upload) for a call that could go to the GPU, from the backend's judgement of it
        (GpuBackendBase.judge), a reused input's upload shared by upload_sharing's rule (its uses counted
        only with `commit`). A refusal (a shape the
        kernels do not take, a launch past this target's limits) is found there, before anything is
        uploaded or launched; detail is its text, or, when the queries find the GPU gone (a driver that
        refuses our code, a forked child), why."""
        gpu = self.gpu
        if not gpu.available:  # it went away since (forked child, driver refused our code)
            return flags & ~F_GPU_PRESENT, 0, 0, None, 0
        if call.size > max_size:
            return flags & ~F_GPU_SUPPORTS, 0, 0, None, 0
        try:
            # an automatic call does not wait for a kernel to compile: the CPU takes it meanwhile (a
            # backend's judge(call) alone waits)
            j = call.judged = gpu.judge(call) if flags & F_WANT_GPU or not self.background_compile else \
                gpu.judge(call, False)
            if j.refusal is not None:
                return flags | F_CALL_UNSUPPORTED, 0, 0, j.refusal, 0
            if not gpu.available:  # a query found the GPU gone
                return flags & ~F_GPU_PRESENT, 0, 0, gpu.unavailable_reason, 0
            if not j.fits:
                flags &= ~F_FITS
            h2d, d2h = j.h2d, j.d2h
            # device data: the copies the CPU would make (the core charges them to the CPU side)
            if call.on_device:
                h2d, d2h = self.device_copy_bytes(call)
        except Exception as e:  # a failing query means the GPU cannot be trusted with this call
            log.debug("hipsched: GPU query failed for %s: %s", call.op, e)
            return flags & ~F_GPU_SUPPORTS, 0, 0, None, 0
        if call.on_device:
            return flags, h2d, d2h, None, h2d
        return flags, self.uploads.charge(call, j, self._resident_gain, commit), d2h, None, h2d

    def _resident_gain(self, call) -> float:
        """Microseconds the model predicts this call saves on the GPU with its inputs resident (0 when
        it would not, or a side is not known yet): a what-if decision, which changes nothing."""
        entry = self.slots.get((call.op, call.dtype))
        if entry is None:
            return 0.0
        pc, pg = self.core.decide(entry[0], call.size, 0.0, 0.0, 0, False)[2:]
        gain = pc - pg
        return gain if gain > 0.0 else 0.0   # NaN (a side unknown) compares false: no gain

    def _run_other(self, call, slot, reason, pc, pg, want, detail, stream):
        """CPU runs off the compiled common path (hipsched._dispatch.FastPath.run, which is `_run`, and
        which decided the call): device data, a CPU family that is not built, or backend='gpu' without
        fallback."""
        if want == F_WANT_GPU and not self.allow_fallback:
            if detail is not None:
                raise GpuError("unsupported", f"{call.op}: backend='gpu' was asked for but the GPU cannot run this "
                               f"call: {detail}")
            raise GpuError("unavailable", f"{call.op}: backend='gpu' was asked for but the GPU cannot take this "
                           f"call ({self.reason_str[reason]}; {self.gpu.unavailable_reason})")
        if call.on_device:
            return self._run_cpu_device(call, slot, reason, pc, pg, stream, detail=detail)
        t0 = _perf_ns()
        out = self.cpu.run(call)  # raises the CPU family's ImportError when it is not built
        self._finish(call, slot, CPU, reason, (_perf_ns() - t0) * 1e-3, pc, pg, stream, detail=detail)
        return out

    def _prepare_missing(self, op):
        if op in OPS:  # registered after this executor was built
            self.prepare[op] = OPS[op].prepare
            return self.prepare[op]
        raise NotImplementedError(f"hipsched: op {op!r} is not available (its family is not built or registered)")

    def _run_cpu_device(self, call, slot, reason, pc, pg, stream, fallback=None, detail=None):
        """CPU run of device inputs: its time includes the copies both ways, which the model takes
        off the sample (it holds the kernel's time; a decision on device data adds them back), but not
        the wait for the GPU work queued before it (CpuBackend.wait_device_inputs)."""
        wait = getattr(self.cpu, "wait_device_inputs", None)
        if wait is not None:
            wait(call)
        t0 = _perf_ns()
        out = self.cpu.run_device_data(call)
        dur = (_perf_ns() - t0) * 1e-3
        up, down = self.device_copy_bytes(call)
        self._finish(call, slot, CPU, reason, dur, pc, pg, stream, fallback, up, down, detail=detail)
        return out

    def _finish(self, call, slot, be, reason, dur, pc, pg, stream, fallback=None, h2d=0, d2h=0, detail=None,
                resident=None, parts=None):
        # A GPU run on device data returns with the work still queued on the stream: its wall time is
        # not a completion time, so it counts here (-1: no sample) and is learned from once its timing
        # events have been read (_queued_timing.pyx). A run its backend timed in parts (`parts`) teaches
        # its measured kernel time and its uploads, not the wall time less modelled copies.
        if parts is not None:
            self.core.record_parts(slot, call.size, dur, parts[2], parts[0], parts[1], fallback is not None)
        else:
            self.core.record(slot, be, call.size, -1.0 if be == GPU and call.on_device else dur, h2d, d2h,
                             fallback=fallback is not None)
        if self.tel is not None:
            self.tel.record(call.op, _BACKENDS[be], self.reason_str[reason], call.size, call.dtype, call.nbytes, dur,
                            pc, pg, stream, fallback, detail, resident)
        self.times.learn_tickets(self.gpu)

    # ------------------------------------------------------------------ device data on a further GPU
    def _further_side(self, call, tuple entry, int want):
        """The further GPU (its splitting.Side) a call runs on because its device inputs all live there
        (further_gpus.FurtherGpus.side_for), or None: no further devices, host data, or a call that would
        stay on the CPU whatever a GPU said (backend='cpu', force_cpu_mode, a strategy fixed on the CPU
        without backend='gpu', a size below gpu_min_batch_size)."""
        cdef Params *p = &self.core.p
        if self.further is None or not call.on_device:
            return None
        if want == 0 and (p.strategy == ST_CPU_PREFERRED or (p.strategy == ST_BACKEND_ONLY and p.backend_only == CPU)):
            return None
        if not self._asks_gpu(<int>entry[1] | want | F_FITS, want, call.size):
            return None
        return self.further.side_for(call)

    def _run_gpu(self, call, slot, reason, pc, pg, h2d, d2h, stream):
        """A GPU run through the glue; `h2d` the bytes it uploads (not what the decision charged: a shared
        upload's part), which its sample holds."""
        if h2d and not call.on_device and call.judged is not None:
            self.uploads.taken_by_gpu(call)
        timed = ticket = None
        if call.on_device:
            h2d = d2h = 0   # the decision's copies were the CPU's: on the GPU device data moves nowhere
            if self.times.time_this(slot):
                timed = self.run_timed_fn
        t0 = _perf_ns()
        try:
            try:
                if timed is not None:
                    out, ticket = timed(call, stream)
                else:
                    out = self.gpu.run(call, stream)
            except GpuError as e:
                if e.kind != "oom" or not chunkable(call):
                    raise
                self.gpu.forget_free_memory()
                out = run_chunked(self.gpu, call, stream, e)
        except Exception as e:  # noqa: BLE001 - any GPU-side failure falls back, whatever its type
            return self._gpu_failed(self.core, self.gpu, call, slot, slot, e, (_perf_ns() - t0) * 1e-3, h2d, d2h,
                                    pc, pg, stream, None, False)
        except BaseException:  # interrupted (KeyboardInterrupt, SystemExit): the run has no outcome, but
            # the GPU health must still see one, or a half-open probe would keep the breaker wedged
            self.core.record_gpu_failure(slot, call.size, -1.0, h2d, d2h)
            raise
        dur = (_perf_ns() - t0) * 1e-3
        if ticket is not None:
            self.times.ticketed(ticket, slot, call.size, dur)
        resident = None
        j = call.judged
        if j is not None and j.moved is not None:   # host inputs: what the run uploaded and read from kept copies
            resident = {"uploaded": j.moved[0], "reused": j.moved[1]}
        self._finish(call, slot, GPU, reason, dur, pc, pg, stream, None, h2d, d2h, resident=resident,
                     parts=None if j is None or call.on_device else j.parts)
        return out

    def _compiled_gpu_failed(self, e, op, args, kwargs, slot, reason, pc, pg, stream, dur):
        """A launch plan replayed by the compiled GPU path failed: the call, prepared now (the replay
        never needed it), fails as any GPU run does."""
        call = (self.prepare.get(op) or self._prepare_missing(op))(*args, **kwargs)
        return self._gpu_failed(self.core, self.gpu, call, slot, slot, e, dur, 0.0, 0.0, pc, pg, stream, None, True)

    def _gpu_failed(self, core, gpu, call, int slot, int gpu_slot, e, double dur, double h2d, double d2h,
                    pc, pg, stream, where, bint replayed):
        """The one place a failed GPU run is handled, wherever it ran (the executor's GPU through the glue
        or a replayed plan, or a further GPU: `core`, `gpu` and `gpu_slot` are that device's, `where` its
        name): recorded against that device's health, its free-memory reading dropped after an out of
        memory, and the call rerun on the CPU (_fallback). A refusal (`unsupported`: the device cannot
        run this call, found before any launch) is a fact about the call, not the device's health, so
        the breaker does not see it. A replayed plan disables a device that went away itself: the glue's
        run, which does that on `unavailable` (GpuBackend.run), was not on its way."""
        err = e if isinstance(e, GpuError) else GpuError("runtime", f"{type(e).__name__}: {e}")
        if err.kind == "unsupported":
            core.release_probe(gpu_slot)
        else:
            core.record_gpu_failure(gpu_slot, call.size, dur, h2d, d2h)
        if err.kind == "oom":
            gpu.forget_free_memory()
        elif err.kind == "unavailable" and replayed:
            gpu.disable(err.message)
        return self._fallback(call, slot, err, pc, pg, stream, where)

    def _fallback(self, call, slot, err, pc, pg, stream, where=None):
        """Rerun a call whose GPU run failed on the CPU; `where`: the further GPU that failed ("gpu:1",
        named in the event's error as split events name it), None for the executor's GPU."""
        if not self.allow_fallback:  # no result, so no event; the op's GPU health saw the failure
            raise err
        reason = R_CPU_FALLBACK
        fallback = ("gpu", str(err) if where is None else f"{where}: {err}")
        if call.on_device:
            try:
                out = self._run_cpu_device(call, slot, reason, pc, pg, stream, fallback)
            except GpuError as e:
                # the rerun downloads the inputs: a failure that took the device with it (a sticky fault:
                # an illegal address, which is what a driver may make of a destroyed stream) leaves them
                # unreadable. One error that says both, and no word of a rerun that did not happen
                raise GpuError(err.kind, f"{call.op} failed on the GPU ({err.message}) and could not be rerun on "
                                         f"the CPU: its device inputs could not be read back ({e})",
                               name=err.name) from e
        else:
            t0 = _perf_ns()
            out = self.cpu.run(call)
            self._finish(call, slot, CPU, reason, (_perf_ns() - t0) * 1e-3, pc, pg, stream, fallback)
        key = (call.op, err.kind)
        if key not in self.warned:   # said once the rerun has given its result, never before
            with self.warn_lock:
                first = key not in self.warned
                self.warned.add(key)
            if first:  # logged outside the lock: a handler may run code that calls this executor
                log.warning("hipsched: %s failed on the GPU (%s); reran it on the CPU. Later %s failures "
                            "of this op fall back silently (see telemetry 'fallback').", call.op, err, err.kind)
        return out

    def learn_pending(self):
        """Learn from every timed GPU run whose work has run by now (the executor's close calls it)."""
        self.times.learn_all(self.gpu, self.path)
