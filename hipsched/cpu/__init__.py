"""CPU engine: one Cython extension per op family wrapping the C kernels in src_c/cpu/."""
