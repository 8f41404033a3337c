/* AVX2+FMA variant of the normalisation kernels (this file alone is compiled for AVX2). */
#pragma GCC target("avx2,fma,f16c")
#define HS_AVX2 1
#include "simd.h"
#include "norm.inc"
