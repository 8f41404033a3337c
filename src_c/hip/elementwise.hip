// Elementwise kernels: add (same shape, or b repeating over a's trailing dimensions: a bias) and scale.
// Bandwidth-bound, so each has a float4 variant the glue picks when every pointer is 16-byte aligned
// and the lengths are multiples of 4; the scalar variants take any pointer (foreign device arrays).

HS_KERNEL void hs_add_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                          hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = a[i] + b[i];
}

// n4 = n / 4; requires 16-byte aligned pointers and n % 4 == 0.
HS_KERNEL void hs_add_f32_v4(const float4* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ y,
                             hs_i64 n4) {
    for (hs_i64 i = hs_gid(); i < n4; i += hs_gstride()) {
        const float4 u = a[i], v = b[i];
        y[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
    }
}

// y[i] = a[i] + b[i % nb]: b's shape is a trailing part of a's, so it repeats every nb elements.
HS_KERNEL void hs_add_bias_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                               hs_i64 n, hs_i64 nb) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = a[i] + b[i % nb];
}

// float4 variant: nb4 = nb / 4 (nb % 4 == 0), n4 = n / 4.
HS_KERNEL void hs_add_bias_f32_v4(const float4* __restrict__ a, const float4* __restrict__ b,
                                  float4* __restrict__ y, hs_i64 n4, hs_i64 nb4) {
    for (hs_i64 i = hs_gid(); i < n4; i += hs_gstride()) {
        const float4 u = a[i], v = b[i % nb4];
        y[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
    }
}

HS_KERNEL void hs_scale_f32(const float* __restrict__ x, float* __restrict__ y, float alpha, hs_i64 n) {
    for (hs_i64 i = hs_gid(); i < n; i += hs_gstride()) y[i] = alpha * x[i];
}

HS_KERNEL void hs_scale_f32_v4(const float4* __restrict__ x, float4* __restrict__ y, float alpha, hs_i64 n4) {
    for (hs_i64 i = hs_gid(); i < n4; i += hs_gstride()) {
        const float4 u = x[i];
        y[i] = make_float4(alpha * u.x, alpha * u.y, alpha * u.z, alpha * u.w);
    }
}
