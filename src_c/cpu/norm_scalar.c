/* Portable variant of the normalisation kernels (plain C). */
#include "simd.h"
#include "norm.inc"
