/* Elementwise kernels on contiguous float32, float16 or bfloat16 (one dtype per call: mixed inputs are
 * promoted by the caller): add (same shape or a trailing-shape bias), scale, and a numerically stable
 * softmax along one axis. Half data is read as 16-bit patterns, converted to float32 in registers,
 * computed in float32, and rounded to its type once, at the store. Each public function picks its
 * SIMD variant once (cpu_features.h) and splits the work over OpenMP threads; callers release the GIL. */
#ifndef HS_ELEMENTWISE_H
#define HS_ELEMENTWISE_H
#include <stdint.h>
#include "dtypes.h"

/* Columns one softmax work item covers when the axis is not the last (stack buffers in the kernel). */
#define HS_SOFTMAX_COLS 256
/* Longest row whose float32 exponentials a half softmax keeps on the stack (16 KiB); longer rows use
 * a heap buffer, or recompute exp if none can be had. */
#define HS_SOFTMAX_ROWBUF 4096

/* out[i] = a[i] + b[i % nb] for i < n; nb divides n (nb == n: same shape, nb < n: b repeats). */
void hs_add(hs_dtype dt, const void *a, const void *b, void *out, int64_t n, int64_t nb);
void hs_add_f32(const float *a, const float *b, float *out, int64_t n, int64_t nb);

/* out[i] = alpha * x[i] for i < n, the product formed in float32. */
void hs_scale(hs_dtype dt, const void *x, float alpha, void *out, int64_t n);
void hs_scale_f32(const float *x, float alpha, float *out, int64_t n);

/* Softmax of x viewed as (outer, len, inner) along the middle axis: y = exp(x - max) / sum, with the
 * max and the sum in float32 for every dtype.
 * A slice whose max is NaN or +-inf comes out all NaN, as scipy.special.softmax's formula gives. */
void hs_softmax(hs_dtype dt, const void *x, void *out, int64_t outer, int64_t len, int64_t inner);
void hs_softmax_f32(const float *x, float *out, int64_t outer, int64_t len, int64_t inner);

/* exp over n floats with the same approximation softmax uses (<= 2 ulp); for tests and reuse. */
void hs_exp_f32(const float *x, float *out, int64_t n);
#endif
