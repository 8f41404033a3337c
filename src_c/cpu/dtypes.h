/* Element-type codes shared by the Cython wrappers (hipsched/cpu/_carray.pxd: float_ptr) and the C
 * kernels, so one number travels from the array's dtype to the kernel's choice of loads and stores.
 * Half types are held as uint16_t bit patterns in C: the kernels convert them in registers (simd.h). */
#ifndef HS_DTYPES_H
#define HS_DTYPES_H
#include <stdint.h>

typedef enum { HS_F32 = 0, HS_F16 = 1, HS_BF16 = 2 } hs_dtype;

static inline int64_t hs_dtype_size(hs_dtype dt) { return dt == HS_F32 ? 4 : 2; }

#endif
