# The performance model of one (op, backend, dtype): log2 size buckets holding a window of latencies
# (median read in O(1), updated in O(window)); an unseen size between measured ones joins its neighbours
# in log-log, and a weighted least-squares line serves sizes beyond them.
# Inline C only (no runtime module): hipsched._sched cimports it. See docs/design/scheduling.md.
from libc.stdlib cimport calloc, free
from libc.stdint cimport uint64_t
from libc.string cimport memcpy, memmove, memset
from libc.math cimport NAN, exp, fabs, log, sqrt

cdef enum:
    # quarter-octave size buckets (4 per power of two): sizes up to 2**48 work units. Whole octaves
    # put sizes 2x apart in one median, and an op's cost can step inside an octave (on the H100 host,
    # top_k's CPU time went from 80 us to 8 ms between 0.6M and 0.9M work, one octave; so did the
    # simulated machine's between 6.3M and 8.3M): the bucket's median then stood for the cheap size.
    SUB_BITS = 2
    NBUCKETS = 48 << SUB_BITS
    # The fit only serves unseen sizes and the slope inside a bucket, so it may lag a few samples
    # behind: refitting on every record would cost more than the whole decision.
    REFIT_EVERY = 32

# OUTLIER_RATIO: a sample this many times its bucket's median is not the op's time but an accident (a
# first launch that loaded a module, a page-fault storm): the bucket's mean leaves it out. A slow mode of
# the CPU (8x on the H100 host's top_k, a team waking up) lies within it and counts, by its share.
# PRIOR_REL_SD, PRIOR_UNSEEN_ERR: what a bucket's relative spread is taken to be before it holds three
# samples, and what the model's error at a size never measured is taken to be before one has been
# checked: a machine's run-to-run log-sd was 0.2-0.4 on the H100 (shared/h100 demo logs), so 0.5
# assumes no better than that.
# POOL_PRIOR_N: how many samples' worth the op's pooled spread counts for against a bucket's own when
# judging how noisy the bucket's mean is: the three samples below which a bucket's own spread is not
# read at all (PRIOR_REL_SD), so that its own spread outweighs the pool's from there on.
cdef extern from *:
    """
    #define HS_OUTLIER_RATIO 16.0
    #define HS_PRIOR_REL_SD 0.5
    #define HS_PRIOR_UNSEEN_ERR 0.5
    #define HS_POOL_PRIOR_N 3.0
    """
    const double OUTLIER_RATIO "HS_OUTLIER_RATIO"
    const double PRIOR_REL_SD "HS_PRIOR_REL_SD"
    const double PRIOR_UNSEEN_ERR "HS_PRIOR_UNSEEN_ERR"
    const double POOL_PRIOR_N "HS_POOL_PRIOR_N"

cdef struct Bucket:
    double *ring           # last `window` latencies (us), arrival order (allocated at the first sample)
    double *work_ring      # the work measure of each of those samples
    double *sorted         # the same latencies, ascending
    int n                  # samples held (<= window)
    int pos                # next slot to overwrite in the rings
    double work_sum        # sum of work_ring[:n], for the bucket's mean work
    long long total        # samples ever recorded
    long long calls        # decisions taken for sizes in this bucket (re-probe pacing)
    double sum             # sum and sum of squares of ring[:n]: the mean and spread in O(1)
    double sumsq
    double own             # bucket_stats of its own samples, and their spread over that mean
    double own_sd
    double base            # bucket_base at the last sample: what the pool measures times against
    double mean            # `own` joined with its op's pool (bucket_settle): what a decision reads
    double rel_sd          # the spread of one run over that mean (run-to-run noise)
    double se              # the standard error of the mean, relative: how far the mean itself may be off

