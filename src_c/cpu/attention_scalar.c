/* Portable variant of the attention kernel (plain C; the compiler maps hs_v8f to SSE2). */
#include "simd.h"
#include "attention.inc"
