// spread_activation over a CSR graph (A[i, j] = weight of the edge i -> j), one step as three launches
// on one stream: memset(acc, 0); push; finish. The CPU rule, per step, from the previous activations a:
//     a_new[j] = a[j] + decay * sum_i w_ij a[i];  then clamp to [0, 1];  then 0 where a_new < threshold.
// Push walks the rows (sources) in CSR order and atomically adds w_ij * a[i] into acc[j]; rows whose
// activation is exactly 0 add nothing and are skipped (early steps touch only the seeds' neighbourhood).
// Float atomics make the summation order vary between runs: results agree with the CPU engine to
// rounding, not bit for bit. indptr and indices are both int32 or both int64 (two entry points), as
// the op hands them to either engine (SciPy's int32 arrays go through without a copy).

// HSG_GROUP (lanes per row): hipsched/gpu/compilation/kernel_constants.py.

template <class I>
HS_DEV void hsg_push(const I* __restrict__ indptr, const I* __restrict__ indices,
                     const float* __restrict__ weights, const float* __restrict__ a, float* __restrict__ acc,
                     hs_i64 n) {
    const hs_i64 total = n * HSG_GROUP;
    for (hs_i64 t = hs_gid(); t < total; t += hs_gstride()) {
        const hs_i64 row = t / HSG_GROUP;
        const float ai = a[row];
        if (ai == 0.0f) continue;
        const hs_i64 end = (hs_i64)indptr[row + 1];
        for (hs_i64 e = (hs_i64)indptr[row] + (t % HSG_GROUP); e < end; e += HSG_GROUP)
            atomicAdd(acc + (hs_i64)indices[e], weights[e] * ai);
    }
}

HS_KERNEL void hs_spread_push_i32(const hs_i32* __restrict__ indptr, const hs_i32* __restrict__ indices,
                                  const float* __restrict__ weights, const float* __restrict__ a,
                                  float* __restrict__ acc, hs_i64 n) {
    hsg_push<hs_i32>(indptr, indices, weights, a, acc, n);
}

HS_KERNEL void hs_spread_push_i64(const hs_i64* __restrict__ indptr, const hs_i64* __restrict__ indices,
                                  const float* __restrict__ weights, const float* __restrict__ a,
                                  float* __restrict__ acc, hs_i64 n) {
    hsg_push<hs_i64>(indptr, indices, weights, a, acc, n);
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
