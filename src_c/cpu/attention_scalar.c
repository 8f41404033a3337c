/* Portable variant of the attention kernel (plain C; the compiler maps hs_vf, 8 floats, to SSE2). */
#include "simd.h"
#include "attention.inc"
