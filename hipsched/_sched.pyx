# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The scheduler core: per-call CPU/GPU decision, performance model and GPU health, in C structs
(the per-call path that uses it is _dispatch.pyx).

Every sample, decision and health change happens under one lock, so counts stay exact with many
Python threads. Decisions never allocate; a record allocates only for a size bucket's first sample
(its rings), once per bucket. The rules and the model are described in docs/guide/backends-and-routing.md and docs/design/scheduling.md."""
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport isfinite, isnan

from hipsched._perfmodel cimport bucket_add, bucket_median, bucket_of, floor_below, measured_near, predict_us

import threading

from hipsched.config import STRATEGIES

# The flags, reasons, strategies, backends and breaker states are the cpdef enums of _sched.pxd: one
# definition, read as C constants here and as this module's Python names (F_GPU_PRESENT, R_COST_MODEL,
# ...) by the executor. REASONS names the reasons in their index order, the strings telemetry writes:
# each is its enum member's name without "R_", lower-cased (R_COST_MODEL: "cost_model");
# scheduling.SelectionReason is built from it.
REASONS = tuple(m.name[2:].lower() for m in sorted(Reason, key=int))
BREAKER_STATES = ("closed", "open", "half_open")
# Python sees the enum classes (Flag, Reason, ...); their members also go in the module namespace, the
# spelling the executor and the tests use (_sched.F_FITS).
globals().update({m.name: m for e in (Flag, Reason, Strategy, BreakerState) for m in e})
# config.STRATEGIES (importable with nothing built: the configuration is checked before any build is
# needed) must be the Strategy enum's names without "ST_", lower-cased, in index order
if tuple(STRATEGIES) != tuple(m.name[3:].lower() for m in sorted(Strategy, key=int)):  # pragma: no cover
    raise ImportError("hipsched._sched: config.STRATEGIES is not the Strategy enum (a build out of step)")

# A re-probe of the losing side is skipped when it is predicted this many times slower: drift that
# large would not go unnoticed anyway, and probing it would cost more than it could ever win back.
DEF REPROBE_MAX_RATIO = 4.0
# An under-sampled bucket does not explore a side predicted this many times slower than the other where
# the prediction rests on measurements at or around the size (_perfmodel.measured_near): 1.5x is past
# the run-to-run spread of a median, so such a call would only confirm what is known.
DEF EXPLORE_MAX_RATIO = 1.5
# A GPU sample is its wall time less the modelled copies, but never less than this share of the wall
# time (a too-pessimistic transfer model must not produce zero-cost kernels).
DEF MIN_KERNEL_SHARE = 0.1
# A run whose modelled copies of at least UNSURE_COPY_BYTES make up more than COPY_DOMINATED_SHARE of its
# time teaches nothing: what is left after subtracting them is mostly the copy model's error. On the H100
# pageable uploads of 350-805 MB ran at 8 GB/s where the model said 11.75 (measured with 16 MB), so a
# top_k that uploaded a 350 MB corpus slice in 44 ms was stored as 14 ms of kernel (the kernel takes
# 0.55 ms) and every later call over that slice, resident by then, went to a CPU 5x slower.
DEF UNSURE_COPY_BYTES = 67108864.0
DEF COPY_DOMINATED_SHARE = 0.5


# The backends' indices, for Python callers of SchedCore's methods (a cpdef enum, which Python could
# read, cannot index the model's C arrays)
BACKEND_CPU = CPU
BACKEND_GPU = GPU

cdef inline bint _not_worth_exploring(Bucket *bks, Fit *f, double mine, double other, double size, bint early,
                                      bint copies_lose) noexcept nogil:
    """Whether an under-sampled bucket's call should not explore this side (predicted `mine` us against
    the other side's `other`), by the rules in SchedCore._decide step 6; `copies_lose`: its copies alone
    rule it out. At a bucket's first two calls (`early`) only a guess within EXPLORE_MAX_RATIO is tried."""
    cdef bint near = measured_near(bks, f, size)
    if copies_lose or (mine > EXPLORE_MAX_RATIO * other and near) or floor_below(bks, size) > EXPLORE_MAX_RATIO * other:
        return True
    return early and (mine > EXPLORE_MAX_RATIO * other or near)


