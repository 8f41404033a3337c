# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The scheduler core: the per-call CPU/GPU decision (the rules, in _decide) over one lock that guards
the state it reads and the records that change it (the per-call path that uses it is _dispatch.pyx).
The state's parts are their own modules of inline C: the performance model (_perfmodel.pxd), each
side's work in flight (_load.pxd), a GPU op's health (_health.pxd) and the link as measured (_link.pxd);
this module holds the rules, the lock, the thread's list of held calls and the Python-facing methods.

Every sample, decision and health change happens under the one lock, so counts stay exact with many
Python threads. Decisions never allocate; a record allocates only for a size bucket's first sample
(its rings), once per bucket. The rules and the model are described in docs/guide/backends-and-routing.md
and docs/design/scheduling.md."""
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport erfc, exp, isfinite, isnan, sqrt

from hipsched._health cimport S_CLOSED, S_HALF_OPEN, S_OPEN, health_update
from hipsched._link cimport LINK_BUCKETS, link_learn, link_ratio
from hipsched._load cimport load_alone_us, load_backlog, load_finish, load_hold, load_note
from hipsched._perfmodel cimport bucket_add, bucket_median, bucket_of, check_unseen, predict_us

import threading

from hipsched.config import STRATEGIES

# The flags, reasons, strategies and backends are the cpdef enums of _sched.pxd: one
# definition, read as C constants here and as this module's Python names (F_GPU_PRESENT, R_COST_MODEL,
# ...) by the executor. REASONS names the reasons in their index order, the strings telemetry writes:
# each is its enum member's name without "R_", lower-cased (R_COST_MODEL: "cost_model");
# scheduling.SelectionReason is built from it.
REASONS = tuple(m.name[2:].lower() for m in sorted(Reason, key=int))
BREAKER_STATES = ("closed", "open", "half_open")   # _health.pxd's S_CLOSED, S_OPEN, S_HALF_OPEN
# Python sees the enum classes (Flag, Reason, ...); their members also go in the module namespace, the
# spelling the executor and the tests use (_sched.F_FITS).
globals().update({m.name: m for e in (Flag, Reason, Strategy) for m in e})
# config.STRATEGIES (importable with nothing built: the configuration is checked before any build is
# needed) must be the Strategy enum's names without "ST_", lower-cased, in index order
if tuple(STRATEGIES) != tuple(m.name[3:].lower() for m in sorted(Strategy, key=int)):  # pragma: no cover
    raise ImportError("hipsched._sched: config.STRATEGIES is not the Strategy enum (a build out of step)")

# A re-probe of the losing side is skipped when it is predicted this many times slower: drift that
# large would not go unnoticed anyway, and probing it would cost more than it could ever win back.
DEF REPROBE_MAX_RATIO = 4.0
# Exploration is optimism under uncertainty (a UCB rule): the predicted loser is tried when its time,
# EXPLORE_Z of its standard errors faster than predicted, would beat the winner's. Each sample narrows
# its interval, so a side that loses stops being tried after a few calls, one within the noise of the
# other keeps being tried now and then at the cost of a tie (nothing), and a side known only by a guess
# (a size never measured, a prior) is tried while the guess could be that wrong.
DEF EXPLORE_Z = 1.0
# ...within a budget: what explorations were predicted to cost beyond the better side stays under
# this share of the predicted time of all automatic decisions of the (op, dtype), except at a size the
# loser ran fewer than three times, where a run expected to repay itself (_worth_learning) is made.
DEF EXPLORE_BUDGET = 0.05
# Two sides whose predictions lie within TIE_Z of their combined standard error are a tie: either is
# right, and the call stays where its data is (host data whose upload is not paid yet on the CPU,
# device data on the GPU).
DEF TIE_Z = 1.0
# A GPU sample whose copies were not timed apart (split unknown) is its wall time less the modelled
# copies, but never less than this share of the wall time (a too-pessimistic transfer model must not
# produce zero-cost kernels).
DEF MIN_KERNEL_SHARE = 0.1
# Such a run whose modelled copies of at least UNSURE_COPY_BYTES make up more than COPY_DOMINATED_SHARE of
# its time teaches nothing: what is left after subtracting them is mostly the copy model's error. On the
# H100 pageable uploads of 350-805 MB ran at 8 GB/s where the model said 11.75 (measured with 16 MB), so
# a top_k that uploaded a 350 MB corpus slice in 44 ms was stored as 14 ms of kernel (the kernel takes
# 0.55 ms). A backend that times its uploads apart (Judgement.parts) has no such guess.
DEF UNSURE_COPY_BYTES = 67108864.0
DEF COPY_DOMINATED_SHARE = 0.5


# The calls this thread has committed and not yet finished, per core and side (at most a few: a call
# holds one side, a call nested in another's run one more). Thread-local so that closing them needs no
# search across threads; the Load they count into is changed under its core's lock. (The compiled common
# path keeps its one hold on its own stack instead: SchedCore._hold's `into`.)
cdef extern from *:
    """
    #define HS_MAX_HELD 4
    static __thread hs_held_t hs_held[HS_MAX_HELD];
    static __thread int hs_nheld;
    """
    enum: HS_MAX_HELD
    hs_held_t hs_held[HS_MAX_HELD]
    int hs_nheld


cdef inline void _held_drop(int i) noexcept nogil:
    global hs_nheld
    cdef int j
    for j in range(i, hs_nheld - 1):
        hs_held[j] = hs_held[j + 1]
    hs_nheld -= 1


# The backends' indices, for Python callers of SchedCore's methods (a cpdef enum, which Python could
# read, cannot index the model's C arrays)
BACKEND_CPU = CPU
BACKEND_GPU = GPU


cdef inline double _side_predict(Slot *s, int be, double size, double *u) noexcept nogil:
    """A side's expected kernel time and its relative uncertainty: the model's, else the side's prior
    (a roofline from what was known at start: Executor._set_priors) with an uncertainty of e, else NaN."""
    cdef Fit *f = &s.fit[be]
    cdef bint prior = s.prior_a[be] > 0 or s.prior_b[be] > 0
    cdef double t = predict_us(s.buckets[be], f, size, u)
    if isnan(t):
        if prior:
            u[0] = 1.0
            return s.prior_a[be] + s.prior_b[be] * size
        return t
    if prior and f.npts == 1 and s.buckets[be][bucket_of(size)].n == 0:
        # one measured size: its time, at other sizes in the prior's shape (a line through one point
        # would have to guess how much of it is fixed cost), as uncertain as a prior
        u[0] = 1.0
        return f.lo_t * (s.prior_a[be] + s.prior_b[be] * size) / (s.prior_a[be] + s.prior_b[be] * f.lo)
    return t


cdef inline double _side_spread(Slot *s, int be, double size, double u) noexcept nogil:
    """A side's run-to-run spread at `size`, relative: the standard deviation of its bucket's samples over
    their mean, else (a size not measured) `u`, the prediction's own uncertainty there."""
    cdef Bucket *bk = &s.buckets[be][bucket_of(size)]
    return bk.rel_sd if bk.n > 0 else u


