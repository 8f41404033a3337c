// Rotary position embedding (hipsched/ops/elementwise.py, prepare_rope): x (batch, heads, seq, d), d even,
// pair i of the row at sequence index s rotated by theta_i = pos / scale * base^(-2i/d), pos = positions[s]
// or positions[b * seq + s] (per_batch). gptj 0 pairs (i, i + d/2) (NeoX halves), 1 pairs (2i, 2i + 1).
// One thread per pair, grid-stride. The angle is formed in double and its cos and sin rounded to float,
// as the CPU engine does (a float pos * inv_freq is off by pos ulp: at 32k positions, radians); the
// rotation is float, rounded once to T.
// cos and sin are the CPU engine's branch-free double sincos (elementwise.inc, hs_sincos_d): a
// three-part Cody-Waite reduction by pi/2 (exact for |theta| < 2^19, off by about theta 2^-53 rad above:
// under an eighth of a float32 ulp below 2^26) and fdlibm's kernel polynomials. The library's double
// sin/cos would add a Payne-Hanek reduction for huge arguments, which keeps its table in local memory
// (5 local loads on sm_90); the glue refuses angles past 2^26 instead (rope_plan), which the CPU takes.
// base^(-2i/d) is exp2(i * log2r), log2r = -2 log2(base) / d from the host.
HS_DEV void hs_rope_sincos(double t, float* c, float* s) {
    const double k = rint(t * 6.36619772367581382433e-01);
    double r = t - k * 1.57079632673412561417e+00;
    r = r - k * 6.07710050650619224932e-11;
    r = r - k * 2.02226624879595063154e-21;
    const double z = r * r;
    const double sp = r + r * z * (-1.66666666666666324348e-01 + z * (8.33333333332248946124e-03 + z * (-1.98412698298579493134e-04
                      + z * (2.75573137070700676789e-06 + z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)))));
    const double cp = 1.0 - 0.5 * z + z * z * (4.16666666666666019037e-02 + z * (-1.38888888888741095749e-03 + z * (2.48015872894767294178e-05
                      + z * (-2.75573143513906633035e-07 + z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11)))));
    const int q = (int)k & 3;
    const double sv = (q & 1) ? cp : sp, cv = (q & 1) ? sp : cp;
    *s = (float)((q & 2) ? -sv : sv);
    *c = (float)(((q + 1) & 2) ? -cv : cv);
}

template <class T>
HS_DEV void hs_rope_body(const T* __restrict__ x, const hs_i64* __restrict__ pos, T* __restrict__ y, hs_i64 heads,
                         hs_i64 seq, hs_i64 d, hs_i32 per_batch, double log2r, double scale, hs_i32 gptj, hs_i64 pairs) {
    const hs_i64 h = d / 2;
    for (hs_i64 q = hs_gid(); q < pairs; q += hs_gstride()) {
        const hs_i64 row = q / h, i = q - row * h, s = row % seq, b = row / (heads * seq);
        const hs_i64 p = pos[per_batch ? b * seq + s : s];
        float c, sn;
        hs_rope_sincos(((double)p / scale) * exp2((double)i * log2r), &c, &sn);
        const hs_i64 j0 = row * d + (gptj ? 2 * i : i), j1 = j0 + (gptj ? 1 : h);
        const float a = hs_ld(x[j0]), bb = hs_ld(x[j1]);
        y[j0] = hs_st<T>(a * c - bb * sn);
        y[j1] = hs_st<T>(a * sn + bb * c);
    }
}

#define HS_ROPE(S, T)                                                                                            \
    HS_KERNEL void hs_rope_##S(const T* __restrict__ x, const hs_i64* __restrict__ pos, T* __restrict__ y,        \
                               hs_i64 heads, hs_i64 seq, hs_i64 d, hs_i32 per_batch, double log2r, double scale,  \
                               hs_i32 gptj, hs_i64 pairs) {                                                      \
        hs_rope_body<T>(x, pos, y, heads, seq, d, per_batch, log2r, scale, gptj, pairs);                         \
    }
HS_FOR_EACH_FLOAT(HS_ROPE)
