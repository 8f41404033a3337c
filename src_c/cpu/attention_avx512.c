/* AVX-512 variant of the attention kernel: this file alone is compiled for the subsets the level
 * requires (cpu_features.h: F, DQ, BW, VL, and what the AVX2 level needs). */
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")
#define HS_AVX512 1
#include "simd.h"
#include "attention.inc"
