/* The C kernel API: one header per op family, all plain C11 functions on contiguous float32 (or GGUF
 * block bytes), each choosing its SIMD variant once (cpu_features.h) and releasing no locks of its own:
 * callers (the Cython wrappers) run them with the GIL released. */
#ifndef HS_KERNELS_H
#define HS_KERNELS_H
#include "cpu_features.h"
#include "elementwise.h"
#include "similarity.h"
#include "quant.h"
#include "attention.h"
#include "graph.h"
#endif
