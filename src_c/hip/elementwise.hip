// Elementwise kernels: add (same shape, or b repeating over a's trailing dimensions: a bias) and scale,
// for float32, float16 and bfloat16 (suffix f32/f16/bf16): halves are widened to float, the sum or
// product is formed in float and rounded once to the element type, as PyTorch computes them.
// Bandwidth-bound, so each has a 4-wide variant (_v4: float4, or 8 bytes of halves) the glue picks when
// every pointer is 16-byte aligned and the lengths are multiples of 4; the scalar variants take any
// pointer (foreign device arrays).

template <class T>
HS_DEV void hs_add_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = hs_st<T>(hs_ld(a[i]) + hs_ld(b[i]));
}

// n4 = n / 4; requires aligned pointers and n % 4 == 0.
template <class T>
HS_DEV void hs_add_v4_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n4) {
    for (hs_i64 i = hs_gid(); i < n4; i += hs_gstride()) {
        const float4 u = hs_ld4(a, i), v = hs_ld4(b, i);
        hs_st4(y, i, make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w));
    }
}

// y[i] = a[i] + b[i % nb]: b's shape is a trailing part of a's, so it repeats every nb elements.
template <class T>
HS_DEV void hs_add_bias_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n,
                             hs_i64 nb) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = hs_st<T>(hs_ld(a[i]) + hs_ld(b[i % nb]));
}

// 4-wide variant: nb4 = nb / 4 (nb % 4 == 0), n4 = n / 4.
template <class T>
HS_DEV void hs_add_bias_v4_body(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n4,
                                hs_i64 nb4) {
    for (hs_i64 i = hs_gid(); i < n4; i += hs_gstride()) {
        const float4 u = hs_ld4(a, i), v = hs_ld4(b, i % nb4);
        hs_st4(y, i, make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w));
    }
}

template <class T> HS_DEV void hs_scale_body(const T* __restrict__ x, T* __restrict__ y, float alpha, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = hs_st<T>(alpha * hs_ld(x[i]));
}

template <class T> HS_DEV void hs_scale_v4_body(const T* __restrict__ x, T* __restrict__ y, float alpha, hs_i64 n4) {
    for (hs_i64 i = hs_gid(); i < n4; i += hs_gstride()) {
        const float4 u = hs_ld4(x, i);
        hs_st4(y, i, make_float4(alpha * u.x, alpha * u.y, alpha * u.z, alpha * u.w));
    }
}

#define HS_ELEMENTWISE(S, T)                                                                                     \
    HS_KERNEL void hs_add_##S(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, hs_i64 n) {    \
        hs_add_body<T>(a, b, y, n);                                                                              \
    }                                                                                                            \
    HS_KERNEL void hs_add_##S##_v4(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,           \
                                   hs_i64 n4) {                                                                  \
        hs_add_v4_body<T>(a, b, y, n4);                                                                          \
    }                                                                                                            \
    HS_KERNEL void hs_add_bias_##S(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,           \
                                   hs_i64 n, hs_i64 nb) {                                                        \
        hs_add_bias_body<T>(a, b, y, n, nb);                                                                     \
    }                                                                                                            \
    HS_KERNEL void hs_add_bias_##S##_v4(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,      \
                                        hs_i64 n4, hs_i64 nb4) {                                                 \
        hs_add_bias_v4_body<T>(a, b, y, n4, nb4);                                                                \
    }                                                                                                            \
    HS_KERNEL void hs_scale_##S(const T* __restrict__ x, T* __restrict__ y, float alpha, hs_i64 n) {              \
        hs_scale_body<T>(x, y, alpha, n);                                                                        \
    }                                                                                                            \
    HS_KERNEL void hs_scale_##S##_v4(const T* __restrict__ x, T* __restrict__ y, float alpha, hs_i64 n4) {        \
        hs_scale_v4_body<T>(x, y, alpha, n4);                                                                    \
    }
HS_FOR_EACH_FLOAT(HS_ELEMENTWISE)
