/* CPU feature probe and thread count, header-only: every extension module gets its own copy of the
 * cached answers, and all copies read the same CPUID and environment, so they always agree.
 * HIPSCHED_CPU_FEATURES=scalar forces the portable path (so CI covers it on AVX2 machines); =avx2 or
 * =avx512 caps the level there (a CPU without it runs the highest level it has). =avx512_bf16 is the
 * AVX-512 level with its bfloat16 dot products (hs_cpu_bf16_dot): what a plain run on such a CPU uses,
 * and =avx512 is that level without them (the widening bfloat16 path, so tests cover both).
 * HIPSCHED_NUM_THREADS caps the OpenMP team size. Both are read once, at first use. */
#ifndef HS_CPU_FEATURES_H
#define HS_CPU_FEATURES_H
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#include <pthread.h>
#include <unistd.h>

/* HS_LEVEL_AVX512_BF16 is only ever requested (HIPSCHED_CPU_FEATURES=avx512_bf16): the vector level it
 * runs is AVX-512's, and hs_cpu_bf16_dot() says whether the bfloat16 products use vdpbf16ps. */
enum { HS_LEVEL_SCALAR = 0, HS_LEVEL_AVX2 = 1, HS_LEVEL_AVX512 = 2, HS_LEVEL_AVX512_BF16 = 3 };
/* A kernel compiled per level is declared and picked through these, in every family's public .c file:
 * HS_VARIANTS declares name_avx512, name_avx2 and name_scalar; HS_PICK_AT(level, name) is the one of
 * `level` (HS_PICK: of hs_cpu_level(), below). */
#define HS_VARIANTS(ret, name, args) ret name##_avx512 args; ret name##_avx2 args; ret name##_scalar args;
#define HS_PICK_AT(level, name) \
    ((level) >= HS_LEVEL_AVX512 ? name##_avx512 : (level) >= HS_LEVEL_AVX2 ? name##_avx2 : name##_scalar)
#define HS_PICK(name) HS_PICK_AT(hs_cpu_level(), name)

static int hs__probe_avx2_fma(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    /* F16C (half <-> float conversion) belongs to the AVX2 level: every AVX2 CPU has it, and the
     * level's float16 loads and stores use it */
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!(osxsave && avx && fma && f16c)) return 0;
    /* The CPU having AVX is not enough: the OS must save YMM state on context switches. */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6u) != 6u) return 0;
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1;
#else
    return 0;
#endif
}

/* The AVX-512 level: everything the AVX2 level needs, AVX512F/DQ/BW/VL (CPUID.7.0:EBX bits 16, 17, 30,
 * 31: what *_avx512.c is compiled for), and an OS that saves the opmask and all 32 ZMM registers
 * (XCR0 bits 5, 6, 7, besides SSE and AVX state: 0xE6). */
static int hs__probe_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (!hs__probe_avx2_fma()) return 0;
    unsigned a, b, c, d, xlo, xhi;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    if ((b & need) != need) return 0;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    return (xlo & 0xe6u) == 0xe6u;
#else
    return 0;
#endif
}

/* AVX512_BF16 (CPUID.7.1:EAX bit 5): vdpbf16ps, which the bfloat16 matmul and attention's Q.K^T use
 * where both operands are bfloat16 (hs_cpu_bf16_dot). The bfloat16 store keeps its shift-and-round rule
 * rather than vcvtneps2bf16, which quiets NaNs differently from ml_dtypes and reads denormals as zero;
 * silu_mul and rope use vcvtne2ps2bf16 for the pairs of vectors holding neither (simd.h,
 * hs_v_store2_bf16: the same bits). AVX512_FP16 (CPUID.7.0:EDX
 * bit 23) is reported only (cpu_features()). */
static inline int hs_cpu_has_avx512_bf16(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!hs__probe_avx512() || __get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (a < 1) return 0;  /* leaf 7 has no sub-leaf 1 */
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 5) & 1;
#else
    return 0;
#endif
}

static inline int hs_cpu_has_avx512_fp16(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!hs__probe_avx512()) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (d >> 23) & 1;
#else
    return 0;
#endif
}

static inline int hs_cpu_level_detected(void) {
    return hs__probe_avx512() ? HS_LEVEL_AVX512 : hs__probe_avx2_fma() ? HS_LEVEL_AVX2 : HS_LEVEL_SCALAR;
}

/* The level HIPSCHED_CPU_FEATURES asks for: "scalar" (or "none"), "avx2" or "avx512"; -1 when unset or
 * anything else (then the detected level runs). */
