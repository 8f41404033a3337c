// spread_activation over a CSR graph (A[i, j] = weight of the edge i -> j), one step as three launches
// on one stream: memset(acc, 0); push; finish. The CPU rule, per step, from the previous activations a:
//     a_new[j] = a[j] + decay * sum_i w_ij a[i];  then clamp to [0, 1];  then 0 where a_new < threshold.
// Push walks the rows (sources) in CSR order and atomically adds w_ij * a[i] into acc[j]. A row whose
// activation is exactly 0 adds nothing but where a weight is NaN or infinite (0 * w is NaN there, as
// SciPy's A.T @ a and the CPU engine give). The first step reads such rows' weights for those, and
// leaves a mark in acc[n] (one float past the accumulator, which the per-step memset leaves alone)
// when it found one or a product that was not finite: an inf weight out of an active row gives its
// target inf, clamped to 1, and if that row falls to 0 later, 0 * inf makes the target NaN then.
// Later steps skip inactive rows whole unless the mark is there, so a graph of finite weights still
// touches only the seeds' neighbourhood in its early steps, as on the CPU.
// Float atomics make the summation order vary between runs: results agree with the CPU engine to
// rounding, not bit for bit. indptr and indices are both int32 or both int64 (two entry points), as
// the op hands them to either engine (SciPy's int32 arrays go through without a copy).

// HSG_GROUP (lanes per row): hipsched/gpu/compilation/kernel_constants.py.

template <class I>
HS_DEV void hsg_push(const I* __restrict__ indptr, const I* __restrict__ indices,
                     const float* __restrict__ weights, const float* __restrict__ a, float* __restrict__ acc,
                     hs_i64 n, int first) {
    const hs_i64 total = n * HSG_GROUP;
    // the mark is written only in the first step and read only after it: no launch does both
    const bool read_idle = first || acc[n] != 0.0f;
    bool seen = false;
    for (hs_i64 t = hs_gid(); t < total; t += hs_gstride()) {
        const hs_i64 row = t / HSG_GROUP;
        const float ai = a[row];
        const bool idle = ai == 0.0f;
        if (idle && !read_idle) continue;
        const hs_i64 end = (hs_i64)indptr[row + 1];
        for (hs_i64 e = (hs_i64)indptr[row] + (t % HSG_GROUP); e < end; e += HSG_GROUP) {
            const float w = weights[e];
            if (idle && w - w == 0.0f) continue;   // finite: 0 * w adds nothing
            const float p = w * ai;
            seen |= !(p - p == 0.0f);
            atomicAdd(acc + (hs_i64)indices[e], p);
        }
    }
    if (first && seen) atomicAdd(acc + n, 1.0f);   // at most one atomic per thread
}

HS_KERNEL void hs_spread_push_i32(const hs_i32* __restrict__ indptr, const hs_i32* __restrict__ indices,
                                  const float* __restrict__ weights, const float* __restrict__ a,
                                  float* __restrict__ acc, hs_i64 n, int first) {
    hsg_push<hs_i32>(indptr, indices, weights, a, acc, n, first);
}

HS_KERNEL void hs_spread_push_i64(const hs_i64* __restrict__ indptr, const hs_i64* __restrict__ indices,
                                  const float* __restrict__ weights, const float* __restrict__ a,
                                  float* __restrict__ acc, hs_i64 n, int first) {
    hsg_push<hs_i64>(indptr, indices, weights, a, acc, n, first);
}

// out[j] = rule(a[j] + decay * acc[j]); out may not alias a (the caller ping-pongs two buffers).
HS_KERNEL void hs_spread_finish(const float* __restrict__ a, const float* __restrict__ acc,
                                float* __restrict__ out, hs_i64 n, float decay, float threshold) {
    for (hs_i64 j = hs_gid(); j < n; j += hs_gstride()) {
        float v = a[j] + decay * acc[j];
        v = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
        out[j] = v < threshold ? 0.0f : v;
    }
}
