/* Public quant kernels: each picks its SIMD variant (quant_avx512.c / quant_avx2.c / quant_scalar.c) from
 * the CPU level probed once (cpu_features.h). */
#include "cpu_features.h"
#include "quant.h"

int hs_quantize_avx512(int qt, const float *x, int64_t nblocks, uint8_t *out);
int hs_quantize_avx2(int qt, const float *x, int64_t nblocks, uint8_t *out);
int hs_quantize_scalar(int qt, const float *x, int64_t nblocks, uint8_t *out);
void hs_dequantize_avx512(int qt, const uint8_t *data, int64_t nblocks, float *out);
void hs_dequantize_avx2(int qt, const uint8_t *data, int64_t nblocks, float *out);
void hs_dequantize_scalar(int qt, const uint8_t *data, int64_t nblocks, float *out);
void hs_qmatmul_avx512(int qt, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m, float *out);
void hs_qmatmul_avx2(int qt, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m, float *out);
void hs_qmatmul_scalar(int qt, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m, float *out);

/* The SIMD variants also convert block scales with F16C, present on every AVX2 CPU made so far but
 * checked anyway (CPUID.1:ECX bit 29); without it the scalar variant runs. */
static int hs__quant_level = -1;

static int hs_quant_level(void) {
    if (hs__quant_level < 0) {
        int lvl = hs_cpu_level();
#if defined(__x86_64__) || defined(__i386__)
        unsigned a, b, c, d;
        if (lvl >= HS_LEVEL_AVX2 && !(__get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1))) lvl = HS_LEVEL_SCALAR;
#endif
        hs__quant_level = lvl;
    }
    return hs__quant_level;
}

int hs_quant_block_bytes(int qtype) {
    return qtype == HS_Q8_0 ? 34 : qtype == HS_Q4_0 ? 18 : 0;
}

int hs_quantize(int qtype, const float *x, int64_t nblocks, uint8_t *out) {
    if (nblocks <= 0) return HS_QUANT_OK;
    const int lvl = hs_quant_level();
    return lvl >= HS_LEVEL_AVX512 ? hs_quantize_avx512(qtype, x, nblocks, out)
         : lvl >= HS_LEVEL_AVX2 ? hs_quantize_avx2(qtype, x, nblocks, out)
                                : hs_quantize_scalar(qtype, x, nblocks, out);
}

void hs_dequantize(int qtype, const uint8_t *data, int64_t nblocks, float *out) {
    if (nblocks <= 0) return;
    const int lvl = hs_quant_level();
    if (lvl >= HS_LEVEL_AVX512) hs_dequantize_avx512(qtype, data, nblocks, out);
    else if (lvl >= HS_LEVEL_AVX2) hs_dequantize_avx2(qtype, data, nblocks, out);
    else hs_dequantize_scalar(qtype, data, nblocks, out);
}

void hs_qmatmul(int qtype, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m, float *out) {
    if (n <= 0 || m <= 0) return;
    const int lvl = hs_quant_level();
    if (lvl >= HS_LEVEL_AVX512) hs_qmatmul_avx512(qtype, data, n, k, xt, m, out);
    else if (lvl >= HS_LEVEL_AVX2) hs_qmatmul_avx2(qtype, data, n, k, xt, m, out);
    else hs_qmatmul_scalar(qtype, data, n, k, xt, m, out);
}
