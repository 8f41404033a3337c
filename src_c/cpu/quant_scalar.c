/* The portable variant of the quant kernels (quant.inc), for CPUs without AVX2/FMA or when
 * HIPSCHED_CPU_FEATURES=scalar. No contraction: see quant.inc. */
#pragma GCC optimize("fp-contract=off")
#include "simd.h"
#include "quant.inc"
