// Rotary position embedding (hipsched/ops/elementwise.py, prepare_rope): x (batch, heads, seq, d), d even,
// pair i of the row at sequence index s rotated by theta_i = pos / scale * base^(-2i/d), pos = positions[s]
// or positions[b * seq + s] (per_batch). gptj 0 pairs (i, i + d/2) (NeoX halves), 1 pairs (2i, 2i + 1).
// One thread per pair, grid-stride. The angle is formed in double and its cos and sin rounded to float,
// as the CPU engine does (a float pos * inv_freq is off by pos ulp: at 32k positions, radians); the
// rotation is float, rounded once to T. The double work is ~2 transcendental calls per 2 elements: a
// few % of an H100's FP64 rate at its bandwidth, more on consumer parts, where rope is a small share of
// a decode step anyway.
template <class T>
HS_DEV void hs_rope_body(const T* __restrict__ x, const hs_i64* __restrict__ pos, T* __restrict__ y, hs_i64 heads,
                         hs_i64 seq, hs_i64 d, hs_i32 per_batch, double base, double scale, hs_i32 gptj, hs_i64 pairs) {
    const hs_i64 h = d / 2;
    for (hs_i64 q = hs_gid(); q < pairs; q += hs_gstride()) {
        const hs_i64 row = q / h, i = q - row * h, s = row % seq, b = row / (heads * seq);
        const hs_i64 p = pos[per_batch ? b * seq + s : s];
        const double t = ((double)p / scale) * pow(base, -2.0 * (double)i / (double)d);
        const float c = (float)cos(t), sn = (float)sin(t);
        const hs_i64 j0 = row * d + (gptj ? 2 * i : i), j1 = j0 + (gptj ? 1 : h);
        const float a = hs_ld(x[j0]), bb = hs_ld(x[j1]);
        y[j0] = hs_st<T>(a * c - bb * sn);
        y[j1] = hs_st<T>(a * sn + bb * c);
    }
}

#define HS_ROPE(S, T)                                                                                            \
    HS_KERNEL void hs_rope_##S(const T* __restrict__ x, const hs_i64* __restrict__ pos, T* __restrict__ y,        \
                               hs_i64 heads, hs_i64 seq, hs_i64 d, hs_i32 per_batch, double base, double scale,   \
                               hs_i32 gptj, hs_i64 pairs) {                                                      \
        hs_rope_body<T>(x, pos, y, heads, seq, d, per_batch, base, scale, gptj, pairs);                          \
    }
HS_FOR_EACH_FLOAT(HS_ROPE)
