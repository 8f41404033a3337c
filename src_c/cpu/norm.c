/* Public normalisation functions: pick the variant once (hs_cpu_level) and split rows over threads.
 * Work items are groups of rows of at least HS_NORM_ITEM elements, handed out dynamically. */
#include "cpu_features.h"
#include "norm.h"

void hs_rms_norm_rows_avx2(const float *x, const float *w, double eps, float *y, int64_t r0, int64_t r1, int64_t len);
void hs_rms_norm_rows_scalar(const float *x, const float *w, double eps, float *y, int64_t r0, int64_t r1,
                             int64_t len);

#define HS_NORM_GRAIN (1 << 18)   /* below ~1 MiB a second thread costs more than it saves */
#define HS_NORM_ITEM 16384        /* elements per work item: amortises the scheduling of each */

void hs_rms_norm_f32(const float *x, const float *w, double eps, float *out, int64_t rows, int64_t len) {
    if (rows <= 0 || len <= 0) return;
    void (*f)(const float *, const float *, double, float *, int64_t, int64_t, int64_t) =
        hs_cpu_level() == HS_LEVEL_AVX2 ? hs_rms_norm_rows_avx2 : hs_rms_norm_rows_scalar;
    int nt = hs_threads_for(rows * len, HS_NORM_GRAIN);
    if (nt == 1) {  /* a tiny call never enters the OpenMP runtime (about a microsecond even for one thread) */
        f(x, w, eps, out, 0, rows, len);
        return;
    }
    int64_t per = HS_NORM_ITEM / len > 1 ? HS_NORM_ITEM / len : 1;
    int64_t items = (rows + per - 1) / per;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int64_t it = 0; it < items; it++) {
        int64_t r0 = it * per, r1 = r0 + per < rows ? r0 + per : rows;
        f(x, w, eps, out, r0, r1, len);
    }
}