cdef inline bint _worth_learning(double excess, double sd, long long calls) noexcept nogil:
    """Whether running the predicted loser once is expected to repay itself: its expected improvement
    over the winner per call (the winner's predicted time less the loser's being -excess, the difference
    normal with standard deviation `sd`, the two predictions' combined: E[max(winner - loser, 0)]), over
    the calls still to come at this size, taken to be as many as came before this one (`calls`; a size's
    first call expects none), against what the run is expected to cost beyond the winner (`excess`)."""
    cdef double z, ei
    if not (sd > 0):
        return excess <= 0
    z = -excess / sd
    ei = -excess * 0.5 * erfc(-z * 0.7071067811865476) + sd * 0.3989422804014327 * exp(-0.5 * z * z)
    return ei * calls >= excess


cdef class SchedCore:
    """Owns the C state (declared in _sched.pxd); the dispatcher (_dispatch.FastPath) decides and
    records through its C methods, Python code through `decide` and `record`."""

    def __cinit__(self):
        self.lock = 0
        self.create_lock = threading.Lock()
        self.slot_ids = {}
        self.op_ids = {}
        self.op_priors = {}

    def __init__(self, int window=100, double min_batch=64, int min_samples=3, double exploration_share=0.2,
                 long long reprobe_interval=200, str strategy="automatic", str backend_only="cpu",
                 bint force_cpu=False, long long breaker_failures=3, int health_min_samples=20,
                 double success_threshold=0.95, double speedup_threshold=1.0, double cooldown_s=5.0):
        if window < 1:
            raise ValueError("window must be >= 1")
        self.p.window = window
        self.p.min_batch = min_batch
        self.p.min_samples = min_samples
        self.p.explore_period = max(1, <int>(1.0 / exploration_share + 0.5)) if exploration_share > 0 else 0
        self.p.reprobe_period = reprobe_interval
        self.p.strategy = STRATEGIES.index(strategy)
        self.p.backend_only = 1 if backend_only == "gpu" else 0
        self.p.force_cpu = force_cpu
        self.p.breaker_failures = <int>min(breaker_failures, 0x7fffffff)  # never reached beyond that
        self.p.health_min_samples = health_min_samples
        self.p.success_threshold = success_threshold
        self.p.speedup_threshold = speedup_threshold
        self.p.cooldown_ns = <long long>(cooldown_s * 1e9)
        # until measured: a PCIe-class link (about 10 us per copy, 12 GB/s)
        self.set_transfer(10.0, 12.0, 10.0, 12.0)

    def __dealloc__(self):
        cdef int i, be, b
        # this thread's holds on this core (a test's hold never released) must not outlive it
        i = hs_nheld - 1
        while i >= 0:
            if hs_held[i].lock == &self.lock:
                _held_drop(i)
            i -= 1
        for i in range(self.nslots):
            for be in range(2):
                for b in range(NBUCKETS):
                    free(self.slots[i].buckets[be][b].ring)
                    free(self.slots[i].buckets[be][b].work_ring)
                    free(self.slots[i].buckets[be][b].sorted)
            free(self.slots[i])
        for i in range(self.nops):
            free(self.hl[i].window)

    # ------------------------------------------------------------ setup (not the hot path)
    def set_transfer(self, double h2d_latency_us, double h2d_gbps, double d2h_latency_us, double d2h_gbps):
        """Copy cost model: latency (us) plus bytes / bandwidth (GB/s = 1e3 bytes per us)."""
        if not (0 < h2d_gbps < float("inf") and 0 < d2h_gbps < float("inf")
                and 0 <= h2d_latency_us < float("inf") and 0 <= d2h_latency_us < float("inf")):
            raise ValueError("transfer model needs latencies >= 0 and bandwidths > 0")
        self.p.h2d_latency_us = h2d_latency_us
        self.p.h2d_us_per_byte = 1.0 / (h2d_gbps * 1e3)
        self.p.d2h_latency_us = d2h_latency_us
        self.p.d2h_us_per_byte = 1.0 / (d2h_gbps * 1e3)

    def transfer_model(self):
        return {"h2d_latency_us": self.p.h2d_latency_us, "h2d_gbps": 1.0 / (self.p.h2d_us_per_byte * 1e3),
                "d2h_latency_us": self.p.d2h_latency_us, "d2h_gbps": 1.0 / (self.p.d2h_us_per_byte * 1e3)}

    def set_prior(self, int slot, int backend, double fixed_us, double us_per_work):
        """A side's prior time at `slot`, fixed_us + us_per_work * work, used until the side is measured
        there at any size (a roofline: Executor._set_priors)."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        if not (fixed_us >= 0 and us_per_work >= 0 and isfinite(fixed_us) and isfinite(us_per_work)):
            raise ValueError("a prior needs finite times >= 0")
        hs_lock(&self.lock)
        self.slots[slot].prior_a[backend & 1] = fixed_us
        self.slots[slot].prior_b[backend & 1] = us_per_work
        hs_unlock(&self.lock)

    def set_op_priors(self, dict priors):
        """{op: {"cpu": (fixed us, us per work unit), "gpu": (...)}} (hipsched/priors.py): each side's prior
        for every slot of that op, now and for slots created later."""
        self.op_priors = dict(priors)
        for (op, dtype), sid in list(self.slot_ids.items()):
            self._apply_prior(op, sid)

    def _apply_prior(self, str op, int sid):
        sides = self.op_priors.get(op)
        if not sides:
            return
        for name, be in (("cpu", CPU), ("gpu", GPU)):
            if name in sides:
                self.set_prior(sid, be, sides[name][0], sides[name][1])

    def link_model(self):
        """[(octave of bytes, uploads measured, measured time / the probe's model)] of the uploads timed
        apart so far."""
        cdef int b
        out = []
        hs_lock(&self.lock)
        rows = [(b, self.link.n[b], self.link.ratio[b]) for b in range(LINK_BUCKETS) if self.link.n[b]]
        hs_unlock(&self.lock)
        return rows

    def upload_us(self, double nbytes):
        """What the model says an upload of `nbytes` costs (the measured octaves, else the probe's link)."""
        cdef double t
        hs_lock(&self.lock)
        t = self._h2d_us(nbytes)
        hs_unlock(&self.lock)
        return t

    cdef int _op_index(self, str op) except -1:
        cdef int i
        cdef unsigned char *w
        i = self.op_ids.get(op, -1)
        if i >= 0:
            return i
        if self.nops >= MAX_OPS:
            raise RuntimeError(f"hipsched: more than {MAX_OPS} ops")
        w = <unsigned char *>calloc(self.p.window, 1)
        if w == NULL:
            raise MemoryError()
        i = self.nops
        self.hl[i].window = w
        self.nops += 1
        self.op_ids[op] = i
        return i

    def slot(self, str op, str dtype):
        """The slot id of (op, dtype), created on first use. Creation is serialised by a Python lock
        (it touches dicts, which may run Python code); the spin lock only covers the C publish."""
        key = (op, dtype)
        sid = self.slot_ids.get(key)
        if sid is not None:
            return sid
        cdef Slot *s
        with self.create_lock:
            sid = self.slot_ids.get(key)
            if sid is not None:
                return sid
            if self.nslots >= MAX_SLOTS:
                raise RuntimeError(f"hipsched: more than {MAX_SLOTS} (op, dtype) pairs")
            s = <Slot *>calloc(1, sizeof(Slot))  # bucket rings come with their first sample
            if s == NULL:
                raise MemoryError()
            s.op_index = self._op_index(op)
            hs_lock(&self.lock)
            self.slots[self.nslots] = s
            sid = self.nslots
            self.nslots += 1
            hs_unlock(&self.lock)
            self.slot_ids[key] = sid
            self._apply_prior(op, sid)
            return sid

    # ------------------------------------------------------------ the hot path
    cdef double _h2d_us(self, double h2d) noexcept nogil:
        """An upload's time: the probe's latency and rate, times what measured uploads of that octave of
        bytes took over what the probe said of them (_link.pxd)."""
        if h2d <= 0:
            return 0.0
        return (self.p.h2d_latency_us + h2d * self.p.h2d_us_per_byte) * link_ratio(&self.link, h2d)

    cdef double _backlog(self, int side, long long now) noexcept nogil:
        """Predicted us until the side has finished the work committed to it (_load.pxd's load_backlog)."""
        return load_backlog(&self.load[side], now)

    cdef void _hold(self, int side, double t_us, bint queued, long long now, hs_held_t *into) noexcept nogil:
        """A committed decision taken at `now` (under the lock): the call's predicted time joins the
        side's work until its record (or the end of its run: _release) takes it off. The hold goes
        in `into` when given (its caller ends it: _record_held, _unhold), else on this thread's list."""
        global hs_nheld
        cdef hs_held_t *e = into
        if e == NULL:
            if hs_nheld >= HS_MAX_HELD:
                return
            e = &hs_held[hs_nheld]
            hs_nheld += 1
        load_hold(&self.load[side & 1], e, &self.lock, t_us, queued, now)

    cdef void _unhold(self, hs_held_t *e) noexcept nogil:
        """Ends a hold kept by its caller (_hold's `into`) whose call ended without its record."""
        if e.load != NULL:
            hs_lock(e.lock)
            load_finish(e, self._now(), False)
            hs_unlock(e.lock)
            e.load = NULL

    cdef int _held(self) noexcept nogil:
        """How many calls this thread holds (a dispatched call releases down to the count it began with)."""
        return hs_nheld

    cdef void _release(self, int mark) noexcept:
        """Ends this thread's held calls above `mark` that no record ended (a run that raised before its
        record): called at the end of each dispatched call with the count it began with, so a call nested
        in another's run leaves the outer call's hold alone. Any core's holds: a call on a further GPU
        holds on that device's core."""
        global hs_nheld
        if mark < 0:
            mark = 0
        while hs_nheld > mark:
            self._unhold(&hs_held[hs_nheld - 1])
            hs_nheld -= 1

    def hold(self, int backend, double predicted_us, bint queued=False):
        """Commits a call of `predicted_us` to a side for this thread, as a dispatched decision does,
        until a record of that side on this thread or release() ends it (for tests and Python paths)."""
        cdef long long now = self._now()
        hs_lock(&self.lock)
        self._hold(backend & 1, predicted_us, queued, now, NULL)
        hs_unlock(&self.lock)

    def release(self):
        """Ends this thread's held calls (see _release). A test that holds must release on the same
        thread before the core goes: a held entry points into the core."""
        self._release(0)

    def set_clock(self, long long ns):
        """Makes the core read `ns` as the time (a simulated machine in virtual time moves it), or the
        monotonic clock again with 0."""
        self.clock_ns = ns

    def backlog(self):
        """(cpu us, gpu us): the predicted time until each side has finished the work committed to it."""
        cdef double c, g
        cdef long long now
        hs_lock(&self.lock)
        now = self._now()
        c = self._backlog(CPU, now)
        g = self._backlog(GPU, now)
        hs_unlock(&self.lock)
        return c, g

    def in_flight(self):
        """(cpu, gpu): how many committed calls each side holds now (any thread's)."""
        return self.load[CPU].inflight, self.load[GPU].inflight

    cdef double _xfer(self, double h2d, double d2h) noexcept nogil:
        cdef double t = self._h2d_us(h2d)
        if d2h > 0:
            t += self.p.d2h_latency_us + d2h * self.p.d2h_us_per_byte
        return t

    cdef int _decide(self, Slot *s, double size, double h2d, double d2h, int flags,
                     double *pc, double *pg, bint commit) noexcept nogil:
        """Returns backend | reason << 1, and the predicted us on each side (NaN when unknown).
        Without `commit` nothing changes (exploration budget, breaker state): a what-if query."""
        cdef Params *p = &self.p
        cdef Health *h = &self.hl[s.op_index]
        cdef Bucket *bc
        cdef int gpu_ok = (flags & F_GPU_PRESENT) and (flags & F_GPU_SUPPORTS)
        cdef int on_device = flags & F_ON_DEVICE
        cdef long long calls
        cdef double c, g, kc, kg, uc = 0, ug = 0, copies, cc = 0, cg = 0, best, lcb, lcb_best, excess, se
        cdef int loser
        cdef double blc = 0, blg = 0, shared = 0, gt, xg, fc, fg, wc, wg
        cdef long long now
        kc = _side_predict(s, CPU, size, &uc)
        kg = _side_predict(s, GPU, size, &ug)
        # the copies are paid by the side the data is not on: host data goes up and back for the GPU,
        # device data comes down and its results go back up for the CPU
        copies = self._xfer(h2d, d2h)
        if on_device:
            cc = copies
        else:
            cg = copies
        c = kc + cc
        g = kg + cg
        pc[0] = c
        pg[0] = g
        # the work already committed to each side, when any: a call finishes after the side's backlog
        # (device inputs are ready no sooner than the GPU's queue ends, so a CPU run of them waits too);
        # one caller alone has none, or the same on both sides, and is decided as before
        if self.load[CPU].inflight or self.load[GPU].inflight or self.load[GPU].queued_until_ns \
                or self.load[CPU].queued_until_ns:
            now = self._now()
            blc = self._backlog(CPU, now)
            blg = self._backlog(GPU, now)
            shared = blc   # the CPU's own calls, whose cores a CPU run would share (rule 7)
            if on_device and blg > blc:
                blc = blg
        # 1. what the user asked for
        if p.force_cpu or flags & F_WANT_CPU:
            return CPU | R_USER_PREFERENCE << 1
        if flags & F_WANT_GPU or (p.strategy == ST_BACKEND_ONLY and p.backend_only == GPU):
            if not gpu_ok:
                return CPU | R_GPU_UNAVAILABLE << 1
            # a call the device cannot run is not run there even when asked for: it would only fail
            return (CPU | R_GPU_UNSUPPORTED << 1) if flags & F_CALL_UNSUPPORTED else (GPU | R_USER_PREFERENCE << 1)
        if p.strategy == ST_BACKEND_ONLY:
            return CPU | R_USER_PREFERENCE << 1
        # 2. capability
        if not gpu_ok:
            return CPU | R_GPU_UNAVAILABLE << 1
        if flags & F_CALL_UNSUPPORTED:
            return CPU | R_GPU_UNSUPPORTED << 1
        if not flags & F_FITS:
            return CPU | R_MEMORY_CONSTRAINT << 1
        # 3. health: while open, CPU; after the cooldown one probe call goes to the GPU
        if h.state != S_CLOSED:
            if h.state == S_OPEN and size >= p.min_batch and self._now() - h.opened_at_ns >= p.cooldown_ns:
                if commit:
                    h.state = S_HALF_OPEN
                    h.probe_in_flight = 1
                return GPU | R_EXPLORING << 1
            return CPU | R_GPU_UNHEALTHY << 1
        # 4. too small to be worth a launch
        if size < p.min_batch:
            return CPU | R_BELOW_MIN_BATCH << 1
        # 5. fixed preferences
        if p.strategy == ST_GPU_PREFERRED:
            return GPU | R_GPU_AVAILABLE << 1
        if p.strategy == ST_CPU_PREFERRED:
            return CPU | R_USER_PREFERENCE << 1
        bc = &s.buckets[CPU][bucket_of(size)]
        calls = bc.calls + 1
        if commit:
            bc.calls = calls
        # 6. a side with no estimate at all (no sample at any size, no prior) is tried: one run gives the
        # fit a point for every size. Not a GPU run of host data whose modelled uploads alone take longer
        # than the CPU's whole run (it could not win, and a run dominated by copies teaches little), nor a
        # CPU run of device data until it could be worth its copies.
        if p.explore_period > 0:
            if isnan(g) and not isnan(c) and not (not on_device and cg > c):
                return GPU | R_EXPLORING << 1
            # device data: once the GPU's time at the size is known (min_samples runs: a first run holds
            # the first use's costs) and the CPU's copies alone do not exceed it
            if isnan(c) and not isnan(g) and (not on_device or (
                    s.buckets[GPU][bucket_of(size)].n >= p.min_samples and cc < g)):
                return CPU | R_EXPLORING << 1
        if on_device and (isnan(g) or isnan(c)):
            return GPU | R_COST_MODEL << 1
        if isnan(g):
            return CPU | R_COST_MODEL << 1
        if isnan(c):
            return GPU | R_COST_MODEL << 1
        # 7. under load (docs/design/scheduling.md, "Under load"): the earliest predicted finish, the
        # GPU needing the configured speedup on its own time. Two finishes within the predictions'
        # standard error of each other are a tie, which goes to the side with less work waiting: this
        # call ends as soon either way, and the busier side stays free for the calls behind it (with two
        # callers and a GPU twice the CPU's time, sending ties to the busier side kept the GPU idle). A
        # side measured too little to tell is inside that band, so under load it is still measured.
        if blc != blg:
            # what the call costs everyone, not its own end alone. The CPU's calls share its cores, so
            # a call sent there also slows the ones already running, each until it or they end: about
            # min(their work left, its own) more time for them (two callers with the CPU twice the GPU's
            # speed both went to the CPU, each call ending no later there, and the GPU idled). The GPU
            # runs its stream in order, so it slows none of the calls ahead of this one; but the first of
            # them to end has a caller that calls again, and its next call then waits behind this one:
            # this call's time, unless leaving the GPU costs that next call less (the GPU's mean loss
            # over recent calls under load, since which op comes next is not known; a call's own loss in
            # its place sent top_k to the slow CPU whenever another caller's top_k held the GPU, though
            # that caller's next call was a softmax bound for the CPU). By its own end alone, two
            # callers with the GPU twice the CPU's speed queued behind each other on the GPU (r + g left
            # never above the CPU's c = 2g) while the CPU idled: 0.70 of both sides' throughput. (Every
            # caller ahead counted, not only the first, did worse with 8-16 callers of mixed ops: they
            # meet the queue's length in their own decisions.) bench/concurrency.py
            gt = g * p.speedup_threshold
            if commit and self.load[GPU].inflight:
                load_note(&self.load[GPU], gt, c, p.window)
            xg = gt if gt < self.load[GPU].loss_us else self.load[GPU].loss_us
            fc = blc + c + (shared if shared < c else c)
            fg = blg + gt + (xg if self.load[GPU].inflight else 0)
            # the work waiting on a side ends when its calls do, not when their means say: it is as
            # uncertain as their runs spread (this op's spread on that side standing for theirs; k calls
            # of about equal time: spread * backlog / sqrt(k)). With noisy runs and two sides twice apart,
            # a band of the means' standard error alone left the busier side winning by accidents of the
            # estimates: two callers on the GPU while the CPU idled (bench/concurrency.py)
            wc = _side_spread(s, CPU, size, uc) * blc / sqrt(<double>(self.load[CPU].inflight or 1))
            wg = _side_spread(s, GPU, size, ug) * blg / sqrt(<double>(self.load[GPU].inflight or 1))
            se = sqrt((uc * kc) * (uc * kc) + (ug * kg) * (ug * kg) + wc * wc + wg * wg)
            if (fc - fg if fc > fg else fg - fc) <= TIE_Z * se:
                return (GPU if blg < blc else CPU) | R_COST_MODEL << 1
            return (GPU if fg < fc else CPU) | R_COST_MODEL << 1
        # 8. explore the predicted loser while it could still win (EXPLORE_Z of its uncertainty below its
        # prediction, copies kept: they are measured, not guessed) and the budget allows; its copies alone
        # losing rule it out
        loser = CPU if g * p.speedup_threshold < c else GPU
        best = g if loser == CPU else c
        if commit:
            s.run_us += best   # (a what-if reads the budget as if it had been committed)
        if p.explore_period > 0:
            # (optimism on both sides, as UCB: the loser is tried when its optimistic time beats the
            # winner's optimistic time; against a well-measured winner, the winner's time)
            if loser == GPU:
                lcb = (kg / (1.0 + EXPLORE_Z * ug) + cg) * p.speedup_threshold
                lcb_best = kc / (1.0 + EXPLORE_Z * uc) + cc
                excess = g - best
                bc = &s.buckets[GPU][bucket_of(size)]
            else:
                lcb = kc / (1.0 + EXPLORE_Z * uc) + cc
                lcb_best = (kg / (1.0 + EXPLORE_Z * ug) + cg) * p.speedup_threshold
                excess = c - best
                bc = &s.buckets[CPU][bucket_of(size)]
            # (a winner known only by a guess is run first: its run is the cheaper lesson, and the loser's
            # turn comes once the winner's time is measured, if the loser could still beat it)
            # (a size the loser ran fewer than three times is not measured yet, as the tie rule below
            # has it: one or two runs, one slow draw or a first touch among them, decide nothing. Past the
            # budget, such a size is tried when the run is expected to repay itself over as many calls
            # again at the size as came before this one (_worth_learning). Tried whatever it cost, as
            # before, a bimodal side whose fast runs sat near the winner was tried at the first calls
            # until it drew its slow mode: bench/results/routing-machines.md, 2026-11-29)
            if (uc if loser == GPU else ug) < 1.0 and lcb < lcb_best and (
                    (bc.n < 3 and _worth_learning(excess, sqrt((uc * kc) * (uc * kc) + (ug * kg) * (ug * kg)),
                                                  calls - 1)) or
                    s.explore_us + excess <= EXPLORE_BUDGET * (s.run_us + (0 if commit else best))):
                if commit:
                    s.explore_us += excess
                return loser | R_EXPLORING << 1
            # drift: now and then the loser is measured again, unless far behind
            if p.reprobe_period > 0 and calls % p.reprobe_period == 0 and \
                    (c if loser == CPU else g) < REPROBE_MAX_RATIO * best:
                return loser | R_EXPLORING << 1
        # 9. the cost model: least predicted completion time, the GPU needing the configured speedup; two
        # sides within their noise of each other are a tie, which leaves data where it is
        # (measured at this size on both sides, three times each: a guess's uncertainty is not noise, and
        # must not decide)
        se = sqrt((uc * kc) * (uc * kc) + (ug * kg) * (ug * kg))
        if s.buckets[CPU][bucket_of(size)].n >= 3 and s.buckets[GPU][bucket_of(size)].n >= 3 and \
                (c - g if c > g else g - c) <= TIE_Z * se:
            if on_device:
                return GPU | R_COST_MODEL << 1
            if cg > 0:
                return CPU | R_COST_MODEL << 1
        return (GPU if loser == CPU else CPU) | R_COST_MODEL << 1

    def decide(self, int slot, double size, double h2d_bytes=0.0, double d2h_bytes=0.0, int flags=0,
               bint commit=True):
        """(backend 0 cpu / 1 gpu, reason index into REASONS, predicted cpu us, predicted gpu us)."""
        cdef double pc, pg
        cdef int r
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        # The GIL is kept: releasing it would cost more than the decision. The lock still serialises
        # the state for callers that do release it (and for free-threaded builds).
        hs_lock(&self.lock)
        r = self._decide(self.slots[slot], size, h2d_bytes, d2h_bytes, flags, &pc, &pg, commit)
        hs_unlock(&self.lock)
        return r & 1, r >> 1, pc, pg

    def time_decide_record(self, int slot, const double[:] sizes, int flags, double duration_us=10.0):
        """Nanoseconds per decide+record pair as the compiled fast path pays them (lock included, no
        Python call overhead): one pass over `sizes`, each decision recorded with `duration_us`."""
        cdef double pc, pg
        cdef long long t0, t1
        cdef Py_ssize_t i, n = sizes.shape[0]
        cdef int r
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        if n == 0:
            return 0.0
        cdef Slot *s = self.slots[slot]
        with nogil:
            t0 = now_ns()
            for i in range(n):
                hs_lock(&self.lock)
                r = self._decide(s, sizes[i], 4096.0, 4096.0, flags, &pc, &pg, True)
                hs_unlock(&self.lock)
                hs_lock(&self.lock)
                self._record(s, r & 1, sizes[i], duration_us, 4096.0, 4096.0, True, True, False)
                hs_unlock(&self.lock)
            t1 = now_ns()
        return (t1 - t0) / <double>n

    cdef void _health(self, Health *h, bint ok) noexcept nogil:
        if health_update(h, ok, self.p.window, self.p.breaker_failures, self.p.health_min_samples,
                         self.p.success_threshold):
            h.opened_at_ns = self._now()

    cdef void _sample(self, Slot *s, int backend, double size, double dur_us, double h2d,
                      double d2h) noexcept nogil:
        """One latency sample, less the modelled copies it included (those of host data on the GPU, or of
        device data on the CPU): the buckets hold compute time, and each decision adds its own copies.
        A run dominated by large copies adds none (see UNSURE_COPY_BYTES)."""
        cdef double t, x
        if not (dur_us >= 0 and isfinite(dur_us)):   # NaN/inf are not completion times
            return
        x = self._xfer(h2d, d2h)
        if h2d + d2h >= UNSURE_COPY_BYTES and x > COPY_DOMINATED_SHARE * dur_us:
            return
        t = dur_us - x
        if t < MIN_KERNEL_SHARE * dur_us:
            t = MIN_KERNEL_SHARE * dur_us
        self._add(s, backend, size, t)

    cdef void _add(self, Slot *s, int backend, double size, double t) noexcept nogil:
        cdef int b = bucket_of(size)
        if s.buckets[backend][b].n == 0:
            # how far the model was at a size it had not measured: the uncertainty of its next guesses
            check_unseen(s.buckets[backend], &s.fit[backend], size, t)
            s.fit[backend].dirty = 1
        s.fit[backend].pending += 1
        bucket_add(&s.buckets[backend][b], &s.fit[backend], self.p.window, t, size)

    cdef void _sample_parts(self, Slot *s, double size, double kernel_us, double up_bytes,
                            double up_us) noexcept nogil:
        """A GPU run timed in parts: its kernel time is the sample as it is, and its uploads teach the
        link model (the measured time over the probe's, per octave of bytes)."""
        if up_bytes > 0 and up_us > 0 and isfinite(up_us):
            link_learn(&self.link, up_bytes, up_us, self.p.h2d_latency_us + up_bytes * self.p.h2d_us_per_byte)
        if kernel_us >= 0 and isfinite(kernel_us):
            self._add(s, GPU, size, kernel_us)

    cdef void _record(self, Slot *s, int backend, double size, double dur_us, double h2d, double d2h,
                      bint ok, bint final, bint fallback) noexcept nogil:
        """_record_held with this thread's hold on the side, the innermost (a call nested in a run)."""
        cdef int i
        for i in range(hs_nheld - 1, -1, -1):
            if hs_held[i].load == <void *>&self.load[backend]:
                self._record_held(&hs_held[i], s, backend, size, dur_us, h2d, d2h, ok, final, fallback)
                _held_drop(i)
                return
        self._record_held(NULL, s, backend, size, dur_us, h2d, d2h, ok, final, fallback)

    cdef void _record_held(self, hs_held_t *e, Slot *s, int backend, double size, double dur_us, double h2d,
                           double d2h, bint ok, bint final, bint fallback) noexcept nogil:
        cdef double sample_us = dur_us
        cdef long long now
        # the call's hold `e` on this side (may be NULL or ended) ends here, and the sample is what the
        # run would have taken alone (load_alone_us)
        if e != NULL and e.load == <void *>&self.load[backend]:
            # (the run's end as its own timing has it, where it has one: no second clock read)
            now = e.t0_ns + <long long>(dur_us * 1e3) if dur_us > 0 and isfinite(dur_us) else self._now()
            sample_us = load_alone_us(e, dur_us, ok, now)
            load_finish(e, now, e.queued and ok and dur_us < 0)
            e.load = NULL
        if backend == GPU:
            self._health(&self.hl[s.op_index], ok)
        if ok:
            self._sample(s, backend, size, sample_us, h2d, d2h)
        if final:
            self.c.total += 1
            if fallback:
                self.c.fallback += 1
            if backend == GPU:
                self.c.gpu += 1
                if dur_us > 0:
                    self.c.gpu_time_us += dur_us
            else:
                self.c.cpu += 1
                if dur_us > 0:
                    self.c.cpu_time_us += dur_us

    def record(self, int slot, int backend, double size, double duration_us, double h2d_bytes=0.0,
               double d2h_bytes=0.0, bint ok=True, bint final=True, bint fallback=False):
        """One measured run. A GPU run updates the op's health; a successful run adds a latency sample
        (less the modelled copies given: see _sample) unless duration_us < 0 (not a completion time, e.g. work
        left queued on a stream); `final` runs count as one operation each."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        hs_lock(&self.lock)
        self._record(self.slots[slot], backend & 1, size, duration_us, h2d_bytes, d2h_bytes, ok, final,
                     fallback)
        hs_unlock(&self.lock)

    def record_parts(self, int slot, double size, double duration_us, double kernel_us, double upload_bytes,
                     double upload_us, bint fallback=False):
        """One successful GPU run of host data timed in parts by its backend (Judgement.parts):
        counted and recorded as record() does, its sample the kernel's measured time, its uploads the
        link model's. A part not timed (NaN) teaches nothing."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        hs_lock(&self.lock)
        self._record(self.slots[slot], GPU, size, -1.0, 0.0, 0.0, True, True, fallback)
        self._sample_parts(self.slots[slot], size, kernel_us, upload_bytes, upload_us)
        if duration_us > 0:
            self.c.gpu_time_us += duration_us
        hs_unlock(&self.lock)

    def record_sample(self, int slot, int backend, double size, double duration_us, double h2d_bytes=0.0,
                      double d2h_bytes=0.0):
        """A successful run's latency that is not an operation of its own: a split call's part, or a
        sample given through the seeds' API."""
        self.record(slot, backend, size, duration_us, h2d_bytes, d2h_bytes, True, False, False)

    def record_gpu_failure(self, int slot, double size, double duration_us=-1.0, double h2d_bytes=0.0,
                           double d2h_bytes=0.0):
        """A GPU run that failed, or was interrupted (duration -1): the op's GPU health sees it (a
        half-open breaker's probe ends), and nothing else does."""
        self.record(slot, GPU, size, duration_us, h2d_bytes, d2h_bytes, False, False, False)

    def record_gpu_queued(self, int slot, double size):
        """A GPU run whose work was left queued on its stream: a success for the op's GPU health, with
        no completion time to learn (its events give that later)."""
        self.record(slot, GPU, size, -1.0, 0.0, 0.0, True, False, False)

    def count_split(self, double cpu_us, double gpu_us, bint fallback):
        """One call split across the sides (its parts recorded with final=False): counted once, as a
        split, with each side's busy time added to that side's."""
        hs_lock(&self.lock)
        self.c.total += 1
        self.c.split += 1
        if fallback:
            self.c.fallback += 1
        if cpu_us > 0:
            self.c.cpu_time_us += cpu_us
        if gpu_us > 0:
            self.c.gpu_time_us += gpu_us
        hs_unlock(&self.lock)

    def count_gpu_run(self, double gpu_us):
        """One call run whole on a further GPU (its health and samples are that device's own core's):
        counted once among this core's GPU operations, leaving this core's GPU health alone, which is
        another device's. gpu_us < 0: no time (work left queued on the device)."""
        hs_lock(&self.lock)
        self.c.total += 1
        self.c.gpu += 1
        if gpu_us > 0:
            self.c.gpu_time_us += gpu_us
        hs_unlock(&self.lock)

    def learn(self, int slot, int backend, double size, double duration_us, double h2d_bytes=0.0,
              double d2h_bytes=0.0):
        """A latency sample of a run already recorded (its health and counts taken then) whose completion
        time became known only later: a GPU run on device data, timed by events read on a later call."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        hs_lock(&self.lock)
        self._sample(self.slots[slot], backend & 1, size, duration_us, h2d_bytes, d2h_bytes)
        hs_unlock(&self.lock)

    def release_probe(self, int slot):
        """A GPU run refused before it started because the device cannot run that call (GpuError kind
        "unsupported": a launch limit, a shape the kernels do not take) tells nothing about the GPU's
        health, so it is not recorded. If it was the half-open probe, the breaker goes back to open with
        its cooldown already served: the next eligible call probes again instead of the breaker staying
        half-open (every call on the CPU) for good."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        cdef Health *h
        hs_lock(&self.lock)
        h = &self.hl[self.slots[slot].op_index]
        if h.state == S_HALF_OPEN:
            h.state = S_OPEN
            h.probe_in_flight = 0
        hs_unlock(&self.lock)

    # ------------------------------------------------------------ introspection and persistence
    def counters(self):
        cdef Counters c
        hs_lock(&self.lock)
        c = self.c
        hs_unlock(&self.lock)
        return {"total_operations": c.total, "cpu_operations": c.cpu, "gpu_operations": c.gpu,
                "fallback_operations": c.fallback, "split_operations": c.split, "cpu_time_us": c.cpu_time_us,
                "gpu_time_us": c.gpu_time_us}

    def reset_counters(self):
        hs_lock(&self.lock)
        self.c.total = self.c.cpu = self.c.gpu = self.c.fallback = self.c.split = 0
        self.c.cpu_time_us = self.c.gpu_time_us = 0
        hs_unlock(&self.lock)

    def health(self, str op):
        """The GPU health of `op`: breaker state, success rate over the window, totals."""
        i = self.op_ids.get(op)
        if i is None:
            return {"state": "closed", "success_rate": 1.0, "window": 0, "consecutive_failures": 0,
                    "successes": 0, "failures": 0, "times_opened": 0}
        cdef Health h
        hs_lock(&self.lock)
        h = self.hl[<int>i]
        hs_unlock(&self.lock)
        return {"state": BREAKER_STATES[h.state],
                "success_rate": (h.n - h.failures_in_window) / <double>h.n if h.n else 1.0, "window": h.n,
                "consecutive_failures": h.consecutive_failures, "successes": h.successes,
                "failures": h.failures, "times_opened": h.times_opened}

    def predict(self, int slot, int backend, double size):
        """Predicted kernel us (no copies) on one side, NaN when nothing is known."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        cdef double r
        hs_lock(&self.lock)
        r = predict_us(self.slots[slot].buckets[backend & 1], &self.slots[slot].fit[backend & 1], size)
        hs_unlock(&self.lock)
        return r

    def predict_spread(self, int slot, int backend, double size):
        """(expected kernel us, relative uncertainty) on one side, the prior's where nothing is measured;
        (NaN, inf) when nothing is known."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        cdef double r, u = 0
        hs_lock(&self.lock)
        r = _side_predict(self.slots[slot], backend & 1, size, &u)
        hs_unlock(&self.lock)
        return r, u

    # Introspection copies C state under the spin lock and builds Python objects after releasing it:
    # creating objects can run arbitrary Python (a GC finalizer) and switch threads, and a thread
    # spinning for the lock while holding the GIL would then wait forever.
    def buckets(self, int slot, int backend):
        """[(bucket, samples held, mean work, median us, samples ever)] for buckets with data."""
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"hipsched: no scheduler slot {slot}")
        cdef int b
        cdef int n[NBUCKETS]
        cdef double mean[NBUCKETS]
        cdef double med[NBUCKETS]
        cdef long long total[NBUCKETS]
        cdef Bucket *bk
        hs_lock(&self.lock)
        for b in range(NBUCKETS):
            bk = &self.slots[slot].buckets[backend & 1][b]
            n[b] = bk.n
            if bk.n:
                mean[b] = bk.work_sum / bk.n
                med[b] = bucket_median(bk)
                total[b] = bk.total
        hs_unlock(&self.lock)
        return [(b, n[b], mean[b], med[b], total[b]) for b in range(NBUCKETS) if n[b]]

    def export_samples(self):
        """{(op, dtype): [[(work, us), ...] cpu oldest first, [...] gpu]} for persistence."""
        out = {}
        cdef Bucket *bk
        cdef int be, b, i, j, k, w = self.p.window
        cdef double *buf = <double *>malloc(2 * NBUCKETS * w * sizeof(double))
        if buf == NULL:
            raise MemoryError()
        try:
            for key, sid in list(self.slot_ids.items()):
                sides = []
                for be in range(2):
                    k = 0
                    hs_lock(&self.lock)
                    for b in range(NBUCKETS):
                        bk = &self.slots[<int>sid].buckets[be][b]
                        for i in range(bk.n):
                            j = (bk.pos - bk.n + i + w) % w
                            buf[2 * k] = bk.work_ring[j]
                            buf[2 * k + 1] = bk.ring[j]
                            k += 1
                    hs_unlock(&self.lock)
                    sides.append([(buf[2 * i], buf[2 * i + 1]) for i in range(k)])
                if sides[0] or sides[1]:
                    out[key] = sides
        finally:
            free(buf)
        return out

    def import_samples(self, dict data):
        """Loads what export_samples produced (samples are model state, not operations: no counts)."""
        cdef int sid, be
        cdef double w, t
        for key, sides in data.items():
            sid = self.slot(key[0], key[1])
            for be in range(2):
                for w, t in sides[be]:
                    if not (w >= 0 and t >= 0 and isfinite(w) and isfinite(t)):
                        raise ValueError(f"bad sample ({w}, {t}) for {key}")
                    hs_lock(&self.lock)
                    bucket_add(&self.slots[sid].buckets[be][bucket_of(w)], &self.slots[sid].fit[be],
                               self.p.window, t, w)
                    self.slots[sid].fit[be].dirty = 1
                    hs_unlock(&self.lock)

    @property
    def window(self):
        return self.p.window

    @property
    def min_samples(self):
        return self.p.min_samples
