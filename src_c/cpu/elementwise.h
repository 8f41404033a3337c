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

/* out[i] = silu(g[i]) * u[i] in float32, rounded once: float32 as g / (1 + exp(-g)) * u with the vector exp
 * above; float16 and bfloat16 from exp(-|g|) (elementwise.inc, hs_v_silu_half), which meets the same
 * bound on the half result. */
void hs_silu_mul(hs_dtype dt, const void *g, const void *u, void *out, int64_t n);

/* GELU of n elements, each computed in float64 and rounded once: tanh_form 0 is 0.5 x erfc(-x / sqrt 2)
 * (torch's approximate="none"; erfc keeps large negative x accurate where 1 + erf cancels), 1 is
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (approximate="tanh"), evaluated as x / (1 + exp(-2u)),
 * the same function without the cancellation of 1 + tanh(u) for negative u. */
void hs_gelu(hs_dtype dt, const void *x, void *out, int64_t n, int tanh_form);

/* Rotary embedding of x (batch, heads, seq, d), d even, into out (may be x itself): pair i of the row at
 * sequence index s is rotated by theta_i = pos / scale * base^(-2i/d), pos = positions[s] or, with
 * pos_per_batch, positions[b * seq + s]. gptj 0 pairs (i, i + d/2) (NeoX), 1 pairs (2i, 2i + 1) (GPT-J).
 * Angles in float64, their cos and sin rounded to float32, the rotation in float32, rounded once.
 * Returns 0, or -1 when a table buffer could not be allocated (out is then incomplete). */
#define HS_ROPE_TAB 262144   /* floats of angle table a work item may hold (1 MiB, on the heap) */
int hs_rope(hs_dtype dt, const void *x, const int64_t *positions, void *out, int64_t batch, int64_t heads,
            int64_t seq, int64_t d, int pos_per_batch, double base, double scale, int gptj);

/* exp over n floats with the same approximation softmax uses (<= 2 ulp); for tests and reuse. */
void hs_exp_f32(const float *x, float *out, int64_t n);
#endif
