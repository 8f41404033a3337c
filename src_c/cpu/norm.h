/* Normalisation kernels on contiguous float32, float16 or bfloat16 (x and weight of one dtype: mixed
 * inputs are promoted by the caller): RMS norm over the last axis. Half data is read as 16-bit
 * patterns and converted in registers; the result is rounded to its type once, at the store. The public
 * function picks its SIMD variant once (cpu_features.h) and splits rows over OpenMP threads; callers
 * release the GIL. */
#ifndef HS_NORM_H
#define HS_NORM_H
#include <stdint.h>
#include "dtypes.h"

/* out[r, j] = x[r, j] / sqrt(mean_j(x[r, j]^2) + eps) * w[j] for an (rows, len) row-major x.
 * The sum of squares and the product are formed in double and rounded to float32 once per element
 * (then to the half type, for half data), so a row with NaN or inf gives what the float64 formula
 * gives (inf: inf / inf = NaN, finite / inf = 0). */
void hs_rms_norm(hs_dtype dt, const void *x, const void *w, double eps, void *out, int64_t rows, int64_t len);
void hs_rms_norm_f32(const float *x, const float *w, double eps, float *out, int64_t rows, int64_t len);
#endif
