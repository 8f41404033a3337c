# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The per-call path: an Executor call's validation, decision, run and record, compiled. It drives the
scheduler core (_sched.SchedCore) through its C methods, an op's compiled common case (its HotOp)
through a C vtable, and the telemetry recorder through C."""
from hipsched._sched cimport (CPU, GPU, F_CALL_UNSUPPORTED, F_FITS, F_GPU_SUPPORTS, F_ON_DEVICE, F_WANT_CPU,
                              F_WANT_GPU, R_GPU_UNAVAILABLE, R_GPU_UNSUPPORTED, ST_BACKEND_ONLY, Params, SchedCore,
                              hs_lock, hs_unlock, now_ns)
from hipsched.cpu._hot cimport HotOp
from hipsched.gpu.launch._callpath cimport GpuPath, Inputs, Plan
from hipsched.telemetry._record cimport Recorder

# Device-data GPU runs on the compiled path are timed by events (they return with their work queued, so
# the host cannot time them): every one of a slot's first TIME_FIRST, then 1 in TIME_EVERY, which still
# refills a model window every few hundred calls (as Executor's _TIME_FIRST/_TIME_EVERY).
cdef enum:
    TIME_FIRST = 64
    TIME_EVERY = 8
    PENDING = 64           # timed runs whose events are not read yet
    MAX_PLANS = 4096       # plan cache entries (a program makes the same calls again and again)


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
    double h2d
    double d2h


cdef class FastPath:
    """The Executor's per-call path compiled. For an op's common case (its HotOp accepts the
    arguments: plain float32 host arrays) validation, decision, the CPU kernel, the model's record and
    the telemetry event run here without entering Python. Otherwise the op's `prepare` validates, and
    host data on the CPU still runs, times and records here; GPU runs, fallback, device data and errors
    to raise go to the executor's methods.

    `_decide_call` is the only place a call's flags and decision are worked out: both kinds of real
    call (`run`) and `decide_call` (what Executor.select_backend answers) go through it, so a prediction
    is the decision the same call gets from the same state."""
    cdef SchedCore core
    cdef dict prepare
    cdef dict slots
    cdef dict hot           # op -> its float32 entry, for calls its HotOp accepts
    cdef object slot_miss, prepare_missing, gpu_terms, run_gpu, run_other, gpu_failed
    cdef GpuPath gpu                # the GPU backend's compiled call path, or None
    cdef dict plans                 # plan key -> Compiled
    cdef long long timed_runs[512]  # per slot: compiled device-data GPU runs so far (which to time)
    cdef Timing pending[PENDING]
    cdef int npending
    cdef public Recorder tel        # the executor's telemetry recorder, or None
    cdef double min_batch
    cdef bint allow_fallback
    cdef tuple reason_str

    def __init__(self, SchedCore core, dict prepare, dict slots, slot_miss, prepare_missing, gpu_terms, run_gpu,
                 run_other, Recorder tel, double min_batch, bint allow_fallback, tuple reason_str, gpu=None,
                 gpu_failed=None):
        self.core, self.prepare, self.slots = core, prepare, slots
        # a backend's compiled path is taken when it is the real one (test doubles have none, or another)
        self.gpu = gpu if isinstance(gpu, GpuPath) else None
        self.gpu_failed, self.plans, self.npending = gpu_failed, {}, 0
        self.slot_miss, self.prepare_missing, self.gpu_terms = slot_miss, prepare_missing, gpu_terms
        self.run_gpu, self.run_other, self.tel = run_gpu, run_other, tel
        self.min_batch, self.allow_fallback, self.reason_str = min_batch, allow_fallback, reason_str
        self.hot = {}

    cdef tuple _entry(self, str op, dtype):
        """(core slot, capability flags, GPU max size, CPU function or None, HotOp or None)."""
        entry = self.slots.get((op, dtype))
        if entry is None:
            entry = self.slot_miss(op, dtype)
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
        d.h2d = d.d2h = 0.0
        detail = None
        if self._asks_gpu(flags, want, size):
            flags_o, h2d_o, d2h_o, detail = self.gpu_terms(call, flags, entry[2])
            flags, d.h2d, d.d2h = flags_o, h2d_o, d2h_o
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
        detail = self._decide_call(call, call.size, self._want(call.op, backend),
                                   self._entry(call.op, call.dtype), False, &d)
        return d.backend, d.reason, d.pc, d.pg, detail

    cdef object _record_cpu(self, str op, Decision *d, double dur, size, dtype, nbytes, stream, detail):
        hs_lock(&self.core.lock)
        self.core._record(self.core.slots[d.slot], CPU, <double>size, dur, 0.0, 0.0, True, True, False)
        hs_unlock(&self.core.lock)
        if self.tel is not None:
            self.tel.record(op, "cpu", self.reason_str[d.reason], size, dtype, nbytes, dur, d.pc, d.pg, stream, None,
                            detail)

    def run(self, str op, backend, stream, *args, **kwargs):
        cdef Decision d
        cdef Inputs ins
        cdef GpuPath gp = self.gpu
        cdef double dur, size, nbytes
        cdef long long t0
        cdef HotOp hot
        cdef int want
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
        if gp is not None and gp.enabled and (stream is None or type(stream) is int):
            keep = []
            key = gp.read_args(op, args, kwargs, 0 if stream is None else <size_t>stream, &ins, keep)
            if key is not None:
                compiled = self.plans.get(key)
                if compiled is not None:
                    return self._run_compiled(<Compiled>compiled, op, backend, stream, args, kwargs, &ins, keep)
                keep = None   # the general path imports the arguments itself
        # 3. everything else: the op's prepare validates and converts
        prep = self.prepare.get(op)
        if prep is None:
            prep = self.prepare_missing(op)
        call = prep(*args, **kwargs)
        dtype = call.dtype
        entry = self._entry(op, dtype)
        detail = self._decide_call(call, call.size, self._want(op, backend), entry, True, &d)
        if d.backend == GPU:
            if key is None:
                return self.run_gpu(call, d.slot, d.reason, d.pc, d.pg, d.h2d, d.d2h, stream)
            # the first GPU run with this key: the glue's run is recorded as a plan for the next ones
            recorded = [(ins.ptr[i], ins.nbytes[i], ins.host[i]) for i in range(ins.n)]
            gp.request_recording(recorded)
            out = self.run_gpu(call, d.slot, d.reason, d.pc, d.pg, d.h2d, d.d2h, stream)
            plan = gp.take_recorded()
            if plan is not None:
                self._keep_plan(key, plan, entry, call, &d, recorded)
            return out
        return self._run_cpu(call, entry, &d, detail, stream)

    cdef object _run_cpu(self, call, tuple entry, Decision *d, detail, stream):
        """A call decided for the CPU: host data through its compiled kernel here, anything else (device
        data, a CPU family not built, backend='gpu' without fallback) through the executor."""
        cdef long long t0
        cdef double dur
        fn = entry[3]
        if fn is None or call.on_device or (d.want == F_WANT_GPU and not self.allow_fallback):
            return self.run_other(call, d.slot, d.reason, d.pc, d.pg, d.want, detail, stream)
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

    cdef object _run_compiled(self, Compiled c, str op, backend, stream, tuple args, dict kwargs, Inputs *ins,
                              list keep):
        """Decide a call the compiled path can replay, and run it there (or, decided for the CPU, through
        the general CPU path for device data)."""
        cdef Decision d
        cdef int flags, r, want = self._want(op, backend)
        cdef long long t0, n
        cdef double dur
        cdef void *start = NULL
        cdef size_t s = 0 if stream is None else <size_t>stream
        cdef GpuPath gp = self.gpu
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
                prep = self.prepare_missing(op)
            return self._run_cpu(prep(*args, **kwargs), entry, &d, None, stream)
        t0 = now_ns()
        if c.on_device:   # host calls wait for their results: their time is their completion time
            n = self.timed_runs[d.slot] if d.slot < 512 else TIME_FIRST + 1
            if d.slot < 512:
                self.timed_runs[d.slot] = n + 1
            if (n < TIME_FIRST or n % TIME_EVERY == 0) and self.npending < PENDING:
                start = gp.time_mark(s)
        try:
            out = gp.replay(c.plan, ins, keep, s)
        except Exception as e:
            if start != NULL:
                gp.release_event(start)
            return self.gpu_failed(e, op, args, kwargs, d.slot, d.reason, d.pc, d.pg, stream, (now_ns() - t0) * 1e-3)
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

    cdef void _pend(self, GpuPath gp, int slot, double size, double host_us, void *start, void *end) noexcept:
        cdef Timing *t
        if end == NULL:
            gp.release_event(start)
            return
        t = &self.pending[self.npending]
        t.slot, t.size, t.host_us, t.start, t.end = slot, size, host_us, start, end
        self.npending += 1

    cdef void _learn_timings(self, GpuPath gp) noexcept:
        """Learn from the timed compiled runs whose work has run by now (never waits). A run's completion
        time is the larger of its host time and the device time between its events (see
        Executor._learn_gpu_times)."""
        cdef int i = 0, j
        cdef double us
        cdef Timing *t
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

    def forget_plans(self):
        """Drop every kept plan (the GPU context they name was closed)."""
        self.plans.clear()

    @property
    def plan_count(self):
        return len(self.plans)
