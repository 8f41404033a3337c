/* Public quant kernels: each picks its SIMD variant (quant_avx512.c / quant_avx2.c / quant_scalar.c) from
 * the CPU level probed once (cpu_features.h). */
#include "cpu_features.h"
#include "quant.h"

HS_VARIANTS(int, hs_quantize, (int qt, const float *x, int64_t nblocks, uint8_t *out))
HS_VARIANTS(void, hs_dequantize, (int qt, const uint8_t *data, int64_t nblocks, float *out))
HS_VARIANTS(void, hs_qmatmul, (int qt, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m,
                               float *out))

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
    return HS_PICK_AT(hs_quant_level(), hs_quantize)(qtype, x, nblocks, out);
}

void hs_dequantize(int qtype, const uint8_t *data, int64_t nblocks, float *out) {
    if (nblocks <= 0) return;
    HS_PICK_AT(hs_quant_level(), hs_dequantize)(qtype, data, nblocks, out);
}

void hs_qmatmul(int qtype, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m, float *out) {
    if (n <= 0 || m <= 0) return;
    HS_PICK_AT(hs_quant_level(), hs_qmatmul)(qtype, data, n, k, xt, m, out);
}
