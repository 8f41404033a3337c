/* The AVX2+FMA variant of the quant kernels (F16C too, for the block scales) (quant.inc). No contraction: see quant.inc. */
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#define HS_AVX2 1
#include "simd.h"
#include "quant.inc"
