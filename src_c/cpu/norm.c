/* Public normalisation functions: pick the variant once (hs_cpu_level) and split rows over threads.
 * Work items are groups of rows of at least HS_NORM_ITEM elements, handed out dynamically. */
#include "cpu_features.h"
#include "norm.h"

/* The row function exists per element type (f32, f16, bf16) and per variant (avx512, avx2, scalar). */
#define HS_ROWS_ARGS (const void *x, const void *w, double eps, void *y, int64_t r0, int64_t r1, int64_t len)
HS_VARIANTS(void, hs_rms_norm_rows_f32, HS_ROWS_ARGS)
HS_VARIANTS(void, hs_rms_norm_rows_f16, HS_ROWS_ARGS)
HS_VARIANTS(void, hs_rms_norm_rows_bf16, HS_ROWS_ARGS)

#define HS_NORM_GRAIN (1 << 18)   /* below ~1 MiB of float32 a second thread costs more than it saves */
#define HS_NORM_ITEM 16384        /* elements per work item: amortises the scheduling of each */

void hs_rms_norm(hs_dtype dt, const void *x, const void *w, double eps, void *out, int64_t rows, int64_t len) {
    if (rows <= 0 || len <= 0) return;
    void (*f) HS_ROWS_ARGS = dt == HS_F16 ? HS_PICK(hs_rms_norm_rows_f16)
                           : dt == HS_BF16 ? HS_PICK(hs_rms_norm_rows_bf16) : HS_PICK(hs_rms_norm_rows_f32);
    /* grains count elements, whatever their size: a half element costs about what a float32 one does */
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

void hs_rms_norm_f32(const float *x, const float *w, double eps, float *out, int64_t rows, int64_t len) {
    hs_rms_norm(HS_F32, x, w, eps, out, rows, len);
}
