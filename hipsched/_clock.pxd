# The monotonic clock the compiled layers read (inline C only, no runtime module): the scheduler's
# backlog and hold times, the dispatcher's run timing and the telemetry recorder's anchor read the
# same clock, so a time one of them took means the same to the others. A leaf: it cimports nothing
# of hipsched.
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline long long now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1000000000LL + ts.tv_nsec
