/* bfloat16 silu_mul and rope on AVX512_BF16: the AVX-512 level's kernels with the stores of two vectors
 * as one vcvtne2ps2bf16 (simd.h, hs_v_store2_bf16: the same bits as the integer rounding, which takes
 * the rare pairs holding a NaN or a denormal). This file alone is compiled for AVX512_BF16 besides the
 * AVX-512 level's subsets; elementwise.c calls it only where hs_cpu_bf16_dot() says the CPU has it and
 * the level allows it (HIPSCHED_CPU_FEATURES=avx512 runs the AVX-512 build's integer rounding). */
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#define HS_AVX512 1
#define HS_BF16DOT 1
#include "simd.h"
#include "elementwise.inc"