cdef struct Fit:           # t = a + b * work, weighted least squares over bucket means
    double a
    double b
    int valid
    int dirty              # refit before the next prediction (a bucket gained its first sample)
    int pending            # samples since the last fit; refit once REFIT_EVERY have arrived
    int npts               # buckets the fit went through
    double lo              # the smallest and largest of their mean work: between them the fit
    double hi              # interpolates measured sizes, outside it extrapolates
    double lo_t            # the means of the buckets at lo and hi: beyond them the optimistic bound of an
    double hi_t            # extrapolation is the edge's time held flat (larger) or shrinking with work
    double unseen_err      # running mean |log(measured / predicted)| at a bucket's first sample: how far
                           # this op's cost is from what the model says at sizes it has not measured
                           # (small on a smooth machine, large where sizes are uneven); 0 = not yet known
    int unseen_n           # first samples it was checked against
    # The pool: how this op's times on this side lie above their sizes' lower quartiles (bucket_base),
    # from every bucket of three samples or more (pool_update, at each refit). A slow mode (an OpenMP team waking up, a
    # frequency drop) belongs to the op and processor, not to one size; a size seen three times has
    # drawn a 15% mode with probability 0.39, so its own mean is mostly the fast mode alone (or, after
    # two slow draws, several times the truth). 0 = not enough buckets to pool.
    double pool_r          # mean over all their samples of time / its bucket's base
    double pool_var        # the samples' variance of that ratio within their buckets
    double pool_tau2       # how much the buckets' own ratios differ beyond what pool_var explains
    double pool_rel_sd     # sqrt(pool_var) / pool_r: a bucket's spread where the pool alone decides
    double pool_var_n      # pool_var over the samples the pool was measured from: its ratio's error
    double pool_se2        # that relative to pool_r, squared


cdef inline int bucket_of(double size) noexcept nogil:
    if not (size >= 2.0):   # also NaN and negatives
        return 0
    if size >= 281474976710656.0:   # 2**48, and inf: clamp before the cast, not after
        return NBUCKETS - 1
    # floor(log2(size)) of a normal double is its unbiased exponent, and the mantissa's top SUB_BITS
    # bits say where in the octave it lies (linearly, not by log: quarters of 1.25x, 1.2x, 1.17x and
    # 1.14x): read from the bits, it costs a shift where log2() costs ~20 ns (and a decision needs it
    # five times)
    cdef uint64_t bits
    memcpy(&bits, &size, sizeof(double))
    return <int>((bits >> (52 - SUB_BITS)) & ((0x7ff << SUB_BITS) | ((1 << SUB_BITS) - 1))) - (1023 << SUB_BITS)


