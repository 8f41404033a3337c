# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The per-call path: an Executor call's validation, decision, run and record, compiled. It drives the
scheduler core (_sched.SchedCore) through its C methods, an op's compiled common case (its HotOp)
through a C vtable, and the telemetry recorder through C."""
from hipsched._sched cimport (CPU, GPU, F_CALL_UNSUPPORTED, F_FITS, F_GPU_SUPPORTS, F_ON_DEVICE, F_WANT_CPU,
                              F_WANT_GPU, R_GPU_UNAVAILABLE, R_GPU_UNSUPPORTED, ST_BACKEND_ONLY, Params, SchedCore,
                              hs_lock, hs_unlock, now_ns)
from hipsched.cpu._hot cimport HotOp
from hipsched.telemetry._record cimport Recorder


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
    cdef object slot_miss, prepare_missing, gpu_terms, run_gpu, run_other
    cdef public Recorder tel        # the executor's telemetry recorder, or None
    cdef double min_batch
    cdef bint allow_fallback
    cdef tuple reason_str

    def __init__(self, SchedCore core, dict prepare, dict slots, slot_miss, prepare_missing, gpu_terms, run_gpu,
                 run_other, Recorder tel, double min_batch, bint allow_fallback, tuple reason_str):
        self.core, self.prepare, self.slots = core, prepare, slots
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
        # 2. everything else: the op's prepare validates and converts
        prep = self.prepare.get(op)
        if prep is None:
            prep = self.prepare_missing(op)
        call = prep(*args, **kwargs)
        dtype = call.dtype
        entry = self._entry(op, dtype)
        detail = self._decide_call(call, call.size, self._want(op, backend), entry, True, &d)
        if d.backend == GPU:
            return self.run_gpu(call, d.slot, d.reason, d.pc, d.pg, d.h2d, d.d2h, stream)
        fn = entry[3]
        if fn is None or call.on_device or (d.want == F_WANT_GPU and not self.allow_fallback):
            return self.run_other(call, d.slot, d.reason, d.pc, d.pg, d.want, detail, stream)
        t0 = now_ns()
        out = fn(*call.args, **call.params)  # the lock is not held while the kernel runs
        dur = (now_ns() - t0) * 1e-3
        self._record_cpu(op, &d, dur, call.size, dtype, call.nbytes, stream, detail)
        return out
