# One side's work in flight (docs/design/scheduling.md, "Under load"): what a decision adds to a side's
# time, held from the decision to the record. The scheduler core (_sched.pyx) owns a Load per side and
# changes it under its lock; every function here runs with that lock held unless it says otherwise.
from libc.math cimport isfinite

cdef struct Load:
    int inflight           # calls committed to the side and not yet finished
    double work_us         # their predicted times, summed
    long long since_ns     # when the side went busy, or its last call in flight finished since: the
                           # work in flight has had the side from then on
    long long queued_until_ns   # predicted end of device work left queued (it drains by the clock)
    double area_us         # the integral of inflight over time, for a finished call's mean concurrency
    double loss_us         # what a call decided under load would lose by leaving this side for the
                           # other: a moving mean over the calls that could go either way (load_note)
    int noted              # how many it has seen, up to its window
    long long area_at_ns   # when area_us was brought up to date

# A committed call's hold on its side's Load, until its record or its run's end. Declared in C so that
# the thread-local list below and a dispatcher's stack (the compiled common path) can both hold one.
cdef extern from *:
    """
    #ifndef HS_HELD_T
    #define HS_HELD_T
    typedef struct { void *load; char *lock; int queued; double t_us; long long t0_ns; double area0; } hs_held_t;
    #endif
    """
    ctypedef struct hs_held_t:
        void *load         # the Load it counts in (NULL: nothing held)
        char *lock         # its core's lock
        int queued         # device work that may be left queued when the call returns
        double t_us        # its predicted time
        long long t0_ns    # when it was committed
        double area0       # the side's area_us then


cdef inline void load_touch(Load *L, long long now) noexcept nogil:
    # (a run's end is taken from its own timing, which another thread's later reading may precede)
    if now > L.area_at_ns:
        L.area_us += L.inflight * (now - L.area_at_ns) * 1e-3
        L.area_at_ns = now


cdef inline double load_backlog(Load *L, long long now) noexcept nogil:
    """Predicted us until the side has finished the work committed to it: the predicted times of its
    calls in flight less the time they have had the side since it went busy or since the last of its
    calls finished (in a queue the next call starts then; calls that share the cores have all been
    running since), and what remains of device work left queued. Several CPU calls share the cores, and
    a GPU runs its stream's work in order: either way the side is through with all of it after about
    the sum of their times. (Counting from the last finish, not from when the side went busy, keeps
    calls that ran over their prediction from eating the predictions of the calls after them.)"""
    cdef double r = 0
    if L.inflight > 0:
        r = L.work_us - (now - L.since_ns) * 1e-3
        if r < 0:
            r = 0
    if L.queued_until_ns > now:
        r += (L.queued_until_ns - now) * 1e-3
    return r


cdef inline void load_note(Load *L, double here_us, double there_us, int window) noexcept nogil:
    """A call decided under load that could run on either side would take `here_us` on this side and
    `there_us` on the other: how much it would lose by leaving this side joins the side's moving mean
    (over the last `window` calls, about). A caller in flight here is likely to call again, and this
    mean says what its next call, of whatever op, would lose by going elsewhere rather than wait."""
    cdef double d = there_us - here_us
    if not d > 0:
        d = 0
    if L.noted < window:
        L.noted += 1
    L.loss_us += (d - L.loss_us) / L.noted


cdef inline void load_hold(Load *L, hs_held_t *e, char *lock, double t_us, bint queued,
                           long long now) noexcept nogil:
    """A committed decision taken at `now`: the call's predicted time joins the side's work until its
    record (or the end of its run) takes it off; `e` remembers the hold."""
    if not (t_us >= 0 and isfinite(t_us)):
        t_us = 0   # a side not yet known (its first run): nothing predicted to wait for
    load_touch(L, now)
    if L.inflight == 0:
        L.since_ns = now
        L.work_us = 0
    L.inflight += 1
    L.work_us += t_us
    e.load = <void *>L
    e.lock = lock
    e.queued = queued
    e.t_us = t_us
    e.t0_ns = now
    e.area0 = L.area_us


cdef inline void load_finish(hs_held_t *e, long long now, bint queued_left) noexcept nogil:
    """A held call is over: its predicted time leaves the side's work; device work it left queued stays
    on the side's clock for what remains of its prediction."""
    cdef Load *L = <Load *>e.load
    cdef double rest
    load_touch(L, now)
    L.inflight -= 1
    L.work_us -= e.t_us
    L.since_ns = now
    if L.inflight <= 0:
        L.inflight = 0
        L.work_us = 0
    if queued_left:
        rest = e.t_us - (now - e.t0_ns) * 1e-3
        if rest > 0:
            if L.queued_until_ns < now:
                L.queued_until_ns = now
            L.queued_until_ns += <long long>(rest * 1e3)


cdef inline double load_alone_us(hs_held_t *e, double dur_us, bint ok, long long now) noexcept nogil:
    """What a held run that ended at `now` would have taken alone. Other calls that shared the side
    while it ran stretched its time: it is its time over their mean number (the integral of the side's
    calls in flight over its run, per unit of its run), what it would have taken alone when the side's
    calls share it, and on average when they queue. Alone: its time as measured."""
    cdef Load *L = <Load *>e.load
    cdef double wall, overlap
    load_touch(L, now)
    wall = (now - e.t0_ns) * 1e-3
    overlap = L.area_us - e.area0
    if ok and dur_us > 0 and wall > 0 and overlap > wall:
        return dur_us * wall / overlap
    return dur_us

