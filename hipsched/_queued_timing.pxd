# The timing of GPU runs whose work is left queued (hipsched/_queued_timing.pyx); _dispatch.pyx cimports it.
from hipsched._sched cimport MAX_SLOTS, SchedCore
from hipsched.gpu.launch._callpath cimport GpuPath

cdef enum:
    TIME_FIRST = 64
    TIME_EVERY = 8
    PENDING = 64           # timed compiled runs whose marks are not read yet

ctypedef struct Timing:
    int slot
    double size
    double host_us
    void *start
    void *end


cdef class QueuedTimes:
    cdef SchedCore core
    cdef long long runs[MAX_SLOTS]  # per slot: device-data GPU runs so far (see time_this)
    cdef Timing pending[PENDING]
    cdef int npending
    cdef bint learning              # learn_marks is running (a driver call may let another thread in)
    cdef dict timed, early          # ticketed glue runs (see learn_tickets)

    cdef bint time_this(self, int slot) noexcept
    cdef void pend(self, GpuPath gp, int slot, double size, double host_us, void *start, void *end) noexcept
    cdef void learn_marks(self, GpuPath gp) noexcept
