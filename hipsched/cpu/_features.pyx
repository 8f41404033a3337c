# The CPU feature level and thread count every kernel family uses (src_c/cpu/cpu_features.h).
cdef extern from "cpu_features.h":
    int hs_cpu_level()
    int hs_cpu_level_detected()
    int hs_cpu_level_requested()
    const char *hs_cpu_level_name(int level)
    int hs_cpu_has_avx512_bf16()
    int hs_cpu_has_avx512_fp16()
    int hs_cpu_bf16_dot()

include "_threads.pxi"

# threadpoolctl finds hipsched's pool by this symbol in this module's library (hipsched/cpu/threadpool.py)
cdef public int hipsched_cpu_thread_pool = 1


def cpu_features():
    """What the CPU kernels run with: the SIMD level chosen ("simd"), the highest the CPU has
    ("detected"), the one HIPSCHED_CPU_FEATURES asked for ("requested": "auto" when unset or not a level
    name; a level the CPU lacks gives "detected"), and the thread count. avx512_bf16 / avx512_fp16 say
    whether the CPU has those extensions (the AVX-512 level needs neither); "bf16_dot" whether the
    bfloat16 matmul and attention's Q.K^T run on AVX512_BF16's vdpbf16ps, which they do at the avx512
    level on a CPU that has it unless HIPSCHED_CPU_FEATURES caps it at avx512 or lower."""
    requested = hs_cpu_level_requested()
    return {
        "simd": hs_cpu_level_name(hs_cpu_level()).decode(),
        "detected": hs_cpu_level_name(hs_cpu_level_detected()).decode(),
        "requested": hs_cpu_level_name(requested).decode() if requested >= 0 else "auto",
        "threads": hs_num_threads(),
        "avx512_bf16": bool(hs_cpu_has_avx512_bf16()),
        "avx512_fp16": bool(hs_cpu_has_avx512_fp16()),
        "bf16_dot": bool(hs_cpu_bf16_dot()),
    }