cdef inline int lower_bound(const double *s, int n, double v) noexcept nogil:
    cdef int lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if s[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline double bucket_median(const Bucket *bk) noexcept nogil:
    # the lower median: with two samples, one of them a spike, the normal one wins
    return bk.sorted[(bk.n - 1) >> 1]


cdef inline double bucket_mean(const Bucket *bk, double *rel_sd) noexcept nogil:
    """bucket_stats as of the bucket's last sample (computed there: a decision reads two doubles)."""
    if rel_sd != NULL:
        rel_sd[0] = bk.rel_sd
    return bk.mean


cdef inline double bucket_stats(const Bucket *bk, double *rel_sd) noexcept nogil:
    """The bucket's expected time: the mean of its samples, those over OUTLIER_RATIO x the median left
    out, and the bucket's first sample ever when above the median (a bimodal side is its mean, not the
    mode the median or the last sample fall in); with one or two samples the lower median (one of two
    may be a first launch). `rel_sd` (may be NULL): the
    samples' standard deviation over that mean, PRIOR_REL_SD with fewer than three."""
    cdef int n = bk.n, k
    cdef double s = bk.sum, ss = bk.sumsq, cap, m, v, x
    if n < 3:
        if rel_sd != NULL:
            rel_sd[0] = PRIOR_REL_SD
        return bk.sorted[0]
    cap = OUTLIER_RATIO * bk.sorted[(n - 1) >> 1]
    k = n - 1
    while k > 0 and bk.sorted[k] > cap:
        x = bk.sorted[k]
        s -= x
        ss -= x * x
        k -= 1
    n = k + 1
    # the bucket's first run ever, while the window still holds it, when slower than the median: a
    # first run holds first-use costs (a module loaded, memory allocated, an input's first touch)
    x = bk.ring[0]
    if bk.total == bk.n and x > bk.sorted[(bk.n - 1) >> 1] and x <= cap and n > 2:
        s -= x
        ss -= x * x
        n -= 1
    m = s / n
    if rel_sd != NULL:
        v = ss / n - m * m
        rel_sd[0] = sqrt(v) / m if v > 0 and m > 0 else 0.0
    return m


cdef inline bint bucket_alloc(Bucket *bk, int window) noexcept nogil:
    # once per bucket, at its first sample: most of the 48 buckets of most slots never see one
    bk.ring = <double *>calloc(window, sizeof(double))
    bk.work_ring = <double *>calloc(window, sizeof(double))
    bk.sorted = <double *>calloc(window, sizeof(double))
    if bk.ring == NULL or bk.work_ring == NULL or bk.sorted == NULL:
        free(bk.ring); free(bk.work_ring); free(bk.sorted)
        bk.ring = bk.work_ring = bk.sorted = NULL
        return False
    return True


cdef inline double bucket_base(const Bucket *bk) noexcept nogil:
    # the lower quartile: a slow mode of a share under a quarter leaves it in the fast one even in three
    # samples (the median of three is slow with two slow draws, 10% of the time at a 20% share); with
    # one or two samples the smaller, as bucket_stats reads them
    return bk.sorted[(bk.n - 1) >> 2]


cdef inline void bucket_settle(Bucket *bk, const Fit *f) noexcept nogil:
    """bk.mean, bk.rel_sd and bk.se: the bucket's own mean (`own`) shrunk toward its base times the
    pool's ratio, by how little its own samples say (empirical Bayes, the weight tau2 / (tau2 + var / n)):
    with sizes that share one spread the pool decides, with sizes that differ beyond their noise each its
    own mean. Without a pool, `own` as it is. The standard error is the mean's, not a run's: a pooled
    mean rests on the pool's samples as well as the bucket's (a bimodal side's runs spread by 100%, its
    pooled mean over a hundred runs by 10%, and exploring it as if by 100% paid a slow side again and
    again)."""
    cdef double r_own, v_own, w, r, ir, v, se2
    bk.mean = bk.own
    bk.rel_sd = bk.own_sd
    if bk.n == 0:
        return
    # a mean of n runs: their spread over sqrt(n)
    se2 = bk.own_sd * bk.own_sd / bk.n
    if f.pool_r > 0 and bk.base > 0:
        if bk.n < 3:
            # `own` is the smallest sample, the base (one of two may be a first launch): the pool is all
            # that is known of how far above it the expected time lies
            bk.mean = bk.own * f.pool_r
            bk.rel_sd = f.pool_rel_sd if f.pool_rel_sd > PRIOR_REL_SD else PRIOR_REL_SD
            se2 = bk.rel_sd * bk.rel_sd / bk.n
        elif f.pool_tau2 == 0:
            # the sizes share one spread (the common case): the pool decides; the mean is as uncertain
            # as the bucket's base (its own runs' spread) and the pool's ratio
            bk.mean = bk.base * f.pool_r
            bk.rel_sd = f.pool_rel_sd
            se2 += f.pool_se2
        else:
            r_own = bk.own / bk.base
            v_own = (bk.own_sd * r_own) * (bk.own_sd * r_own)
            # the noise of its own mean: its own spread, which a few samples that missed a mode
            # understate, held against the pool's as a prior worth POOL_PRIOR_N samples;
            # w = tau2 / (tau2 + that / n), with one division
            v = bk.n * v_own + POOL_PRIOR_N * f.pool_var
            w = f.pool_tau2 * bk.n * (bk.n + POOL_PRIOR_N)
            w = w / (w + v)
            r = w * r_own + (1.0 - w) * f.pool_r
            if r > 0:
                ir = 1.0 / r
                # the posterior variance of the ratio (w times its own mean's: tau2 (1 - w)), the pool's
                # share of the pool's error, and the base's noise where the pool decides
                se2 = (f.pool_tau2 * (1.0 - w) + (1.0 - w) * (1.0 - w) * f.pool_var_n) * ir * ir \
                    + (1.0 - w) * se2
                bk.mean = bk.base * r
                bk.rel_sd = sqrt(w * v_own + (1.0 - w) * f.pool_var) * ir
    # at least 2% over sqrt(n): three runs that agree exactly are not a certainty
    bk.se = sqrt(se2) if se2 * bk.n > 0.0004 else 0.02 / sqrt(<double>bk.n)


cdef struct PoolSums:
    int nb
    double N, sr, srr, sv, snn


cdef inline void pool_sum(PoolSums *p, const Bucket *bk) noexcept nogil:
    cdef double r_own, v_own
    if bk.n < 3 or not (bk.base > 0 and bk.own > 0):
        return
    r_own = bk.own / bk.base
    v_own = (bk.own_sd * r_own) * (bk.own_sd * r_own)
    p.N += bk.n
    p.sr += bk.n * r_own
    p.srr += bk.n * r_own * r_own
    p.sv += bk.n * v_own
    p.snn += <double>bk.n * bk.n
    p.nb += 1


cdef inline bint pool_update(Fit *f, const PoolSums *p) noexcept nogil:
    """The pool (Fit.pool_r, pool_var, pool_tau2) from the sums over every bucket of three samples or
    more; True when it moved enough (a percent of a mean) that the buckets must be settled again. tau2
    by the one-way random-effects estimator for unequal counts: the buckets' spread around the pool,
    each by its samples, less what the samples' own noise alone would give (so that a bucket of three,
    whose ratio a slow draw can triple, counts for three samples, not for one size in B). Fewer than
    three such buckets: no pool."""
    cdef double r0 = f.pool_r, v0 = f.pool_var, t0 = f.pool_tau2, denom
    if p.nb < 3:
        f.pool_r = 0
        return r0 > 0
    f.pool_r = p.sr / p.N
    f.pool_var = p.sv / p.N
    denom = p.N - p.snn / p.N
    f.pool_tau2 = (p.srr - p.N * f.pool_r * f.pool_r - (p.nb - 1) * f.pool_var) / denom if denom > 0 else 0.0
    if not (f.pool_tau2 > 0):
        f.pool_tau2 = 0
    f.pool_rel_sd = sqrt(f.pool_var) / f.pool_r if f.pool_r > 0 else 0.0
    f.pool_var_n = f.pool_var / p.N
    f.pool_se2 = f.pool_var_n / (f.pool_r * f.pool_r) if f.pool_r > 0 else 0.0
    # once the op's sizes are measured the pool hardly moves: re-reading every bucket against it waits
    # for a change that moves a mean by a percent (each record settles its own bucket as it goes)
    return not (r0 > 0 and fabs(f.pool_r - r0) <= 0.01 * r0 and fabs(f.pool_var - v0) <= 0.02 * v0 + 1e-4
                and fabs(f.pool_tau2 - t0) <= 0.02 * t0 + 1e-4)


cdef inline void bucket_add(Bucket *bk, const Fit *f, int window, double t, double work) noexcept nogil:
    cdef int i, j
    if bk.ring == NULL and not bucket_alloc(bk, window):
        return  # out of memory: the sample is dropped, the model keeps what it has
    if bk.n == window:
        # the new sample replaces the oldest in the sorted view: shift only what lies between them
        i = lower_bound(bk.sorted, bk.n, bk.ring[bk.pos])
        j = lower_bound(bk.sorted, bk.n, t)
        if j > i:
            j -= 1
            memmove(&bk.sorted[i], &bk.sorted[i + 1], (j - i) * sizeof(double))
        elif j < i:
            memmove(&bk.sorted[j + 1], &bk.sorted[j], (i - j) * sizeof(double))
        bk.sorted[j] = t
        bk.work_sum -= bk.work_ring[bk.pos]
        bk.sum -= bk.ring[bk.pos]
        bk.sumsq -= bk.ring[bk.pos] * bk.ring[bk.pos]
    else:
        i = lower_bound(bk.sorted, bk.n, t)
        memmove(&bk.sorted[i + 1], &bk.sorted[i], (bk.n - i) * sizeof(double))
        bk.sorted[i] = t
        bk.n += 1
    bk.ring[bk.pos] = t
    bk.work_ring[bk.pos] = work
    bk.work_sum += work
    bk.sum += t
    bk.sumsq += t * t
    bk.pos += 1
    if bk.pos == window:
        bk.pos = 0
    bk.total += 1
    bk.own = bucket_stats(bk, &bk.own_sd)
    bk.base = bucket_base(bk)
    bucket_settle(bk, f)


cdef inline void refit(Bucket *bks, Fit *f) noexcept nogil:
    """Weighted least squares t = a + b*w over the buckets' (mean work, mean), weights 1/t^2 so
    that every bucket counts by its relative error (sizes span many orders of magnitude); and, in the
    same pass, the op's pool (pool_update)."""
    cdef double sw = 0, swx = 0, swy = 0, swxx = 0, swxy = 0, x, y, wt, det, a, b
    cdef int i, npts = 0
    cdef Bucket *bk
    cdef PoolSums pool
    memset(&pool, 0, sizeof(pool))
    f.dirty = 0
    f.pending = 0
    f.lo = 0
    f.hi = 0
    for i in range(NBUCKETS):
        bk = &bks[i]
        if bk.n == 0:
            continue
        pool_sum(&pool, bk)
        x = bk.work_sum / bk.n
        y = bucket_mean(bk, NULL)
        if y <= 0:
            y = 1e-3
        if npts == 0 or x < f.lo:
            f.lo = x
            f.lo_t = y
        if npts == 0 or x > f.hi:
            f.hi = x
            f.hi_t = y
        wt = 1.0 / (y * y)
        sw += wt; swx += wt * x; swy += wt * y; swxx += wt * x * x; swxy += wt * x * y
        npts += 1
    f.npts = npts
    if pool_update(f, &pool):
        # the means this fit read were settled against the pool before it moved: settle them again,
        # and the next prediction refits from them (the pool then stands still: its sums do not
        # depend on it)
        for i in range(NBUCKETS):
            if bks[i].n > 0:
                bucket_settle(&bks[i], f)
        f.dirty = 1
    if npts == 0:
        f.valid = 0
        return
    if npts == 1:
        # one point says nothing about the shape: split it between fixed and per-unit cost
        x = swx / sw
        y = swy / sw
        f.a = 0.5 * y
        f.b = 0.5 * y / x if x > 0 else 0.0
        f.valid = 1
        return
    det = sw * swxx - swx * swx
    if det <= 0:
        f.a = swy / sw; f.b = 0.0
    else:
        b = (sw * swxy - swx * swy) / det
        a = (swy - b * swx) / sw
        if b < 0:           # cost cannot fall with work: a constant
            a = swy / sw; b = 0.0
        elif a < 0:         # nor be negative for tiny work: a line through the origin
            a = 0.0; b = swxy / swxx
        f.a = a; f.b = b
    f.valid = 1


cdef inline double fit_at(Fit *f, double w) noexcept nogil:
    return f.a + f.b * w


cdef inline double between_measured(Bucket *bks, int b, double size) noexcept nogil:
    """The time at `size`, in empty bucket b, from the nearest measured buckets on either side: their
    medians at their mean work joined by a straight line in log(work)-log(time), the shape an op's
    cost has between sizes (a power law per stretch: a cache level, a launch's fixed cost); NaN when
    b is not between two measured buckets. The fit is one line through every bucket, weighted to the
    small sizes; it missed the steps between them (the simulated H100's top_k on the CPU: 288 us
    predicted at 8.3M work between measured 86 us at 2.1M and 452 us at 8.4M, 431 us measured, so the
    GPU, faster there, lost the call; cosine on the CPU: 369 us predicted at 16.6M, 1253 us measured)."""
    cdef int lo = b - 1, hi = b + 1
    cdef double x1, y1, x2, y2
    while lo >= 0 and bks[lo].n == 0:
        lo -= 1
    while hi < NBUCKETS and bks[hi].n == 0:
        hi += 1
    if lo < 0 or hi >= NBUCKETS:
        return NAN
    x1 = bks[lo].work_sum / bks[lo].n
    x2 = bks[hi].work_sum / bks[hi].n
    y1 = bucket_mean(&bks[lo], NULL)
    y2 = bucket_mean(&bks[hi], NULL)
    if not (x1 > 0 and x2 > x1 and y1 > 0 and y2 > 0 and size > 0):
        return NAN
    return y1 * exp(log(y2 / y1) * log(size / x1) / log(x2 / x1))


cdef inline double predict_us(Bucket *bks, Fit *f, double size, double *u=NULL) noexcept nogil:
    """The expected time at `size`: the bucket's mean (scaled by the fit's slope within the bucket), else
    the measured buckets on either side (between_measured), else the fit, else NaN. `u` (may be NULL):
    the prediction's relative uncertainty, the standard error of a bucket's mean, or at a size not
    measured what the model's error at such sizes has been (Fit.unseen_err; twice that beyond the
    measured range, 1 from a single point); inf when nothing is known."""
    cdef int b = bucket_of(size)
    cdef Bucket *bk = &bks[b]
    cdef double med, ratio, at_mean, t, sd, err
    if f.dirty or f.pending >= REFIT_EVERY:
        refit(bks, f)
    err = f.unseen_err if f.unseen_n > 0 else PRIOR_UNSEEN_ERR
    if bk.n > 0:
        med = bucket_mean(bk, &sd)
        if u != NULL:
            u[0] = bk.se
            # a size measured once or twice, far slower than the sizes measured around it, may hold one
            # accident (on the H200 host a first add of 2 MB took 4609 us between 257 us and 334 us at
            # half and twice the size: output memory's first touch) and nothing else: its time is as
            # uncertain as that disagreement, so the optimism that explores tries it again
            if bk.n < 3 and f.npts >= 3 and f.lo < size < f.hi:
                t = between_measured(bks, b, size)
                if t > 0 and med > t * (1.0 + 2.0 * err) and med / t - 1.0 > u[0]:
                    u[0] = med / t - 1.0
        if f.valid:
            at_mean = fit_at(f, bk.work_sum / bk.n)
            if at_mean > 0:
                ratio = fit_at(f, size) / at_mean
                if ratio < 0.5:
                    ratio = 0.5
                elif ratio > 2.0:
                    ratio = 2.0
                med *= ratio
        return med
    # only inside the measured range, which the fit keeps: a side never measured (the GPU of a machine
    # without one, on every decision of the compiled path) or a size beyond it costs no scan
    if f.npts >= 2 and f.lo < size < f.hi:
        t = between_measured(bks, b, size)
        if t == t:
            if u != NULL:
                u[0] = err
            return t
    if f.valid:
        t = fit_at(f, size)
        if u != NULL:
            # beyond the measured sizes a line is a guess: its uncertainty reaches down at least to the
            # edge's time held flat (a larger size) or shrunk in proportion to the work (a smaller one),
            # so that exploring there stays possible wherever that bound could still win
            if f.npts >= 2 and f.lo <= size <= f.hi:
                u[0] = err
            elif size > f.hi:
                u[0] = t / f.hi_t - 1.0 if t > f.hi_t * (1.0 + 2.0 * err) else 2.0 * err
            else:
                u[0] = f.lo / size - 1.0 if size > 0 and f.lo > size * (1.0 + 2.0 * err) else 2.0 * err
        return t
    if u != NULL:
        u[0] = 1e300
    return NAN


cdef inline void check_unseen(Bucket *bks, Fit *f, double size, double t) noexcept nogil:
    """At a bucket's first sample `t`: how far the model's prediction there was (Fit.unseen_err)."""
    cdef double p = predict_us(bks, f, size)
    cdef double e
    if not (p > 0 and t > 0 and f.npts >= 2):
        return
    e = fabs(log(t / p))
    if e > 3.0:
        e = 3.0
    f.unseen_n += 1
    f.unseen_err += (e - f.unseen_err) / (f.unseen_n if f.unseen_n < 16 else 16)
