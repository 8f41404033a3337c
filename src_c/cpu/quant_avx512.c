/* The AVX-512 variant of the quant kernels (quant.inc): this file alone is compiled for the subsets the
 * level requires (cpu_features.h: F, DQ, BW, VL, and what the AVX2 level needs, F16C included). No
 * contraction: see quant.inc. */
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#define HS_AVX512 1
#include "simd.h"
#include "quant.inc"
