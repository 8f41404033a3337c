/* AVX-512 variant of the attention kernel with AVX512_BF16: bfloat16 Q.K^T on vdpbf16ps (attention.inc,
 * HS_BF16DOT). attention.c picks it for bfloat16 inputs of even head_dim where hs_cpu_bf16_dot() holds;
 * this file alone is compiled for AVX512_BF16. */
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#define HS_AVX512 1
#define HS_BF16DOT 1
#include "simd.h"
#include "attention.inc"