static inline int hs_cpu_level_requested(void) {
    const char *m = getenv("HIPSCHED_CPU_FEATURES");
    if (!m) return -1;
    if (strcmp(m, "scalar") == 0 || strcmp(m, "none") == 0) return HS_LEVEL_SCALAR;
    if (strcmp(m, "avx2") == 0) return HS_LEVEL_AVX2;
    if (strcmp(m, "avx512") == 0) return HS_LEVEL_AVX512;
    if (strcmp(m, "avx512_bf16") == 0) return HS_LEVEL_AVX512_BF16;
    return -1;
}

static int hs__level = -1;

/* A requested level the CPU lacks gives the highest one it has, never an illegal instruction:
 * cpu_features() shows both, so the fallback is visible. */
static inline int hs_cpu_level(void) {
    if (hs__level < 0) {  /* benign race: every thread computes the same value */
        int lvl = hs_cpu_level_detected(), req = hs_cpu_level_requested();
        if (req >= 0 && req < lvl) lvl = req;
        hs__level = lvl;
    }
    return hs__level;
}

static int hs__bf16_dot = -1;

/* Whether bfloat16 x bfloat16 products run on vdpbf16ps: the AVX-512 level runs, the CPU has
 * AVX512_BF16, and HIPSCHED_CPU_FEATURES asks for nothing lower than avx512_bf16 (unset included).
 * Those kernels differ from the widening path in summation order and in flushing bfloat16 denormals
 * (docs/architecture.md, "CPU SIMD levels"). */
static inline int hs_cpu_bf16_dot(void) {
    if (hs__bf16_dot < 0) {
        int req = hs_cpu_level_requested();
        hs__bf16_dot = hs_cpu_level() == HS_LEVEL_AVX512 && hs_cpu_has_avx512_bf16()
                       && (req < 0 || req >= HS_LEVEL_AVX512_BF16);
    }
    return hs__bf16_dot;
}

static inline const char *hs_cpu_level_name(int level) {
    return level == HS_LEVEL_AVX512_BF16 ? "avx512_bf16" : level == HS_LEVEL_AVX512 ? "avx512" : level == HS_LEVEL_AVX2 ? "avx2" : level == HS_LEVEL_SCALAR ? "scalar" : "auto";
}

/* The thread cap, one per extension module: every translation unit that includes this defines it weak,
 * and the linker keeps one per module (hidden: modules do not share it). 0 until first read, then the
 * default (below), or what hs_set_num_threads gave: hipsched.cpu.set_num_threads, which threadpoolctl
 * calls, sets it in every loaded family module, so one setting reaches all of a module's kernels. */
__attribute__((weak, visibility("hidden"))) int hs__threads = 0;
static int hs__forked = 0;

/* libgomp's thread pool does not survive fork(): a child that starts a parallel region after the parent
 * used one waits forever for pool threads that no longer exist (multiprocessing's fork start method,
 * DataLoader-style workers). So a forked child runs every kernel on its calling thread, as PyTorch does.
 * Modules loaded before the fork learn it from this handler (each registers at load, since any one of
 * them may have started the shared pool); modules first imported in the child learn it from
 * HIPSCHED_FORKED_CHILD, which hipsched/cpu/__init__.py sets to the child's pid after every fork. */
static void hs__after_fork_child(void) { hs__forked = 1; }

__attribute__((constructor)) static void hs__register_fork_handler(void) {
    pthread_atfork(NULL, NULL, hs__after_fork_child);
}

static inline int hs_num_threads(void) {
    if (hs__forked) return 1;
    if (hs__threads <= 0) {
        const char *f = getenv("HIPSCHED_FORKED_CHILD");
        if (f && atol(f) == (long)getpid()) {
            hs__forked = 1;
            return 1;
        }
        int n = 1;
#ifdef _OPENMP
        n = omp_get_max_threads();
#endif
        const char *e = getenv("HIPSCHED_NUM_THREADS");
        if (e) {
            int cap = atoi(e);
            if (cap > 0 && cap < n) n = cap;
        }
        hs__threads = n < 1 ? 1 : n;
    }
    return hs__threads;
}

/* n > 0: at most n threads from now on; n <= 0: back to the default. */
static inline void hs_set_num_threads(int n) { hs__threads = n > 0 ? n : 0; }

/* Threads worth using for `work` elements: parallel regions cost microseconds, so small calls stay
 * on the calling thread. `grain` is the least work one thread should get. Every parallel region that
 * uses it also says `if (nt > 1)`: libgomp starts a region even for a team of one (about a
 * microsecond, more than the whole of a tiny call), and the if clause is what skips it. */
static inline int hs_threads_for(long long work, long long grain) {
    long long t = grain > 0 ? work / grain : work;
    int n = hs_num_threads();
    if (t < 1) t = 1;
    return t < n ? (int)t : n;
}
#endif
