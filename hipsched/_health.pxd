# A GPU op's health: a window of its recent outcomes and a circuit breaker over them
# (docs/guide/backends-and-routing.md, "GPU health and the circuit breaker"). The scheduler core (_sched.pyx) keeps one per op and changes it under its lock.

cdef enum:                 # the breaker's states (_sched.BREAKER_STATES names them, in this order)
    S_CLOSED = 0           # the GPU takes the op's calls
    S_OPEN = 1             # it does not, until the cool-down has passed
    S_HALF_OPEN = 2        # one probe call is let through: its outcome closes or reopens the breaker

cdef struct Health:        # GPU health of one op: success window + circuit breaker
    unsigned char *window  # 1 success, 0 failure, ring of `window` outcomes
    int n
    int pos
    int failures_in_window
    int consecutive_failures
    int state              # S_CLOSED, S_OPEN, S_HALF_OPEN
    int probe_in_flight
    long long opened_at_ns
    long long successes
    long long failures
    long long times_opened


cdef inline bint health_update(Health *h, bint ok, int window, int breaker_failures, int min_samples,
                               double success_threshold) noexcept nogil:
    """One GPU outcome of the op. The breaker opens on `breaker_failures` failures in a row, or once
    `min_samples` outcomes are in the window with a success rate under `success_threshold`; a half-open
    breaker's probe closes it with a clean slate when it works and reopens it when it fails. True when
    it (re)opened: the caller stamps opened_at_ns then (a clock read on every GPU record, which taking
    the time as an argument cost, was 10% of a decide + record pair)."""
    if h.n == window:
        if not h.window[h.pos]:
            h.failures_in_window -= 1
    else:
        h.n += 1
    h.window[h.pos] = 1 if ok else 0
    h.pos = (h.pos + 1) % window
    if ok:
        h.successes += 1
        h.consecutive_failures = 0
        if h.state == S_HALF_OPEN:
            h.state = S_CLOSED
            h.probe_in_flight = 0
            h.n = 0
            h.pos = 0
            h.failures_in_window = 0
        return False
    h.failures += 1
    h.failures_in_window += 1
    h.consecutive_failures += 1
    if h.state == S_HALF_OPEN or (h.state == S_CLOSED and (
            h.consecutive_failures >= breaker_failures or
            (h.n >= min_samples and (h.n - h.failures_in_window) < success_threshold * h.n))):
        if h.state == S_CLOSED:
            h.times_opened += 1
        h.state = S_OPEN
        h.probe_in_flight = 0
        return True
    return False