cdef class SchedCore:
    """Owns the C state (declared in _sched.pxd); the dispatcher (_dispatch.FastPath) decides and
    records through its C methods, Python code through `decide` and `record`."""

    def __cinit__(self):
        self.lock = 0
        self.create_lock = threading.Lock()
        self.slot_ids = {}
        self.op_ids = {}

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
            return sid

    # ------------------------------------------------------------ the hot path
    cdef double _xfer(self, double h2d, double d2h) noexcept nogil:
        cdef double t = 0
        if h2d > 0:
            t += self.p.h2d_latency_us + h2d * self.p.h2d_us_per_byte
        if d2h > 0:
            t += self.p.d2h_latency_us + d2h * self.p.d2h_us_per_byte
        return t

    cdef int _decide(self, Slot *s, double size, double h2d, double d2h, int flags,
                     double *pc, double *pg, bint commit) noexcept nogil:
        """Returns backend | reason << 1, and the predicted us on each side (NaN when unknown).
        Without `commit` nothing changes (exploration pacing, breaker state): a what-if query."""
        cdef Params *p = &self.p
        cdef Health *h = &self.hl[s.op_index]
        cdef Bucket *bc
        cdef Bucket *bg
        cdef int gpu_ok = (flags & F_GPU_PRESENT) and (flags & F_GPU_SUPPORTS)
        cdef int on_device = flags & F_ON_DEVICE
        cdef long long calls
        cdef double c, g, copies
        cdef bint early
        c = predict_us(s.buckets[CPU], &s.fit[CPU], size)
        g = predict_us(s.buckets[GPU], &s.fit[GPU], size)
        # the copies are paid by the side the data is not on: host data goes up and back for the GPU,
        # device data comes down and its results go back up for the CPU
        copies = self._xfer(h2d, d2h)
        if on_device:
            if not isnan(c):
                c += copies
        elif not isnan(g):
            g += copies
        pc[0] = c
        pg[0] = g
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
            if h.state == S_OPEN and size >= p.min_batch and now_ns() - h.opened_at_ns >= p.cooldown_ns:
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
        # 6. learn what is not known yet, then re-probe now and then
        bc = &s.buckets[CPU][bucket_of(size)]
        bg = &s.buckets[GPU][bucket_of(size)]
        calls = bc.calls + 1
        if commit:
            bc.calls = calls
        # A side never measured at any size has no estimate, and one run tells the fit enough to
        # predict every size: it is tried on a bucket's first two calls (the very first call of an op
        # has nothing measured on either side and goes to the CPU), then 1 in explore_period, rather
        # than only at the explore_period-th call (a workload with few calls per size, like a model's
        # layers, would otherwise run most of them on a side it never compared).
        if p.explore_period > 0 and (calls <= 2 or calls % p.explore_period == 0):
            # (not a GPU run of host data whose uploads alone take EXPLORE_MAX_RATIO times the CPU's
            # whole run: it could not win, and a run dominated by large copies teaches nothing, so the
            # GPU would stay unmeasured and be tried again and again, each time paying the copies)
            if isnan(g) and not isnan(c) and not (not on_device and self._xfer(h2d, 0.0) > EXPLORE_MAX_RATIO * c):
                return GPU | R_EXPLORING << 1
            # (not for device data: it stays where it lives until the CPU is known to be worth its
            # copies, which the under-sampled rule below weighs; a device pipeline's first GPU sample
            # holds the first use's costs, and trying the CPU on it sent 1 call of the H100's
            # 40-call torch add pipeline down and back up)
            if isnan(c) and not isnan(g) and not on_device:
                return CPU | R_EXPLORING << 1
        if bg.n < p.min_samples or bc.n < p.min_samples:
            # A bucket's first two calls also explore, but only a side whose prediction is a guess (no
            # measurement at or around the size) within EXPLORE_MAX_RATIO of the other's: on the
            # simulated H100 a calibrated model extrapolated top_k's GPU time past the calibrated sizes
            # at 1.4-1.9x the 327-340 us measured, and spread_activation's CPU time at 2.5x, so the
            # first 4 calls of each new size (of 6 to 33) ran on the slower side before the 5th explored.
            # Two calls, not one: the first GPU run of a new input is its upload more than its kernel,
            # which teaches nothing (see UNSURE_COPY_BYTES); the second finds it resident.
            early = calls <= 2 and not isnan(c) and not isnan(g)
            if p.explore_period > 0 and (early or calls % p.explore_period == 0):
                # ...but a side predicted EXPLORE_MAX_RATIO times slower than the other, from
                # measurements at or around this size, is not worth a call to confirm it: each is that
                # side's full time lost, copies included (on the H100 a calibrated top_k sent 1 call in
                # 5 of every new size to a GPU 5x slower, and in the simulation a GPU exploration
                # uploaded a corpus that its 32 queries could not pay back). A side known only by
                # extrapolation is still tried (a line through a few distant sizes, or through one
                # point, can be off by any factor).
                # Nor is a GPU run on host data whose uploads alone would take that much longer than
                # the CPU's whole run: it would measure the copies more than the kernel.
                # Device data costs the CPU at least its copies, whatever its kernel takes: when the GPU
                # beats even those, a CPU run could not win and learning its time is not worth one.
                # A side is also known to lose when it took that much longer than the other's
                # prediction at a smaller size (work does not make a kernel faster: _perfmodel.floor_below):
                # an empty model's GPU, measured at ~340 us on a small top_k, was tried again at each
                # new size up to where the CPU takes ~250 us, 6 calls of the quick demo's cold run.
                if bg.n <= bc.n:
                    if not _not_worth_exploring(s.buckets[GPU], &s.fit[GPU], g, c, size, early,
                                                not on_device and self._xfer(h2d, 0.0) > EXPLORE_MAX_RATIO * c):
                        return GPU | R_EXPLORING << 1
                elif not _not_worth_exploring(s.buckets[CPU], &s.fit[CPU], c, g, size, early,
                                              on_device and g * p.speedup_threshold < copies):
                    return CPU | R_EXPLORING << 1
        elif p.reprobe_period > 0 and calls % p.reprobe_period == 0:
            if g * p.speedup_threshold < c:   # GPU wins: re-probe the CPU unless far behind
                if c < REPROBE_MAX_RATIO * g:
                    return CPU | R_EXPLORING << 1
            elif g < REPROBE_MAX_RATIO * c:
                return GPU | R_EXPLORING << 1
        # 7. the cost model: least predicted completion time, the GPU needing the configured speedup.
        # A side without an estimate loses, except that device data stays where it is until both sides
        # are known: moving it costs copies both ways, running it there teaches the GPU side.
        if on_device and (isnan(g) or isnan(c)):
            return GPU | R_COST_MODEL << 1
        if isnan(g):
            return CPU | R_COST_MODEL << 1
        if isnan(c) or g * p.speedup_threshold < c:
            return GPU | R_COST_MODEL << 1
        return CPU | R_COST_MODEL << 1

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
        cdef Params *p = &self.p
        if h.n == p.window:
            if not h.window[h.pos]:
                h.failures_in_window -= 1
        else:
            h.n += 1
        h.window[h.pos] = 1 if ok else 0
        h.pos = (h.pos + 1) % p.window
        if ok:
            h.successes += 1
            h.consecutive_failures = 0
            if h.state == S_HALF_OPEN:  # the probe worked: close with a clean slate
                h.state = S_CLOSED
                h.probe_in_flight = 0
                h.n = 0
                h.pos = 0
                h.failures_in_window = 0
            return
        h.failures += 1
        h.failures_in_window += 1
        h.consecutive_failures += 1
        if h.state == S_HALF_OPEN or (h.state == S_CLOSED and (
                h.consecutive_failures >= p.breaker_failures or
                (h.n >= p.health_min_samples and
                 (h.n - h.failures_in_window) < p.success_threshold * h.n))):
            if h.state == S_CLOSED:
                h.times_opened += 1
            h.state = S_OPEN
            h.probe_in_flight = 0
            h.opened_at_ns = now_ns()

    cdef void _sample(self, Slot *s, int backend, double size, double dur_us, double h2d,
                      double d2h) noexcept nogil:
        """One latency sample, less the modelled copies it included (those of host data on the GPU, or of
        device data on the CPU): the buckets hold compute time, and each decision adds its own copies.
        A run dominated by large copies adds none (see UNSURE_COPY_BYTES)."""
        cdef double t, x
        cdef int b
        if not (dur_us >= 0 and isfinite(dur_us)):   # NaN/inf are not completion times
            return
        x = self._xfer(h2d, d2h)
        if h2d + d2h >= UNSURE_COPY_BYTES and x > COPY_DOMINATED_SHARE * dur_us:
            return
        t = dur_us - x
        if t < MIN_KERNEL_SHARE * dur_us:
            t = MIN_KERNEL_SHARE * dur_us
        b = bucket_of(size)
        if s.buckets[backend][b].n == 0:
            s.fit[backend].dirty = 1
        s.fit[backend].pending += 1
        bucket_add(&s.buckets[backend][b], self.p.window, t, size)

    cdef void _record(self, Slot *s, int backend, double size, double dur_us, double h2d, double d2h,
                      bint ok, bint final, bint fallback) noexcept nogil:
        if backend == GPU:
            self._health(&self.hl[s.op_index], ok)
        if ok:
            self._sample(s, backend, size, dur_us, h2d, d2h)
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
                    bucket_add(&self.slots[sid].buckets[be][bucket_of(w)], self.p.window, t, w)
                    self.slots[sid].fit[be].dirty = 1
                    hs_unlock(&self.lock)

    @property
    def window(self):
        return self.p.window

    @property
    def min_samples(self):
        return self.p.min_samples
