/* Normalisation kernels on contiguous float32: RMS norm over the last axis. The public function picks
 * its SIMD variant once (cpu_features.h) and splits rows over OpenMP threads; callers release the GIL. */
#ifndef HS_NORM_H
#define HS_NORM_H
#include <stdint.h>

/* out[r, j] = x[r, j] / sqrt(mean_j(x[r, j]^2) + eps) * w[j] for an (rows, len) row-major x.
 * The sum of squares and the product are formed in double and rounded to float32 once per element,
 * so a row with NaN or inf gives what the float64 formula gives (inf: inf / inf = NaN, finite / inf = 0). */
void hs_rms_norm_f32(const float *x, const float *w, double eps, float *out, int64_t rows, int64_t len);
#endif
