# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The timing of GPU runs whose work is left queued. A GPU run on device data returns as soon as its
work is queued, so the host cannot time it without waiting: its completion time is read from events
recorded on its stream before its first launch and after its last kernel, on a later call that finds
them complete, and taken into the model then. A replayed plan's marks come from the call engine
(GpuPath.time_mark) and wait here in C; a glue run's come back from its backend as tickets
(GpuBackendBase.run_timed / gpu_times). Either way a run's completion time is the larger of its host
time (launching, which its caller waited for) and the device time between its marks: that span already
holds the launch gaps an idle device waited through, and on a device busy with earlier work only this
call's own share.

Not every run is timed (two records, a query and a reading cost a few microseconds): every one of a
slot's first TIME_FIRST, then 1 in TIME_EVERY, which still refills a model window every few hundred
calls; runs of the compiled path and of the glue count alike."""
from hipsched._sched cimport GPU, hs_lock, hs_unlock

_MAX_TICKETS = 1024   # entries of timed / early: far more than the device keeps readings for


def _bounded_put(d, key, value):
    """d[key] = value, dropping the oldest entry past _MAX_TICKETS (a sample lost, never a wrong one)."""
    if len(d) >= _MAX_TICKETS:
        try:
            del d[next(iter(d))]
        except (StopIteration, KeyError, RuntimeError):   # emptied or changed by another thread
            pass
    d[key] = value


cdef class QueuedTimes:
    """Per executor: the queued GPU runs being timed, and how many each slot has had."""

    def __init__(self, SchedCore core):
        self.core = core
        self.npending = 0
        self.timed = {}    # ticket -> (slot, size, host us) of glue runs not yet learned from
        # ticket -> device us of readings that came before their run stored its entry (another thread
        # polled in between); bounded, like timed, so a reading or an entry that never meets its other
        # half cannot grow them for the life of the process
        self.early = {}

    cdef bint time_this(self, int slot) noexcept:
        """Whether this device-data GPU run of `slot` is timed (see TIME_FIRST); counts it. A replayed
        run is timed only while there is room for its marks."""
        cdef long long n = self.runs[slot] + 1
        self.runs[slot] = n
        return n <= TIME_FIRST or n % TIME_EVERY == 0

    cdef void pend(self, GpuPath gp, int slot, double size, double host_us, void *start, void *end) noexcept:
        """A replayed run's two marks, read by a later learn_marks."""
        cdef Timing *t
        # the caller saw room before its replay, but other threads' calls may have pended since (the
        # replay can run Python: a library's from_dlpack, a finalizer, a driver reached through Python)
        if end == NULL or self.npending >= PENDING:
            gp.release_event(start)
            gp.release_event(end)
            return
        t = &self.pending[self.npending]
        t.slot, t.size, t.host_us, t.start, t.end = slot, size, host_us, start, end
        self.npending += 1

    cdef void learn_marks(self, GpuPath gp) noexcept:
        """Learn from the replayed runs whose work has run by now (never waits)."""
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

    def ticketed(self, ticket, int slot, double size, double host_us):
        """A glue run timed by its backend (run_timed's ticket): learned from at once when its reading
        came first, else kept for learn_tickets."""
        device_us = self.early.pop(ticket, None)
        if device_us is not None:   # read by another thread's call before this line
            self.core.learn(slot, GPU, size, max(host_us, device_us))
        else:
            _bounded_put(self.timed, ticket, (slot, size, host_us))

    def learn_tickets(self, gpu):
        """Learn from the ticketed glue runs whose work has run by now (`gpu.gpu_times()`; never waits).
        A reading that arrives before its run has stored its entry waits for it in `early`."""
        if not self.timed:
            return
        for ticket, device_us in gpu.gpu_times():
            entry = self.timed.pop(ticket, None)
            if entry is None:
                if device_us is not None:
                    _bounded_put(self.early, ticket, device_us)
            elif device_us is not None:
                slot, size, host_us = entry
                self.core.learn(slot, GPU, size, max(host_us, device_us))

    def learn_all(self, gpu, GpuPath gp):
        """Learn from every timed run whose work has run by now (the executor's close)."""
        self.learn_tickets(gpu)
        if self.npending and gp is not None:
            self.learn_marks(gp)
