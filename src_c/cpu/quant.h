/* GGUF block quantization (ggml's Q8_0 and Q4_0): quantize float32 rows, dequantize them, and multiply
 * quantized weights by float32 vectors or matrices without materialising the float weights.
 * Layouts (little-endian, blocks of HS_QK = 32 consecutive elements of a row):
 *   Q8_0: fp16 d, then 32 int8 q            (34 bytes), value q * d
 *   Q4_0: fp16 d, then 16 bytes of nibbles  (18 bytes), element j in the low nibble of byte j,
 *         element j + 16 in the high nibble, value (q - 8) * d
 * A matrix (n, k) is n rows of k / 32 blocks, so its blocks are also one flat sequence. */
#ifndef HS_QUANT_H
#define HS_QUANT_H
#include <stdint.h>

#define HS_QK 32
enum { HS_Q8_0 = 0, HS_Q4_0 = 1 };

/* hs_quantize's answers: any block with a NaN/inf, or whose fp16 scale would overflow to inf. */
enum { HS_QUANT_OK = 0, HS_QUANT_NONFINITE = 1, HS_QUANT_RANGE = 2 };

/* Bytes of one block of `qtype` (34 or 18), 0 for an unknown qtype. */
int hs_quant_block_bytes(int qtype);

/* Quantize `nblocks` blocks of 32 floats from `x` into `out`, rounding exactly as ggml's reference
 * quantizers (quantize_row_q8_0_ref / quantize_row_q4_0_ref). Returns an HS_QUANT_* code; on an error
 * the contents of `out` are unspecified. */
int hs_quantize(int qtype, const float *x, int64_t nblocks, uint8_t *out);

/* out[b * 32 + j] = value j of block b, for `nblocks` blocks (bit-exact: one float product each). */
void hs_dequantize(int qtype, const uint8_t *data, int64_t nblocks, float *out);

/* out (n, m) row-major = W (n, k) @ X, W quantized, X given transposed as xt (m, k) row-major (for
 * m == 1 that is x itself). Each weight is dequantized in registers (bit-exact as hs_dequantize) and
 * accumulated in float32 with x kept in float32: no 8-bit quantization of x. */
void hs_qmatmul(int qtype, const uint8_t *data, int64_t n, int64_t k, const float *xt, int64_t m, float *out);

#endif
