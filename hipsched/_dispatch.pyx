# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The per-call path: an Executor call's validation, decision, run, fallback and record. It drives the
scheduler core (_sched.SchedCore) through its C methods, an op's compiled common case (its HotOp)
through a C vtable, the GPU's compiled call path (gpu/launch/_callpath.pyx) through C, and the telemetry
recorder through C; the general path (an op's prepare, a GPU run through its glue, device data on the
CPU, a failed GPU run rerun on the CPU) is here too, so a call never leaves this module until it has
its result."""
from hipsched._sched cimport (CPU, GPU, F_CALL_UNSUPPORTED, F_FITS, F_GPU_PRESENT, F_GPU_SUPPORTS, F_ON_DEVICE,
                              F_WANT_CPU, F_WANT_GPU, R_COST_MODEL, R_CPU_FALLBACK, R_GPU_UNAVAILABLE,
                              R_GPU_UNSUPPORTED, R_SPLIT, ST_BACKEND_ONLY, ST_CPU_PREFERRED,
                              MAX_SLOTS, Params, SchedCore, hs_lock, hs_unlock, now_ns)
from hipsched.cpu._hot cimport HotOp
from hipsched.gpu.launch._callpath cimport GpuPath, Inputs, Plan
from hipsched.telemetry._record cimport Recorder

import logging
import threading
import time

import numpy as np

from .backends.cpu import CpuBackend
from .chunking import chunkable, run_chunked
from .device_arrays import device_indices
from .errors import GpuError
from .ops import OPS
from .ops.base import result_converter
from .upload_sharing import UploadSharing

log = logging.getLogger("hipsched")
# the general path's clock (a module global: tests/support/sim_gpu.py runs it on a simulated clock)
_perf_ns = time.perf_counter_ns
_BACKENDS = ("cpu", "gpu")

# Device-data GPU runs are timed by events (they return with their work queued, so the host cannot time
# them; two records, a query and a reading cost a few microseconds): every one of a slot's first
# TIME_FIRST, then 1 in TIME_EVERY, which still refills a model window every few hundred calls. Runs
# of the compiled path and of the glue count alike (FastPath._time_this).
cdef enum:
    TIME_FIRST = 64
    TIME_EVERY = 8
    PENDING = 64           # timed runs whose events are not read yet
    MAX_PLANS = 4096       # plan cache entries (a program makes the same calls again and again)


_MAX_PENDING = 1024   # entries of FastPath.timed / early: far more than the device keeps readings for


def _bounded_put(d, key, value):
    """d[key] = value, dropping the oldest entry past _MAX_PENDING (a sample lost, never a wrong one)."""
    if len(d) >= _MAX_PENDING:
        try:
            del d[next(iter(d))]
        except (StopIteration, KeyError, RuntimeError):   # emptied or changed by another thread
            pass
    d[key] = value



ctypedef struct Timing:
    int slot
    double size
    double host_us
    void *start
    void *end


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


cdef class FastPath:
    """The Executor's per-call path. For an op's common case (its HotOp accepts the arguments: plain
    float32 host arrays) validation, decision, the CPU kernel, the model's record and the telemetry
    event run here without entering Python; so does a GPU call whose launch plan is known (the
    compiled call path, gpu/launch/_callpath.pyx). Otherwise the op's `prepare` validates, host data on
    the CPU still runs, times and records in C, and GPU runs through the glue, device data on the CPU,
    fallback and errors to raise are this class's Python-level methods (the general path, below).

    `_decide_call` is the only place a call's flags and decision are worked out: both kinds of real
    call (`run`) and `decide_call` (what Executor.select_backend answers) go through it, so a prediction
    is the decision the same call gets from the same state."""
    cdef SchedCore core
    cdef dict prepare
    cdef dict slots
    cdef dict hot           # op -> its float32 entry, for calls its HotOp accepts
    cdef object cpu, gpu            # the backends (gpu: the GpuBackendBase interface)
    cdef bint gpu_present
    cdef object device_copy_bytes   # call -> (up, down) bytes a CPU run of device data copies
    cdef object run_timed_fn        # the GPU backend's run_timed, or None
    cdef dict timed, early          # event-timed glue runs on device data (see _learn_gpu_times)
    cdef object uploads             # upload_sharing.UploadSharing: the uploads shared between calls
    cdef set warned
    cdef object warn_lock
    cdef GpuPath path               # the GPU backend's compiled call path, or None
    cdef dict plans                 # plan key -> Compiled
    cdef dict unrecordable          # plan keys whose glue run the recorder refused -> why
    cdef long long gpu_runs[MAX_SLOTS]  # per slot: device-data GPU runs so far (see _time_this)
    cdef Timing pending[PENDING]
    cdef int npending
    cdef public Recorder tel        # the executor's telemetry recorder, or None
    cdef double min_batch
    cdef public object splitter     # hipsched.splitting.Splitter, or None (splitting off, or no GPU)
    cdef public object further      # {device index: splitting.Side} of the further GPUs, or None
    cdef bint allow_fallback
    cdef bint learning      # _learn_timings is running (a driver call may let another thread in)
    cdef tuple reason_str

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
        # stream, read on a later call (see _learn_gpu_times); a backend without them is not
        self.run_timed_fn = gpu.run_timed if self.gpu_present else None
        self.timed = {}             # ticket -> (slot, size, host us) of such runs not yet learned from
        # ticket -> device us of readings that came before their run stored its entry (another thread
        # polled in between); bounded, like timed, so a reading or an entry that never meets its
        # other half cannot grow them for the life of the process
        self.early = {}
        self.uploads = UploadSharing()
        self.warned = set()
        self.warn_lock = threading.Lock()
        # a backend's compiled path is taken when it is the real one (test doubles have none)
        path = gpu.callpath if self.gpu_present else None
        self.path = path if isinstance(path, GpuPath) else None
        self.plans, self.npending = {}, 0
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
        return (flags & F_GPU_SUPPORTS and not want & F_WANT_CPU and not p.force_cpu and (
            size >= self.min_batch or want & F_WANT_GPU or (p.strategy == ST_BACKEND_ONLY and p.backend_only == GPU)))

    cdef object _decide_call(self, call, double size, int want, tuple entry, bint commit, Decision *d):
        """Fills `d` with the decision for a call of work `size`; returns the decision's detail (why the
        GPU refuses the call, or why it was found gone deciding it) or None. `call` (the prepared Call)
        may be None only where `_asks_gpu` is false. Without `commit` nothing changes (see
        SchedCore._decide)."""
        cdef int flags, r
        d.want = want
        d.slot = entry[0]
        flags = <int>entry[1] | want | F_FITS
        if call is not None and call.on_device:
            flags |= F_ON_DEVICE   # gpu_terms then gives the CPU's copies, which the core charges to the CPU
        d.h2d = d.d2h = d.real_h2d = 0.0
        detail = None
        if self._asks_gpu(flags, want, size):
            flags_o, h2d_o, d2h_o, detail, real_o = self._gpu_terms(call, flags, entry[2], commit)
            flags, d.h2d, d.d2h, d.real_h2d = flags_o, h2d_o, d2h_o, real_o
        hs_lock(&self.core.lock)
        r = self.core._decide(self.core.slots[d.slot], size, d.h2d, d.d2h, flags, &d.pc, &d.pg, commit)
        hs_unlock(&self.core.lock)
        d.backend = r & 1
        d.reason = r >> 1
        return detail if d.reason == R_GPU_UNSUPPORTED or d.reason == R_GPU_UNAVAILABLE else None

    def decide_call(self, call, backend="auto"):
        """(backend, reason index, predicted cpu us, predicted gpu us, detail) the call would get now,
        changing nothing."""
        cdef Decision d
        cdef int want = self._want(call.op, backend)
        entry = self._entry(call.op, call.dtype)
        side = self._further_side(call, entry, want)
        if side is not None:
            return self._decide_further(side, call, entry[0], want, False)[1:]
        detail = self._decide_call(call, call.size, want, entry, False, &d)   # a question: nothing counted
        return d.backend, d.reason, d.pc, d.pg, detail

    cdef object _record_cpu(self, str op, Decision *d, double dur, size, dtype, nbytes, stream, detail):
        hs_lock(&self.core.lock)
        self.core._record(self.core.slots[d.slot], CPU, <double>size, dur, 0.0, 0.0, True, True, False)
        hs_unlock(&self.core.lock)
        if self.tel is not None:
            self.tel.record(op, "cpu", self.reason_str[d.reason], size, dtype, nbytes, dur, d.pc, d.pg, stream, None,
                            detail)

    def run(self, str op, backend, stream, *args, **kwargs):
        return self._run(op, backend, stream, args, kwargs, True)

    def run_whole(self, str op, backend, stream, *args, **kwargs):
        """run, never splitting the call across processors (an op method's split=False)."""
        return self._run(op, backend, stream, args, kwargs, False)

    cdef object _run(self, str op, backend, stream, tuple args, dict kwargs, bint split):
        cdef Decision d
        cdef Inputs ins
        cdef GpuPath gp = self.path
        cdef double dur, size, nbytes
        cdef long long t0
        cdef HotOp hot
        cdef int want
        cdef size_t handle = 0
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
                if want != F_WANT_GPU and not self._asks_gpu(<int>entry[1] | want | F_FITS, want, size):
                    self._decide_call(None, size, want, entry, True, &d)
                    # (never the GPU: that takes a call the GPU was asked about)
                    t0 = now_ns()
                    out = hot.run(ready)
                    dur = (now_ns() - t0) * 1e-3
                    self._record_cpu(op, &d, dur, <long long>size, "float32", <long long>nbytes, stream, None)
                    return out
        # 2. device data whose call the GPU ran before with the same key: its plan, replayed in C
        key = None
        if gp is not None and gp.enabled:
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
        predicts one to finish sooner (a call both sides are measured for, the model's own choice)."""
        cdef Decision d
        cdef int want
        cdef GpuPath gp = self.path
        prep = self.prepare.get(op)
        if prep is None:
            prep = self._prepare_missing(op)
        call = prep(*args, **kwargs)
        dtype = call.dtype
        entry = self._entry(op, dtype)
        want = self._want(op, backend)
        if call.on_device and self.further is not None:
            side = self._further_side(call, entry, want)
            if side is not None:
                return self._run_further(side, call, entry[0], want, stream)
        detail = self._decide_call(call, call.size, want, entry, True, &d)
        if split and d.reason == R_COST_MODEL and self.splitter is not None and not call.on_device:
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
        out = fn(*call.args, **call.params)  # the lock is not held while the kernel runs
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
        d.want = want
        d.slot = entry[0]
        d.h2d = d.d2h = 0.0
        flags = <int>entry[1] | want | F_FITS
        if c.on_device:
            flags |= F_ON_DEVICE
        if self._asks_gpu(flags, want, c.size):
            if c.plan.device_bytes > gp.free_bytes():
                flags &= ~F_FITS
            # host data: the GPU's copies; device data: the CPU's (the core charges them to that side)
            d.h2d, d.d2h = c.h2d, c.d2h
        hs_lock(&self.core.lock)
        r = self.core._decide(self.core.slots[d.slot], c.size, d.h2d, d.d2h, flags, &d.pc, &d.pg, True)
        hs_unlock(&self.core.lock)
        d.backend = r & 1
        d.reason = r >> 1
        if d.backend != GPU:
            keep.clear()   # the CPU path imports the arguments itself
            prep = self.prepare.get(op)
            if prep is None:
                prep = self._prepare_missing(op)
            return self._run_cpu(prep(*args, **kwargs), entry, &d, None, stream)
        t0 = now_ns()
        # (host calls wait for their results: their time is their completion time)
        if c.on_device and self._time_this(d.slot) and self.npending < PENDING:
            start = gp.time_mark(s)
        try:
            out = gp.replay(c.plan, ins, keep, s)
        except Exception as e:
            if start != NULL:
                gp.release_event(start)
            return self._compiled_gpu_failed(e, op, args, kwargs, d.slot, d.reason, d.pc, d.pg, stream, (now_ns() - t0) * 1e-3)
        dur = (now_ns() - t0) * 1e-3
        if start != NULL:
            self._pend(gp, d.slot, c.size, dur, start, gp.time_mark(s))
        hs_lock(&self.core.lock)
        if c.on_device:
            # not a completion time (the work is still queued): the events time it (see _learn_timings)
            self.core._record(self.core.slots[d.slot], GPU, c.size, -1.0, 0.0, 0.0, True, True, False)
        else:
            self.core._record(self.core.slots[d.slot], GPU, c.size, dur, c.h2d, c.d2h, True, True, False)
        hs_unlock(&self.core.lock)
        if self.tel is not None:
            self.tel.record(op, "gpu", self.reason_str[d.reason], c.size, c.dtype, c.nbytes, dur, d.pc, d.pg, stream,
                            None, None, None if c.on_device else {"uploaded": c.uploaded, "reused": 0})
        if self.npending:
            self._learn_timings(gp)
        return out

    cdef bint _time_this(self, int slot) noexcept:
        """Whether this device-data GPU run of `slot` is timed by events (see TIME_FIRST)."""
        cdef long long n = self.gpu_runs[slot] + 1
        self.gpu_runs[slot] = n
        return n <= TIME_FIRST or n % TIME_EVERY == 0

    cdef void _pend(self, GpuPath gp, int slot, double size, double host_us, void *start, void *end) noexcept:
        cdef Timing *t
        # _run_compiled saw room before its replay, but other threads' calls may have pended since (the
        # replay can run Python: a library's from_dlpack, a finalizer, a driver reached through Python)
        if end == NULL or self.npending >= PENDING:
            gp.release_event(start)
            gp.release_event(end)
            return
        t = &self.pending[self.npending]
        t.slot, t.size, t.host_us, t.start, t.end = slot, size, host_us, start, end
        self.npending += 1

    cdef void _learn_timings(self, GpuPath gp) noexcept:
        """Learn from the timed compiled runs whose work has run by now (never waits). A run's completion
        time is the larger of its host time and the device time between its events (see
        _learn_gpu_times)."""
        cdef int i = 0, j
        cdef double us
        cdef Timing *t
        if self.learning:   # another thread is in here (the driver call let it in): it does the reading
            return
        self.learning = True
        while i < self.npending:
            t = &self.pending[i]
            us = gp.elapsed_us(t.start, t.end)
            if us == -1.0:
                break   # one stream's work runs in order: the later ones are queued too
            if us >= 0:
                hs_lock(&self.core.lock)
                self.core._sample(self.core.slots[t.slot], GPU, t.size, us if us > t.host_us else t.host_us,
                                  0.0, 0.0)
                hs_unlock(&self.core.lock)
            gp.release_event(t.start)
            gp.release_event(t.end)
            i += 1
        if i:
            for j in range(i, self.npending):
                self.pending[j - i] = self.pending[j]
            self.npending -= i
        self.learning = False

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
            why, fits, h2d, d2h = gpu.judge(call)
            if why is not None:
                return flags | F_CALL_UNSUPPORTED, 0, 0, why, 0
            if not gpu.available:  # a query found the GPU gone
                return flags & ~F_GPU_PRESENT, 0, 0, gpu.unavailable_reason, 0
            if not fits:
                flags &= ~F_FITS
            # device data: the copies the CPU would make (the core charges them to the CPU side)
            if call.on_device:
                h2d, d2h = self.device_copy_bytes(call)
        except Exception as e:  # a failing query means the GPU cannot be trusted with this call
            log.debug("hipsched: GPU query failed for %s: %s", call.op, e)
            return flags & ~F_GPU_SUPPORTS, 0, 0, None, 0
        if call.on_device:
            return flags, h2d, d2h, None, h2d
        return flags, self.uploads.charge(call, h2d, self._resident_gain, gpu, commit), d2h, None, h2d

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
        # events have been read (_learn_gpu_times). A run its backend timed in parts (`parts`) teaches
        # its measured kernel time and its uploads, not the wall time less modelled copies.
        if parts is not None:
            self.core.record_parts(slot, call.size, dur, parts[2], parts[0], parts[1], fallback is not None)
        else:
            self.core.record(slot, be, call.size, -1.0 if be == GPU and call.on_device else dur, h2d, d2h,
                             fallback=fallback is not None)
        if self.tel is not None:
            self.tel.record(call.op, _BACKENDS[be], self.reason_str[reason], call.size, call.dtype, call.nbytes, dur,
                             pc, pg, stream, fallback, detail, resident)
        if self.timed:
            self._learn_gpu_times()

    def _learn_gpu_times(self):
        """Learn from the timed device-data GPU runs whose work has run by now (never waits). Such a
        run's completion time is the larger of its host time (launching, which its caller waited for)
        and the device time between its events: recorded before its first launch and after its last
        kernel, that span already holds the launch gaps an idle device waited through, and on a device
        busy with earlier work only this call's own share. A reading that arrives before its run has
        stored its entry (another thread polled in between) waits for it in _early."""
        for ticket, device_us in self.gpu.gpu_times():
            entry = self.timed.pop(ticket, None)
            if entry is None:
                if device_us is not None:
                    _bounded_put(self.early, ticket, device_us)
            elif device_us is not None:
                slot, size, host_us = entry
                self.core.learn(slot, GPU, size, max(host_us, device_us))

    # ------------------------------------------------------------------ device data on a further GPU
    def _further_side(self, call, tuple entry, int want):
        """The further GPU (its splitting.Side) a call runs on because its device inputs all live there,
        or None: no further devices, host data, inputs on the executor's own GPU or on several devices
        (these take the executor's GPU's decision as before: for mixed devices, the CPU, which can read
        every array), or a call that would stay on the CPU whatever a GPU said (backend='cpu',
        force_cpu_mode, a strategy fixed on the CPU without backend='gpu', a size below
        gpu_min_batch_size)."""
        cdef Params *p = &self.core.p
        if not self.further or not call.on_device:
            return None
        if want == 0 and (p.strategy == ST_CPU_PREFERRED or (p.strategy == ST_BACKEND_ONLY and p.backend_only == CPU)):
            return None
        if not self._asks_gpu(<int>entry[1] | want | F_FITS, want, call.size):
            return None
        devices = device_indices(call.args)
        return self.further.get(devices.pop()) if len(devices) == 1 else None

    def _decide_further(self, side, call, int slot, int want, bint commit):
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
                why, fits, _, _ = g.judge(call)
                if why is not None:
                    flags |= F_CALL_UNSUPPORTED
                    detail = why
                elif not g.available:   # a query found the device gone
                    flags &= ~F_GPU_PRESENT
                    detail = g.unavailable_reason
                elif not fits:
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

    def _run_further(self, side, call, int slot, int want, stream):
        """Run a call on a further GPU's data on that device, through its backend: the result stays
        there, as a run on the executor's GPU leaves it. Its health is that device's core's (the one its
        split parts answer to), never the executor's GPU's; a failure reruns on the CPU, as there."""
        s_slot, be, reason, pc, pg, detail = self._decide_further(side, call, slot, want, True)
        g, core = side.backend, side.core
        if be != GPU:
            if want == F_WANT_GPU and not self.allow_fallback:
                raise GpuError("unsupported" if reason == R_GPU_UNSUPPORTED else "unavailable",
                               f"{call.op}: backend='gpu' was asked for but GPU {g.device_index}, where its inputs "
                               f"live, cannot take this call ({self.reason_str[reason]}"
                               f"{': ' + str(detail) if detail else ''})")
            return self._run_cpu_device(call, slot, reason, pc, pg, stream, detail=detail)
        t0 = _perf_ns()
        try:
            out = g.run(call, stream)
        except Exception as e:  # noqa: BLE001 - any GPU-side failure falls back, whatever its type
            return self._gpu_failed(core, g, call, slot, s_slot, e, (_perf_ns() - t0) * 1e-3, 0.0, 0.0,
                                    pc, pg, stream, side.name, False)
        except BaseException:  # interrupted: the breaker must still see an outcome (see _run_gpu)
            core.record_gpu_failure(s_slot, call.size)
            raise
        dur = (_perf_ns() - t0) * 1e-3
        # the work is left queued on the device: a success for its breaker, but no completion time
        core.record_gpu_queued(s_slot, call.size)
        self.core.count_gpu_run(-1.0)
        if self.tel is not None:
            self.tel.record(call.op, "gpu", self.reason_str[reason], call.size, call.dtype, call.nbytes, dur, pc, pg,
                            stream, None, None, None, None, g.device_index)
        return out

    def _run_gpu(self, call, slot, reason, pc, pg, h2d, d2h, stream):
        """A GPU run through the glue; `h2d` the bytes it uploads (not what the decision charged: a shared
        upload's part), which its sample holds."""
        if h2d and not call.on_device:
            self.uploads.taken_by_gpu(call)
        timed = ticket = None
        before = None if call.on_device else self.gpu.transfer_totals()
        if call.on_device:
            h2d = d2h = 0   # the decision's copies were the CPU's: on the GPU device data moves nowhere
            if self._time_this(slot):
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
            device_us = self.early.pop(ticket, None)
            if device_us is not None:   # read by another thread's call before this line
                self.core.learn(slot, GPU, call.size, max(dur, device_us))
            else:
                _bounded_put(self.timed, ticket, (slot, call.size, dur))
        resident = None
        if before is not None:   # host inputs: what the call uploaded and what it read from kept copies
            after = self.gpu.transfer_totals()
            resident = {"uploaded": after[0] - before[0], "reused": after[1] - before[1]}
        self._finish(call, slot, GPU, reason, dur, pc, pg, stream, None, h2d, d2h, resident=resident,
                     parts=None if call.on_device else self.gpu.last_run_parts())
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
        if self.timed:
            self._learn_gpu_times()
        if self.npending and self.path is not None:
            self._learn_timings(self.path)
