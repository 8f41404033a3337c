# The host-to-device link as measured: uploads a backend timed apart (Judgement.parts), per octave of
# bytes, against what the link probe's latency and rate say of them. The link's rate is not one number:
# the H100's 16 MB probe said 11.75 GB/s, its 350-805 MB pageable uploads ran at 8. The scheduler core
# (_sched.pyx) keeps one and changes it under its lock.
from hipsched._perfmodel cimport bucket_of

cdef enum:
    LINK_BUCKETS = 48      # uploads by octave of bytes

cdef struct Link:
    double ratio[LINK_BUCKETS]   # mean of measured time / the probe's model for those bytes
    int n[LINK_BUCKETS]
    int measured           # any octave measured


cdef inline int link_octave(double nbytes) noexcept nogil:
    cdef int b = bucket_of(nbytes) >> 2
    return b if b < LINK_BUCKETS else LINK_BUCKETS - 1


cdef inline double link_ratio(Link *k, double nbytes) noexcept nogil:
    """Measured time over the probe's for an upload of `nbytes`: that octave's, else the nearest measured
    octave's, else 1 (nothing measured: the probe's model as it is)."""
    cdef int b, d
    if k.measured:
        b = link_octave(nbytes)
        for d in range(LINK_BUCKETS):
            if b - d >= 0 and k.n[b - d]:
                return k.ratio[b - d]
            if b + d < LINK_BUCKETS and k.n[b + d]:
                return k.ratio[b + d]
    return 1.0


cdef inline void link_learn(Link *k, double nbytes, double measured_us, double probe_us) noexcept nogil:
    """One upload timed apart: the mean of an octave's first 16 ratios, then a running mean that follows
    a link that changes."""
    cdef int b = link_octave(nbytes)
    k.n[b] += 1
    k.ratio[b] += (measured_us / probe_us - k.ratio[b]) / (k.n[b] if k.n[b] < 16 else 16)
    k.measured = 1
