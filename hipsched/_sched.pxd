# The scheduler core's C state: declarations (the logic is in _sched.pyx; _dispatch.pyx cimports them).
from hipsched._clock cimport now_ns

from hipsched._health cimport Health
from hipsched._link cimport Link
from hipsched._load cimport Load, hs_held_t
from hipsched._perfmodel cimport Bucket, Fit, NBUCKETS

# What the executor knows about a call, as flags of the decision.
cpdef enum Flag:
    F_GPU_PRESENT = 1        # a working GPU backend exists
    F_GPU_SUPPORTS = 2       # it has this op and dtype, and the size is within its maximum
    F_FITS = 4               # the call fits in free device memory
    F_WANT_CPU = 8           # backend="cpu" on this call
    F_WANT_GPU = 16          # backend="gpu" on this call
    F_CALL_UNSUPPORTED = 32  # the GPU has the op, but refuses this call's shapes or parameters
    F_ON_DEVICE = 64         # the inputs live on the GPU: the copies (h2d, d2h) are the CPU's to pay

# Why a backend was chosen: indices into _sched.REASONS (the strings telemetry writes).
cpdef enum Reason:
    R_GPU_AVAILABLE = 0
    R_GPU_UNAVAILABLE = 1
    R_CPU_FALLBACK = 2
    R_COST_MODEL = 3
    R_MEMORY_CONSTRAINT = 4
    R_USER_PREFERENCE = 5
    R_BELOW_MIN_BATCH = 6
    R_GPU_UNHEALTHY = 7
    R_EXPLORING = 8
    R_GPU_UNSUPPORTED = 9
    R_SPLIT = 10             # cut across the CPU and the GPU (hipsched/splitting.py): backend "split"

cdef enum:                   # backends, as the model's array index (scheduling.BACKENDS names them;
                             # Python reads them as _sched.BACKEND_CPU, BACKEND_GPU)
    CPU = 0
    GPU = 1

# Indices into config.STRATEGIES (checked at import of _sched).
cpdef enum Strategy:
    ST_AUTOMATIC = 0
    ST_GPU_PREFERRED = 1
    ST_CPU_PREFERRED = 2
    ST_BACKEND_ONLY = 3

cdef enum:
    MAX_SLOTS = 512        # (op, dtype) pairs
    MAX_OPS = 128          # ops with a health record

cdef struct Slot:          # one (op, dtype): a model per backend (0 cpu, 1 gpu)
    int op_index
    Bucket buckets[2][NBUCKETS]
    Fit fit[2]
    double prior_a[2]      # a prior per side, t = a + b * work (NaN a: none), until a side's first sample
    double prior_b[2]
    double explore_us      # what explorations were predicted to cost beyond the better side, summed
    double run_us          # the better side's predicted time of every automatic decision, summed

cdef struct Counters:      # exact per-executor totals (only ever changed under the lock)
    long long total
    long long cpu
    long long gpu
    long long fallback
    long long split         # calls cut across the CPU and the GPU (hipsched/splitting.py), not in cpu/gpu
    double cpu_time_us
    double gpu_time_us

cdef struct Params:
    int window
    double min_batch       # config allows any integer >= 0 (2**40: never the GPU)
    int min_samples
    int explore_period     # 1 in explore_period calls of an under-sampled bucket explores
    long long reprobe_period  # 1 in reprobe_period calls re-measures the losing side (0: never)
    int strategy           # 0 automatic, 1 gpu_preferred, 2 cpu_preferred, 3 backend_only
    int backend_only       # 0 cpu, 1 gpu (strategy backend_only)
    int force_cpu
    int breaker_failures
    int health_min_samples
    double success_threshold
    double speedup_threshold
    long long cooldown_ns
    double h2d_latency_us
    double h2d_us_per_byte
    double d2h_latency_us
    double d2h_us_per_byte


cdef extern from *:
    """
    #include <sched.h>
    /* A test-and-test-and-set spin lock: the critical sections are a few hundred instructions of
       plain C that never block, so spinning is cheaper than a semaphore round trip (about 4x on an
       uncontended acquire/release). A waiter yields its core so a preempted holder can finish. */
    static inline void hs_lock(char *l) {
        while (__atomic_test_and_set(l, __ATOMIC_ACQUIRE)) {
            while (__atomic_load_n(l, __ATOMIC_RELAXED)) sched_yield();
        }
    }
    static inline void hs_unlock(char *l) { __atomic_clear(l, __ATOMIC_RELEASE); }
    """
    void hs_lock(char *l) nogil
    void hs_unlock(char *l) nogil


cdef class SchedCore:
    cdef Params p
    cdef Slot *slots[MAX_SLOTS]
    cdef int nslots
    cdef Health hl[MAX_OPS]
    cdef int nops
    cdef Counters c
    cdef Link link
    cdef Load load[2]
    cdef long long clock_ns   # the time the core reads when nonzero (a machine in virtual time), else now_ns()
    cdef char lock
    cdef dict slot_ids
    cdef dict op_ids
    cdef dict op_priors
    cdef object create_lock
    cdef int _op_index(self, str op) except -1
    cdef double _xfer(self, double h2d, double d2h) noexcept nogil
    cdef int _decide(self, Slot *s, double size, double h2d, double d2h, int flags,
                     double *pc, double *pg, bint commit) noexcept nogil
    cdef void _health(self, Health *h, bint ok) noexcept nogil
    cdef void _sample(self, Slot *s, int backend, double size, double dur_us, double h2d,
                      double d2h) noexcept nogil
    cdef void _record(self, Slot *s, int backend, double size, double dur_us, double h2d, double d2h,
                      bint ok, bint final, bint fallback) noexcept nogil
    cdef void _record_held(self, hs_held_t *e, Slot *s, int backend, double size, double dur_us, double h2d,
                           double d2h, bint ok, bint final, bint fallback) noexcept nogil
    cdef void _add(self, Slot *s, int backend, double size, double t) noexcept nogil
    cdef void _sample_parts(self, Slot *s, double size, double kernel_us, double up_bytes,
                            double up_us) noexcept nogil
    cdef double _h2d_us(self, double h2d) noexcept nogil
    cdef inline long long _now(self) noexcept nogil:
        return self.clock_ns if self.clock_ns else now_ns()
    cdef double _backlog(self, int side, long long now) noexcept nogil
    cdef void _hold(self, int side, double t_us, bint queued, long long now, hs_held_t *into) noexcept nogil
    cdef void _unhold(self, hs_held_t *e) noexcept nogil
    cdef void _release(self, int mark) noexcept
    cdef int _held(self) noexcept nogil
    cdef inline bint _shared(self) noexcept nogil:
        # other calls in flight beside the caller's own, or device work queued: the sides are shared
        return self.load[0].inflight + self.load[1].inflight > 1 or self.load[0].queued_until_ns > self._now() \
            or self.load[1].queued_until_ns > self._now()
