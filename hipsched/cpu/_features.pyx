# The CPU feature level and thread count every kernel family uses (src_c/cpu/cpu_features.h).
cdef extern from "cpu_features.h":
    int hs_cpu_level()
    int hs_cpu_level_detected()
    const char *hs_cpu_level_name(int level)
    int hs_num_threads()


def cpu_features():
    """What the CPU kernels run with: the SIMD level chosen, the one detected, and the thread count."""
    return {
        "simd": hs_cpu_level_name(hs_cpu_level()).decode(),
        "detected": hs_cpu_level_name(hs_cpu_level_detected()).decode(),
        "threads": hs_num_threads(),
    }
