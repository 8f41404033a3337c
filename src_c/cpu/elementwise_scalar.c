/* Portable variant of the elementwise kernels (plain C; the compiler maps hs_v8f to SSE2). */
#include "simd.h"
#include "elementwise.inc"
