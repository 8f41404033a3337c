"""A CPU executor for hipsched's HIP kernel sources, for tests only (never used by the package).

CI has no GPU, so compile checks alone would leave the kernels' logic (block reductions, shuffles,
multi-pass top-k, tails, warp 32 vs 64) untested. This runs the very same sources on the CPU: g++
compiles them after a shim that defines the HIP/CUDA kernel model, and a launch runs blockDim fibers (on
the launching thread) that walk the grid's blocks in order. `__syncthreads` is a block-wide barrier and each warp's
shuffles go through a warp-wide barrier, so the code only passes if it is correct for any interleaving
the barriers allow. `__shared__` becomes `static` (blocks run one after another) and the dynamic
shared buffer is per launch. Device pointers are host pointers, so `EmuRuntime` implements the Runtime
interface with malloc and memmove. Slow (a fiber switch per thread at every barrier), so tests keep
shapes small.

`EmuRuntime(asynchronous=True)` (or HIPSCHED_EMU_ASYNC=1) queues work per stream as a driver does, and
its memcheck poisons freed memory: see EmuRuntime."""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import hashlib
import itertools
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time

from hipsched.errors import GpuError
from hipsched.gpu.bindings.runtime import Compiler, DeviceInfo, Runtime

import emu_limits
import requires

SHIM = r"""
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <ucontext.h>
#include <sys/mman.h>
#include <cstdint>
#include <type_traits>
#include <vector>
// A block's threads run as fibers on the launching thread (emu_launch below): a barrier parks each
// arrival but the last, and the launcher's loop resumes them once the last has come. OS threads, one per
// GPU thread, spent most of a run in the kernel's scheduler on two cores (hundreds of futex wakes per
// shuffle); a fiber switch is a few hundred nanoseconds. The bookkeeping here and in the launcher is
// left uninstrumented (EMU_UNCHECKED): to ThreadSanitizer the fibers are threads that never synchronise
// by switching, so a barrier's happens-before is only what it releases on arrival and acquires on
// departure, one address per phase parity (a phase cannot be released again before all of its
// arrivals have left it), and a race between two threads of a block is reported as it would be on
// threads.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif
#define EMU_UNCHECKED __attribute__((no_sanitize_thread, noinline))
struct EmuBarrier {
    unsigned arrived = 0, gen = 0;
    const unsigned n;
    char sync[2];
    explicit EmuBarrier(unsigned n_) : n(n_) {}
    void arrive_and_wait();
};
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) float4 { float x, y, z, w; };  // as HIP/CUDA declare it: UBSan checks float4 loads
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
extern dim3 threadIdx, blockIdx;   // the running fiber's, set by the launcher
extern dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long pool = ((unsigned long long)y << 32) | x; unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((pool >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
struct EmuWarp { EmuBarrier* bar; unsigned long long slot[64]; unsigned frag[64][6]; };
extern EmuWarp* emu_warps;
void __syncthreads();
template <class T> static inline T emu_shfl(T v, int src) {
    const int lane = threadIdx.x % EMU_WARP; EmuWarp& w = emu_warps[threadIdx.x / EMU_WARP];
    unsigned long long u = 0; std::memcpy(&u, &v, sizeof(T)); w.slot[lane] = u;
    w.bar->arrive_and_wait();
    unsigned long long r = w.slot[src]; T out; std::memcpy(&out, &r, sizeof(T));
    w.bar->arrive_and_wait();
    return out;
}
#define EMU_LANE (int)(threadIdx.x % EMU_WARP)
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m, int = 32) { return emu_shfl(v, EMU_LANE ^ m); }
template <class T> static inline T __shfl_down_sync(unsigned, T v, int d, int = 32) { return emu_shfl(v, EMU_LANE + d < EMU_WARP ? EMU_LANE + d : EMU_LANE); }
template <class T> static inline T __shfl_sync(unsigned, T v, int s, int = 32) { return emu_shfl(v, s); }
template <class T> static inline T __shfl_xor(T v, int m, int = 64) { return emu_shfl(v, EMU_LANE ^ m); }
template <class T> static inline T __shfl_down(T v, int d, int = 64) { return emu_shfl(v, EMU_LANE + d < EMU_WARP ? EMU_LANE + d : EMU_LANE); }
template <class T> static inline T __shfl(T v, int s, int = 64) { return emu_shfl(v, s); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warps[threadIdx.x / EMU_WARP].bar->arrive_and_wait(); }
static inline int __any_sync(unsigned, int p) {
    const int lane = EMU_LANE; EmuWarp& w = emu_warps[threadIdx.x / EMU_WARP];
    w.slot[lane] = p != 0; w.bar->arrive_and_wait();
    int any = 0; for (int i = 0; i < EMU_WARP; ++i) any |= (int)w.slot[i];
    w.bar->arrive_and_wait();
    return any;
}
// Warp-matrix operations (prelude.h's "warp matrix" section, under HS_EMU_WARP_MATRIX): mma.sync and
// ldmatrix at warp 32 with the PTX ISA's fragment layouts, MFMA at warp 64 with the CDNA ISA's. Every
// lane posts its registers in the warp's buffer, then computes its own result from the whole matrix, as
// the hardware's lanes together do.
static inline float emu_half_bits(unsigned h, bool bf16) {
    if (bf16) return __uint_as_float(h << 16);
    const unsigned sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
    if (em >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u) return __uint_as_float(sign | ((em << 13) + 0x38000000u));
    const float f = (float)em * 5.9604644775390625e-08f;   // subnormal: em * 2^-24, exact
    return sign ? -f : f;
}
// Element (r, c) of a matrix held as 16-bit pairs: `reg` the register index, `lane` its owner.
static inline float emu_frag_elem(EmuWarp& w, int lane, int reg, int c, bool bf16) {
    return emu_half_bits((w.frag[lane][reg] >> (16 * (c & 1))) & 0xffffu, bf16);
}
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d (4 floats, in and out: the C operand), a (4
// registers of A 16 x 16), b (2 registers of B 16 x 8). A product of two 16-bit values is exact in
// float32 (11 + 11 significant bits); each d element adds its 16 products to c in k order, in float32.
static inline void emu_mma_m16n8k16(float* d, const unsigned* a, const unsigned* b, bool bf16) {
    const int lane = EMU_LANE; EmuWarp& w = emu_warps[threadIdx.x / EMU_WARP];
    for (int i = 0; i < 4; ++i) w.frag[lane][i] = a[i];
    for (int i = 0; i < 2; ++i) w.frag[lane][4 + i] = b[i];
    w.bar->arrive_and_wait();
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i / 2), n = 2 * t + (i % 2);
        float acc = d[i];
        for (int k = 0; k < 16; ++k) {
            // A[r][k]: lane (r % 8) * 4 + (k % 8) / 2, register r / 8 + 2 * (k / 8); B[k][n]: lane n * 4 +
            // (k % 8) / 2, register 4 + k / 8; the element's half is k % 2 in both
            const float av = emu_frag_elem(w, (r % 8) * 4 + (k % 8) / 2, r / 8 + 2 * (k / 8), k, bf16);
            const float bv = emu_frag_elem(w, n * 4 + (k % 8) / 2, 4 + k / 8, k, bf16);
            acc = std::fma(av, bv, acc);
        }
        d[i] = acc;
    }
    w.bar->arrive_and_wait();
}
// MI200's (CDNA2, gfx90a: the target warp 64 emulates) f16 and bf16 MFMA instructions flush subnormal
// input and output values to zero (AMD's note, which PyTorch's documentation of "reduced precision
// FP16 and BF16 GEMMs and convolutions on AMD Instinct MI200 devices" repeats): an A or B element
// below the 16-bit type's least normal (2^-14 for f16) is read as a zero of its sign, and a result
// below float32's (2^-126) is written as one. mma.sync keeps subnormals (the PTX ISA), and so does
// emu_mma_m16n8k16.
static inline float emu_frag_elem_ftz(EmuWarp& w, int lane, int reg, int c, bool bf16) {
    const unsigned h = (w.frag[lane][reg] >> (16 * (c & 1))) & 0xffffu;
    if ((h & (bf16 ? 0x7f80u : 0x7c00u)) == 0) return (h & 0x8000u) ? -0.0f : 0.0f;
    return emu_half_bits(h, bf16);
}
static inline float emu_ftz(float x) { return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.0f, x) : x; }
// v_mfma_f32_16x16x16{f16,bf16_1k} at wavefront 64: d (4 floats, in and out: the C operand), a and b (2
// registers each). With i = lane % 16 and q = lane / 16, lane l holds A[i][4q..4q+3], B[4q..4q+3][i] (k
// in order, two per register, the lower k in the low half) and C[4q..4q+3][i]. As for mma.sync: exact
// products, each d element adding its 16 products to c in k order in float32; subnormal inputs (c
// included) and results flushed to zero (above).
static inline void emu_mfma_16x16x16(float* d, const unsigned* a, const unsigned* b, bool bf16) {
    const int lane = EMU_LANE; EmuWarp& w = emu_warps[threadIdx.x / EMU_WARP];
    for (int i = 0; i < 2; ++i) { w.frag[lane][i] = a[i]; w.frag[lane][2 + i] = b[i]; }
    w.bar->arrive_and_wait();
    const int n = lane % 16, q = lane / 16;
    for (int i = 0; i < 4; ++i) {
        const int r = 4 * q + i;
        float acc = emu_ftz(d[i]);
        for (int k = 0; k < 16; ++k) {
            // A[r][k]: lane r + 16 (k / 4), register (k % 4) / 2; B[k][n]: lane n + 16 (k / 4), register
            // 2 + (k % 4) / 2; the element's half is k % 2 in both
            const float av = emu_frag_elem_ftz(w, r + 16 * (k / 4), (k % 4) / 2, k, bf16);
            const float bv = emu_frag_elem_ftz(w, n + 16 * (k / 4), 2 + (k % 4) / 2, k, bf16);
            acc = std::fma(av, bv, acc);
        }
        d[i] = emu_ftz(acc);
    }
    w.bar->arrive_and_wait();
}
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8i + j gives the address of row j of matrix i.
static inline void emu_ldmatrix_x4(unsigned* r, const void* row, bool trans) {
    const int lane = EMU_LANE; EmuWarp& w = emu_warps[threadIdx.x / EMU_WARP];
    w.slot[lane] = (unsigned long long)row;
    w.bar->arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        unsigned short lo, hi;
        if (!trans) {
            const unsigned short* p = (const unsigned short*)w.slot[8 * i + lane / 4];
            lo = p[2 * (lane % 4)]; hi = p[2 * (lane % 4) + 1];
        } else {
            lo = ((const unsigned short*)w.slot[8 * i + 2 * (lane % 4)])[lane / 4];
            hi = ((const unsigned short*)w.slot[8 * i + 2 * (lane % 4) + 1])[lane / 4];
        }
        r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
    w.bar->arrive_and_wait();
}
extern unsigned char* emu_dyn_smem;
"""

LAUNCHER = r"""
dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
EmuWarp* emu_warps;
unsigned char* emu_dyn_smem;
static EmuBarrier* emu_block_bar;
struct EmuSmemFree { void operator()(unsigned char* p) const { ::operator delete(p, std::align_val_t(16)); } };
// One fiber per thread of the block; each walks the grid's blocks in order, as each OS thread did.
static const size_t EMU_STACK = 256 << 10;
// The switch itself: on x86-64 the six callee-saved registers and the stack pointer (glibc's
// swapcontext also saves the signal mask, a system call at every switch: a quarter of a racecheck run);
// elsewhere ucontext.
#if defined(__x86_64__)
struct EmuCtx { void* sp; };
extern "C" void emu_ctx_switch(void** save, void* to);
asm(".text\n.globl emu_ctx_switch\n.type emu_ctx_switch,@function\nemu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");
static inline void emu_ctx_swap(EmuCtx& from, EmuCtx& to) { emu_ctx_switch(&from.sp, to.sp); }
static inline void emu_ctx_make(EmuCtx& c, unsigned char* stack, size_t size, void (*entry)()) {
    // as if emu_ctx_switch had saved it: six registers, then `entry` as the address its ret goes to,
    // placed so that the stack is 16-byte aligned at the call boundary
    void** top = (void**)(((uintptr_t)(stack + size) & ~(uintptr_t)15) - 16);
    top[0] = (void*)entry; top[1] = nullptr;
    for (int i = 1; i <= 6; ++i) top[-i] = nullptr;
    c.sp = top - 6;
}
#else
struct EmuCtx { ucontext_t uc; };
static inline void emu_ctx_swap(EmuCtx& from, EmuCtx& to) { swapcontext(&from.uc, &to.uc); }
static inline void emu_ctx_make(EmuCtx& c, unsigned char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack; c.uc.uc_stack.ss_size = size; c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif
struct EmuFiber {
    EmuCtx ctx; unsigned char* stack = nullptr; void* tsan = nullptr;
    unsigned tid = 0; dim3 block; const EmuBarrier* bar = nullptr; unsigned gen = 0; bool done = false;
};
static struct {
    EmuCtx main; void* main_tsan = nullptr; const void* main_bottom = nullptr; size_t main_size = 0;
    EmuFiber* f = nullptr; unsigned cur = 0;
    void (*thunk)(void**) = nullptr; void** params = nullptr;
    char start_sync, end_sync;   // the launching thread's writes before the kernel, the kernel's after
} emu_s;
// A fiber gives the CPU back to the launcher (at a barrier, or done for good).
EMU_UNCHECKED static void emu_yield(bool finished) {
    EmuFiber& f = emu_s.f[emu_s.cur];
#ifdef EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, emu_s.main_bottom, emu_s.main_size);
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(emu_s.main_tsan, __tsan_switch_to_fiber_no_sync);
#endif
    emu_ctx_swap(f.ctx, emu_s.main);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}
EMU_UNCHECKED void EmuBarrier::arrive_and_wait() {
    const unsigned g = gen;
#ifdef EMU_TSAN
    __tsan_release(&sync[g & 1]);
#endif
    if (++arrived == n) {
        arrived = 0;
        gen = g + 1;
    } else {
        EmuFiber& f = emu_s.f[emu_s.cur];
        f.bar = this; f.gen = g;
        emu_yield(false);
        f.bar = nullptr;
    }
#ifdef EMU_TSAN
    __tsan_acquire(&sync[g & 1]);
#endif
}
EMU_UNCHECKED static void emu_fiber_main() {
    EmuFiber& f = emu_s.f[emu_s.cur];
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &emu_s.main_bottom, &emu_s.main_size);
#endif
#ifdef EMU_TSAN
    __tsan_acquire(&emu_s.start_sync);
#endif
    for (unsigned z = 0; z < gridDim.z; ++z) for (unsigned y = 0; y < gridDim.y; ++y) for (unsigned x = 0; x < gridDim.x; ++x) {
        f.block = blockIdx = dim3{x, y, z};
        emu_s.thunk(emu_s.params);
        emu_block_bar->arrive_and_wait();  // the next block reuses the static shared memory
    }
#ifdef EMU_TSAN
    __tsan_release(&emu_s.end_sync);
#endif
    f.done = true;
    emu_yield(true);
}
EMU_UNCHECKED static void emu_resume(unsigned i) {
    EmuFiber& f = emu_s.f[i];
    emu_s.cur = i; threadIdx = dim3{f.tid, 0, 0}; blockIdx = f.block;
#ifdef EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, EMU_STACK);
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(f.tsan, __tsan_switch_to_fiber_no_sync);
#endif
    emu_ctx_swap(emu_s.main, f.ctx);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}
// Runs every fiber to its end: each pass resumes those whose barrier has opened, in an order that turns
// from pass to pass (forwards from one thread, backwards from another), so an unsynchronised read meets
// its write on either side of it across a test's launches. 2: every thread left waits at a barrier that
// the rest never reach (a divergent __syncthreads, which hangs a GPU).
EMU_UNCHECKED static int emu_run(unsigned n) {
    static unsigned turn = 0;
    for (unsigned left = n; left;) {
        const unsigned off = (turn * 37u) % n, back = turn++ & 1;
        bool ran = false;
        for (unsigned k = 0; k < n; ++k) {
            const unsigned i = back ? (off + n - k) % n : (off + k) % n;
            EmuFiber& f = emu_s.f[i];
            if (f.done || (f.bar && f.bar->gen == f.gen)) continue;
            emu_resume(i);
            ran = true;
            if (f.done) --left;
        }
        if (!ran) return 2;
    }
    return 0;
}
void __syncthreads() { emu_block_bar->arrive_and_wait(); }
// Each kernel's parameters as the build saw them (emu_params_<kernel>: count, then a kind and a size
// per parameter; kind 'p' pointer, 'f' floating, 'i'/'u' signed/unsigned integer, 'b' anything else),
// for callers that hold only a `void **kernelParams` (EmuRuntime.param_types).
template <class T> constexpr unsigned char emu_param_kind() {
    using U = std::remove_cv_t<T>;
    return std::is_pointer_v<U> ? 'p' : std::is_floating_point_v<U> ? 'f'
         : (std::is_integral_v<U> || std::is_enum_v<U>) ? (std::is_signed_v<U> ? 'i' : 'u') : 'b';
}
extern "C" int emu_launch(void (*thunk)(void**), void** params, unsigned gx, unsigned gy, unsigned gz,
                          unsigned bx, unsigned by, unsigned bz, unsigned shared) {
    if (by != 1 || bz != 1 || bx % EMU_WARP) return 1;  // 1-D blocks of whole warps only
    gridDim = dim3{gx, gy, gz}; blockDim = dim3{bx, by, bz};
    // exactly `shared` bytes (16-aligned, as the device gives): ASan reports an overrun of dynamic shared
    std::unique_ptr<unsigned char, EmuSmemFree> smem((unsigned char*)::operator new(shared, std::align_val_t(16)));
    emu_dyn_smem = smem.get();
    const int nw = bx / EMU_WARP;
    std::vector<EmuWarp> warps(nw); std::vector<std::unique_ptr<EmuBarrier>> bars;
    for (int i = 0; i < nw; ++i) { bars.emplace_back(new EmuBarrier(EMU_WARP)); warps[i].bar = bars.back().get(); }
    emu_warps = warps.data();
    EmuBarrier block_bar(bx); emu_block_bar = &block_bar;
    // the fibers' stacks are kept from launch to launch (mapped on first use, touched only as deep as
    // the kernel goes)
    static std::vector<EmuFiber> fibers;
    if (fibers.size() < bx) fibers.resize(bx);
    emu_s.f = fibers.data(); emu_s.thunk = thunk; emu_s.params = params;
#ifdef EMU_TSAN
    emu_s.main_tsan = __tsan_get_current_fiber();
    __tsan_release(&emu_s.start_sync);
#endif
    for (unsigned t = 0; t < bx; ++t) {
        EmuFiber& f = fibers[t];
        if (!f.stack) {
            void* p = mmap(nullptr, EMU_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) return 3;
            f.stack = (unsigned char*)p;
        }
        f.tid = t; f.block = dim3{0, 0, 0}; f.bar = nullptr; f.done = false;
        emu_ctx_make(f.ctx, f.stack, EMU_STACK, emu_fiber_main);
#ifdef EMU_TSAN
        f.tsan = __tsan_create_fiber(0);
#endif
    }
    const int rc = emu_run(bx);
#ifdef EMU_TSAN
    for (unsigned t = 0; t < bx; ++t) { __tsan_destroy_fiber(fibers[t].tsan); fibers[t].tsan = nullptr; }
    __tsan_acquire(&emu_s.end_sync);
#endif
    return rc;
}
"""

# Kernels are found after preprocessing, with __global__ spelled as this marker, so kernels a macro
# stamps out (hs_attention_d##D) are seen with their real names and parameter lists.
_MARK = "__hs_emu_kernel__"
_KERNEL = re.compile(_MARK + r"\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
                     r"(\w+)\s*\(([^)]*)\)")


_AVAILABLE: list[bool] = []


def available() -> bool:
    """Whether g++ is there and compiles C++20 (the shim's std::atomic_ref). Where tools are
    required (HIPSCHED_REQUIRE_TOOLS, set by CI) a missing or too old g++ raises instead: every module
    gated on this would otherwise report its tests skipped and the run would pass without them."""
    if not _AVAILABLE:
        ok = shutil.which("g++") is not None
        if ok:
            r = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-x", "c++", "-"],
                               input="#include <atomic>\nint main(){int x=0; std::atomic_ref<int>(x).store(1);}\n",
                               capture_output=True, text=True)
            ok = r.returncode == 0
        _AVAILABLE.append(ok)
    if not _AVAILABLE[0] and requires.tools_required():
        raise RuntimeError("the kernel emulator needs g++ with C++20 (Debian: apt-get install g++), and "
                           "HIPSCHED_REQUIRE_TOOLS is set: its tests must run, not skip")
    return _AVAILABLE[0]


# Memcheck and racecheck: HIPSCHED_EMU_SANITIZE=address builds every kernel with AddressSanitizer and
# UBSan (device allocations are exact-size heap blocks, so one element past the end is a report; UBSan
# checks float4 alignment and static array bounds), =thread with ThreadSanitizer (two threads of a block
# touching the same shared or global word, one writing, with no __syncthreads or warp barrier between,
# is a report). A finding ends the process (halt on error) so it cannot be lost behind a CPU fallback;
# the instrumented code only loads into a process that started with the sanitizer's runtime: run
# pytest under sanitizer_env(kind), or see docs/design/emulator-and-proof.md for the command.
SANITIZERS = ("address", "thread")
_SANITIZE_FLAGS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "thread": ["-fsanitize=thread"],
}
_SANITIZE_RUNTIME = {"address": "libasan.so", "thread": "libtsan.so"}
_SANITIZE_INIT = {"address": "__asan_init", "thread": "__tsan_init"}
# abort (not exit) so pytest's faulthandler names the test; Python's own allocations are not leaks to us
_SANITIZE_OPTIONS = {
    "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:abort_on_error=1",
    "TSAN_OPTIONS": "halt_on_error=1:abort_on_error=1",
}


def sanitize_from_env() -> str | None:
    kind = os.environ.get("HIPSCHED_EMU_SANITIZE", "").strip().lower() or None
    if kind not in (None,) + SANITIZERS:
        raise ValueError(f"HIPSCHED_EMU_SANITIZE={kind!r}: expected one of {SANITIZERS} or empty")
    return kind


def sanitizer_runtime(kind: str) -> str:
    """Path of g++'s runtime library for `kind` (what LD_PRELOAD must name)."""
    r = subprocess.run(["g++", f"-print-file-name={_SANITIZE_RUNTIME[kind]}"], capture_output=True, text=True)
    return r.stdout.strip()


def sanitizer_env(kind: str, base=None) -> dict:
    """Environment for a child process whose emulated kernels run under `kind`: the runtime preloaded,
    the options above (a value already in `base` is kept in front, where the later option wins)."""
    env = dict(os.environ if base is None else base)
    env["HIPSCHED_EMU_SANITIZE"] = kind
    env["LD_PRELOAD"] = sanitizer_runtime(kind)
    for var, opts in _SANITIZE_OPTIONS.items():
        env[var] = opts + (":" + env[var] if env.get(var) else "")
    if kind == "thread":
        # a test's float64 reference product (NumPy's OpenBLAS) large enough to be split over OpenBLAS's
        # threads is reported as a race: TSan does not see that library's own synchronisation
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def sanitizer_loaded(kind: str) -> bool:
    return hasattr(ctypes.CDLL(None), _SANITIZE_INIT[kind])


def require_sanitizer_runtime(kind: str | None) -> None:
    """Raise unless this process can load code built for `kind` (building it needs no runtime): a dlopen
    of an instrumented .so into a process without the runtime aborts it, with no hint why."""
    if kind and not sanitizer_loaded(kind):
        raise RuntimeError(f"kernel emulator with sanitize={kind!r} needs its runtime loaded at process "
                           f"start: LD_PRELOAD={sanitizer_runtime(kind)} (see gpu_emulator.sanitizer_env)")


def _param_types(signature: str) -> list[str]:
    return [re.match(r"(.*?)\w+$", p.strip()).group(1).strip() for p in signature.split(",") if p.strip()]


if sanitize_from_env() == "address":
    # The glue's scratch buffers are kept per stream and reused when large enough (256 bytes at least), so
    # a kernel overrunning a temporary would land in the slack; under memcheck each is its own exact-size
    # allocation instead. Only the sanitizer steps set the variable, so scratch reuse is tested elsewhere.
    import hipsched.gpu.launch.context
    hipsched.gpu.launch.context.SCRATCH_KEEP_BYTES = -1

_BUILT: dict[tuple, bytes] = {}
_GXX_VERSION: list[str] = []


def _gxx_version() -> str:
    if not _GXX_VERSION:
        _GXX_VERSION.append(subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout)
    return _GXX_VERSION[0]


class EmuCompiler(Compiler):
    name = "emu-g++"

    def __init__(self, warp: int, sanitize: str | None = None):
        self.warp = warp
        self.platform = "amd" if warp == 64 else "nvidia"
        self.sanitize = sanitize_from_env() if sanitize is None else (sanitize or None)
        if self.sanitize not in (None,) + SANITIZERS:
            raise ValueError(f"sanitize={sanitize!r}: expected one of {SANITIZERS}")

    def version(self) -> str:
        text = SHIM + LAUNCHER + str(self.warp) + " ".join(self._flags())
        return "emu-" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def _flags(self) -> list[str]:
        # -g: sanitizer reports name the .hip file and line (the body keeps the preprocessor's line markers)
        return _SANITIZE_FLAGS[self.sanitize] + ["-g"] if self.sanitize else []

    def supports(self, arch: str) -> bool:
        return True

    def compile(self, source, name, arch, options=()):
        # tests build a runtime (and a kernel cache directory) per module or per test; a sanitized build of
        # a source takes several seconds, so each distinct build is made once per process
        key = (self.version(), source, name)
        if key not in _BUILT:
            _BUILT[key] = self._stored_build(source, name)
        return _BUILT[key]

    def _stored_build(self, source, name):
        # .ci/run's emulator steps are processes of their own after the test step, and the asynchronous
        # one loads the very builds that step made (every source for warp 32 and 64: about 35 s of g++ on
        # 2 cores). HIPSCHED_EMU_BUILD_CACHE names a directory that keeps each build under a hash of all
        # that goes into it; unset (a plain pytest run), every process builds its own.
        where = os.environ.get("HIPSCHED_EMU_BUILD_CACHE")
        if not where:
            return self._compile(source, name)
        digest = hashlib.sha256("\x1f".join((self.version(), _gxx_version(), name, source)).encode()).hexdigest()
        path = os.path.join(where, f"{digest}.so")
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            pass
        image = self._compile(source, name)
        os.makedirs(where, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(image)
        os.replace(tmp, path)  # whole or absent, for a process reading it at the same time
        return image

    def _compile(self, source, name):
        vendor = "#define __HIP__ 1\n#define __AMDGCN_WAVEFRONT_SIZE 64\n" if self.warp == 64 else ""
        # the CPU has neither PTX's cvt nor (portably) _Float16: prelude.h's integer conversions, which
        # round as the hardware instructions do
        vendor += "#define HS_SOFT_HALF 1\n"
        # prelude.h's warp-matrix operations (mma, ldmatrix, cp.async) as the shim's emu_* functions
        vendor += "#define HS_EMU_WARP_MATRIX 1\n"
        with tempfile.TemporaryDirectory(prefix="hs_emu_") as d:
            # kernels.py sources are the prelude, then `#line 1 "<file>"` and the file
            first = "prelude.h" if '\n#line 1 "' in source else name
            text = vendor + f"#define __global__ {_MARK}\n#line 1 \"{first}\"\n" + source
            source = self._preprocess(text, name, d)
            # line markers kept in the body so diagnostics point into the .hip source, not a temp file
            body = self._preprocess(text, name, d, markers=True) if self.sanitize else source
            # the dynamic shared buffer is per launch; every kernel gets a thunk taking kernelParams
            body = re.sub(r"extern __shared__ (\w+) (\w+)\[\];", r"\1* \2 = (\1*)emu_dyn_smem;", body)
            thunks = []
            for kernel, sig in _KERNEL.findall(source):
                types = _param_types(sig)
                args = ", ".join(f"*({t}*)p[{i}]" for i, t in enumerate(types))
                thunks.append(f'extern "C" void emu_{kernel}(void** p) {{ {kernel}({args}); }}')
                codes = "".join(f", emu_param_kind<{t}>(), (unsigned char)sizeof({t})" for t in types)
                thunks.append(f'extern "C" const unsigned char emu_params_{kernel}[] = {{{len(types)}{codes}}};')
            text = (f"#define EMU_WARP {self.warp}\n{SHIM}\n#define {_MARK}\n{body}\n"
                    f"#line 1 \"gpu_emulator.LAUNCHER\"\n{LAUNCHER}\n"
                    + "\n".join(thunks) + "\n")
            cpp, so = os.path.join(d, "k.cpp"), os.path.join(d, "k.so")
            with open(cpp, "w") as f:
                f.write(text)
            r = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", *self._flags(),
                                cpp, "-o", so], capture_output=True, text=True)
            if r.returncode:
                raise GpuError("compile", f"{name}: {r.stderr[-3000:]}")
            with open(so, "rb") as f:
                return f.read()


    @staticmethod
    def _preprocess(text, name, d, markers=False):
        src = os.path.join(d, "pre.cpp")
        with open(src, "w") as f:
            f.write(text)
        r = subprocess.run(["g++", "-std=c++20", "-E", *([] if markers else ["-P"]), "-x", "c++", src],
                           capture_output=True, text=True)
        if r.returncode:
            raise GpuError("compile", f"{name}: {r.stderr[-3000:]}")
        return r.stdout


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

# Every byte 0xFF: float32/float64 NaN, integers -1. Freed and never-written memory reads as this.
_POISON = 0xFF


def _nothing():
    pass


# (kind, size) of a kernel parameter (LAUNCHER's emu_param_kind) -> the ctypes scalar that holds it; a
# parameter of another kind ('b') travels as the unsigned integer of its size, bit for bit
_PARAM_CTYPES = {("p", ctypes.sizeof(ctypes.c_void_p)): ctypes.c_void_p, ("f", 4): ctypes.c_float,
                 ("f", 8): ctypes.c_double, ("i", 1): ctypes.c_int8, ("i", 2): ctypes.c_int16,
                 ("i", 4): ctypes.c_int32, ("i", 8): ctypes.c_int64, ("u", 1): ctypes.c_uint8,
                 ("u", 2): ctypes.c_uint16, ("u", 4): ctypes.c_uint32, ("u", 8): ctypes.c_uint64}


class _Op:
    """One queued piece of work; `done` is set once it ran (or failed), `t` is when."""
    __slots__ = ("fn", "what", "deps", "done", "t")

    def __init__(self, fn, what):
        self.fn, self.what, self.deps = fn, what, []
        self.done = threading.Event()
        self.t = None


class _Stream:
    """A stream of the asynchronous emulator: a FIFO its own worker thread runs in order."""

    def __init__(self, handle: int, blocking: bool):
        self.handle, self.blocking = handle, blocking
        self.queue = queue.SimpleQueue()   # put() is reentrant: frees arrive from finalizers
        self.tail = None                   # the last _Op queued
        self.thread = None

    def start(self, rt) -> None:
        self.thread = threading.Thread(target=rt._worker, args=(self,), daemon=True,
                                       name=f"emu-stream-{self.handle:#x}")
        self.thread.start()


class EmuRuntime(Runtime):
    """Runtime on the CPU: `devices` devices (one by default) whose "memory" is the host heap.

    Synchronous by default: every call has finished when it returns. asynchronous=True (default:
    HIPSCHED_EMU_ASYNC set and not 0) makes it behave like a driver that queues: each stream is a worker
    thread running its work in order, each item `delay` seconds late (HIPSCHED_EMU_DELAY, 1 ms by
    default), so host code that reads a result without waiting, or frees memory that queued work still
    reads, fails every time instead of passing by luck. What it models, after the CUDA/HIP documents:
    - launch, memset, memcpy_dtod and memcpy_dtoh are queued. memcpy_htod copies the host bytes at the
      call (pageable memory is staged before the call returns) and writes the device in stream order.
      memcpy_dtoh writes the host buffer only when the stream gets there: the bindings call the *Async
      copy and then synchronise, and to pageable memory the drivers "might" block, so nothing may rely
      on it;
    - stream 0 is the legacy default stream: its work waits for all earlier work of blocking streams and
      theirs for its. stream_create() makes non-blocking streams, as the bindings do (blocking=True
      makes a blocking one); a handle it never made (another library's stream) is non-blocking;
    - event_record queues a marker, stream_wait_event makes the stream's worker wait for the marker
      recorded last; event_query, event_synchronize, stream_synchronize and synchronize observe or wait;
    - free() poisons and releases at once, as a driver that does not synchronise may; free_async() does
      so when its stream reaches it.
    kernel_seconds: every kernel takes at least that long on its stream (a device slower than this
    machine's CPU, where a test needs one: the emulator itself runs a small kernel in well under a
    millisecond).
    Memcheck (both modes): new and freed memory is poisoned (0xFF: NaN, -1), freed blocks stay in a
    quarantine (quarantine_bytes, oldest released first; 0 under AddressSanitizer, which keeps its own)
    so a kernel argument, copy or memset touching one, a double free, or work on a destroyed stream is
    found. A finding is kept in `memcheck_errors`, fails every later call as a sticky device error
    would (GpuError kind "lost"), and close() raises AssertionError, so a CPU fallback cannot hide it."""

    name = "emu"

    def __init__(self, warp: int = 32, sanitize: str | None = None, *, asynchronous: bool | None = None,
                 delay: float | None = None, quarantine_bytes: int | None = None, devices: int = 1,
                 kernel_seconds: float = 0.0):
        self.compiler = EmuCompiler(warp, sanitize)  # sanitize None: HIPSCHED_EMU_SANITIZE decides
        require_sanitizer_runtime(self.compiler.sanitize)
        self.platform = self.compiler.platform
        self.warp = warp
        self._libs, self._fns, self._files = [], {}, []
        self._names: dict[int, str] = {}
        if asynchronous is None:
            asynchronous = os.environ.get("HIPSCHED_EMU_ASYNC", "0").strip() not in ("", "0")
        self.asynchronous = bool(asynchronous)
        if delay is None:
            delay = float(os.environ.get("HIPSCHED_EMU_DELAY", "0.001")) if self.asynchronous else 0.0
        self.delay = float(delay)
        self.kernel_seconds = float(kernel_seconds)
        if quarantine_bytes is None:
            quarantine_bytes = 0 if getattr(self.compiler, "sanitize", None) == "address" else 64 << 20
        self.quarantine_bytes = int(quarantine_bytes)
        # RLock: free() also arrives from finalizers, which the collector may run on a thread holding it
        self._lock = threading.RLock()
        self._exec_lock = threading.Lock()          # taken by whoever runs a kernel, never by a finalizer
        self.live: dict[int, int] = {}              # pointer -> bytes
        self._freed: dict[int, int] = {}            # quarantine, oldest first: pointer -> bytes
        self._starts: list[int] = []                # the quarantine's pointers, sorted
        self._quarantined = 0
        self.memcheck_errors: list[str] = []
        self._sticky = None
        self._handles = itertools.count(0x1000)     # streams and events: distinct, never 0, 1 or 2
        self._running = threading.Event()           # cleared by held(): queued work waits
        self._running.set()
        self._streams: dict[int, _Stream] = {}
        self._destroyed: set[int] = set()
        self._events: dict[int, _Op | None] = {}
        self.devices = int(devices)
        self._device = 0
        # which device made each allocation, kernel and stream (shared by the for_device views): what a
        # driver double that refuses another device's pointers, functions and streams reads (emu_c_driver)
        self._owner: dict[int, int] = {}            # allocation base -> device
        self._live_starts: list[int] = []           # live allocations' bases, sorted
        self._fn_device: dict[int, int] = {}
        self._stream_device: dict[int, int] = {}

    # `devices` devices of one kind: views from Runtime.for_device share this object's heap, streams,
    # quarantine and kernels, as devices in one process share a driver and a unified address space
    def device_count(self): return self.devices
    def set_device(self, index): self._device = int(index)
    def mem_info(self): return (1 << 31, 1 << 32)

    def c_entry_points(self):
        """The C driver double's table for this view's device (tests/support/emu_c_driver.py attaches
        one), or None: the emulator alone offers no C entry points."""
        st = self.__dict__.get("_emu_c")
        return None if st is None else st.entry_points(self.current_device())

    def device_of(self, ptr: int) -> int | None:
        """The device whose allocation holds `ptr`, or None for memory no device made (host memory)."""
        with self._lock:
            i = bisect.bisect_right(self._live_starts, ptr) - 1
            if i >= 0:
                base = self._live_starts[i]
                if ptr < base + self.live.get(base, 0):
                    return self._owner.get(base)
        return None

    def device_info(self, index):
        return DeviceInfo(int(index), f"cpu-emulated-warp{self.warp}", "gfx90a" if self.warp == 64 else "sm_90",
                          1 << 32, self.platform, self.warp, 2)

    # ------------------------------------------------------------------ memcheck
    def _report(self, message: str) -> None:
        self.memcheck_errors.append(message)
        if self._sticky is None:
            self._sticky = GpuError("lost", f"emulator memcheck: {message}", name="hipErrorIllegalAddress")

    def _check_sticky(self) -> None:
        # like a device fault, a memcheck finding fails every later call, not only the one that saw it
        if self._sticky is not None:
            raise self._sticky

    def take_memcheck_errors(self) -> list[str]:
        """What memcheck recorded so far, cleared (with the sticky error): for tests that provoke it."""
        with self._lock:
            errors, self.memcheck_errors, self._sticky = self.memcheck_errors, [], None
        return errors

    def _freed_block(self, ptr: int, nbytes: int = 1):
        """Base of a freed (quarantined) block that [ptr, ptr + nbytes) touches, or None."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr + max(int(nbytes), 1) - 1) - 1
            if i >= 0:
                base = self._starts[i]
                if base + self._freed[base] > ptr:
                    return base
        return None

    def _check_range(self, what: str, ptr: int, nbytes: int) -> None:
        if ptr and nbytes > 0:
            base = self._freed_block(ptr, nbytes)
            if base is not None:
                self._report(f"{what}: {nbytes} bytes at {ptr:#x} touch freed block {base:#x}")

    # ------------------------------------------------------------------ memory
    def malloc(self, nbytes):
        self._check_sticky()
        n = max(int(nbytes), 1)
        ptr = _libc.malloc(n)
        if not ptr:
            raise GpuError("oom", f"emulator: malloc({n}) failed", name="hipErrorOutOfMemory")
        # what cudaMalloc returns is garbage: poisoned, a read of memory nothing wrote shows up as NaN / -1
        ctypes.memset(ptr, _POISON, n)
        with self._lock:
            self.live[ptr] = n
            self._owner[ptr] = self._device
            bisect.insort(self._live_starts, ptr)
        return ptr

    def _take_live(self, ptr: int, what: str) -> int:
        with self._lock:
            n = self.live.pop(ptr, None)
            known_freed = ptr in self._freed
            if n is not None:
                self._owner.pop(ptr, None)
                del self._live_starts[bisect.bisect_left(self._live_starts, ptr)]
        if n is None:
            self._report(f"{what} of {'an already freed' if known_freed else 'an unknown'} pointer {ptr:#x}")
            raise GpuError("runtime", f"emulator: {what}({ptr:#x}): not a live allocation",
                           name="hipErrorInvalidValue")
        return n

    def free(self, ptr):
        if not ptr:
            return
        self._release(ptr, self._take_live(ptr, "free"))

    def _release(self, ptr: int, nbytes: int) -> None:
        """Poison a block and give it back: to malloc at once when there is no quarantine (ASan then
        reports a later use itself), else after older freed blocks, so a use of it is a memcheck
        finding rather than a write into someone else's allocation."""
        ctypes.memset(ptr, _POISON, nbytes)
        if self.quarantine_bytes <= 0:
            _libc.free(ptr)
            return
        evicted = []
        with self._lock:
            self._freed[ptr] = nbytes
            bisect.insort(self._starts, ptr)
            self._quarantined += nbytes
            while self._quarantined > self.quarantine_bytes and self._freed:
                old = next(iter(self._freed))
                self._quarantined -= self._freed.pop(old)
                del self._starts[bisect.bisect_left(self._starts, old)]
                evicted.append(old)
        for old in evicted:
            _libc.free(old)

    def free_async(self, ptr, stream=0):
        """Stream-ordered free: poisoned and released when `stream` reaches it."""
        if not ptr:
            return
        with self._lock:
            known = ptr in self.live
        if not known:
            self._take_live(ptr, "free_async")   # reports and raises
        if not self.asynchronous:
            self.free(ptr)
            return
        self._submit(stream, lambda: self.free(ptr), "free_async")

    def memcpy_htod(self, dst, src, nbytes, stream=0):
        # pageable host memory is staged before the call returns: the caller may reuse its buffer at once
        data = ctypes.string_at(src, nbytes) if nbytes else b""

        def run():
            self._check_range("memcpy_htod", dst, nbytes)
            ctypes.memmove(dst, data, nbytes)
        self._submit(stream, run, "memcpy_htod")

    def memcpy_dtoh(self, dst, src, nbytes, stream=0):
        # the bindings use the *Async copy and synchronise afterwards; the host buffer is written only
        # when the stream gets here, so a missing synchronisation reads stale host memory
        def run():
            self._check_range("memcpy_dtoh", src, nbytes)
            ctypes.memmove(dst, src, nbytes)
        self._submit(stream, run, "memcpy_dtoh")

    def memcpy_dtod(self, dst, src, nbytes, stream=0):
        def run():
            self._check_range("memcpy_dtod source", src, nbytes)
            self._check_range("memcpy_dtod destination", dst, nbytes)
            ctypes.memmove(dst, src, nbytes)
        self._submit(stream, run, "memcpy_dtod")

    def memset(self, dst, value, nbytes, stream=0):
        def run():
            self._check_range("memset", dst, nbytes)
            ctypes.memset(dst, value, nbytes)
        self._submit(stream, run, "memset")

    # ------------------------------------------------------------------ streams and events
    def _stream(self, handle: int, what: str) -> _Stream:
        """The worker of `handle` (under self._lock). A handle this runtime never made is another
        library's stream: non-blocking, as PyTorch's are."""
        s = self._streams.get(handle)
        if s is None:
            if handle in self._destroyed:
                self._report(f"{what} on stream {handle:#x} after stream_destroy")
            s = self._streams[handle] = _Stream(handle, blocking=False)
            s.start(self)
        return s

    def _submit(self, stream, fn, what, wait_for=None) -> _Op:
        """Run `fn` as the next item of `stream`: now (synchronous mode) or on its worker."""
        self._check_sticky()
        stream = int(stream or 0)
        op = _Op(fn, what)
        if not self.asynchronous:
            if stream in self._destroyed:
                self._report(f"{what} on stream {stream:#x} after stream_destroy")
            self._execute(op)
            self._check_sticky()
            return op
        with self._lock:
            s = self._stream(stream, what)
            if wait_for is not None:
                op.deps.append(wait_for)
            legacy = self._stream(0, what)
            # the legacy default stream waits for all earlier work of blocking streams, and they for it
            if stream == 0:
                op.deps += [t.tail for t in self._streams.values() if t.blocking and t.tail is not None]
            elif s.blocking and legacy.tail is not None:
                op.deps.append(legacy.tail)
            s.tail = op
            s.queue.put(op)
        return op

    def _execute(self, op: _Op) -> None:
        try:
            op.fn()
        except GpuError as e:
            self._report(f"{op.what}: {e}")
        except Exception as e:   # a bug in the emulator must surface, not hang a waiter
            self._report(f"{op.what} raised {type(e).__name__}: {e}")
        finally:
            op.t = time.perf_counter()
            op.done.set()

    def _worker(self, s: _Stream) -> None:
        while True:
            op = s.queue.get()
            if op is None:
                return
            if self.delay:
                time.sleep(self.delay)
            self._running.wait()
            for dep in op.deps:
                dep.done.wait()
            self._execute(op)

    @contextlib.contextmanager
    def held(self):
        """Within it, no queued item runs (asynchronous mode): whatever returns there did not wait for
        its work, which a timed check could only say on a machine not too busy to keep up."""
        self._running.clear()
        try:
            yield
        finally:
            self._running.set()

    def stream_create(self, blocking: bool = False):
        """A new stream: non-blocking (CU_STREAM_NON_BLOCKING, what the bindings create) unless
        `blocking`, which orders it with the legacy default stream."""
        self._check_sticky()
        with self._lock:
            handle = next(self._handles)
            self._stream_device[handle] = self._device
            if self.asynchronous:
                s = self._streams[handle] = _Stream(handle, blocking)
                s.start(self)
        return handle

    def stream_destroy(self, stream):
        stream = int(stream or 0)
        if stream == 0:
            self._report("stream_destroy of the null stream")
            return
        with self._lock:
            self._destroyed.add(stream)
            s = self._streams.pop(stream, None)
        if s is not None:
            s.queue.put(None)   # the worker finishes what is queued first, as cudaStreamDestroy lets it

    def stream_synchronize(self, stream):
        # waits first, then reports: what the test sees afterwards is what the stream did
        stream = int(stream or 0)
        with self._lock:
            if stream in self._destroyed:
                self._report(f"stream_synchronize of destroyed stream {stream:#x}")
            s = self._streams.get(stream)
            tail = s.tail if s is not None else None
        if tail is not None:
            tail.done.wait()
        self._check_sticky()

    def synchronize(self):
        with self._lock:
            tails = [s.tail for s in self._streams.values() if s.tail is not None]
        for t in tails:
            t.done.wait()
        self._check_sticky()

    def event_create(self):
        self._check_sticky()
        with self._lock:
            handle = next(self._handles)
            self._events[handle] = None
        return handle

    def event_destroy(self, event):
        with self._lock:
            self._events.pop(event, None)

    def _event(self, event, what):
        with self._lock:
            if event not in self._events:
                self._report(f"{what} of unknown or destroyed event {event:#x}")
                return None
            return self._events[event]

    def event_record(self, event, stream=0):
        if event not in self._events:
            self._event(event, "event_record")
            return
        op = self._submit(stream, _nothing, "event_record")
        with self._lock:
            if event in self._events:
                self._events[event] = op

    def event_query(self, event) -> bool:
        self._check_sticky()
        op = self._event(event, "event_query")
        return op is None or op.done.is_set()

    def event_synchronize(self, event):
        op = self._event(event, "event_synchronize")
        if op is not None:
            op.done.wait()
        self._check_sticky()

    def event_elapsed_ms(self, start, end):
        a, b = self._event(start, "event_elapsed_ms"), self._event(end, "event_elapsed_ms")
        if a is None or b is None or not (a.done.is_set() and b.done.is_set()):
            raise GpuError("runtime", "emulator: event_elapsed_ms of an event not recorded or not complete",
                           name="hipErrorNotReady")
        return (b.t - a.t) * 1e3

    def stream_wait_event(self, stream, event):
        op = self._event(event, "stream_wait_event")
        if op is None:   # never recorded: nothing to wait for, as with the drivers
            return
        if self.asynchronous:
            self._submit(stream, _nothing, "stream_wait_event", wait_for=op)

    def enqueue(self, stream, fn, what: str = "host work") -> None:
        """Queue `fn()` as the next item of `stream`, run when the stream gets there (a fake device's
        kernel, in tests)."""
        self._submit(stream, fn, what)

    def stall(self, stream, seconds: float) -> None:
        """Queue `seconds` of busy time on `stream` (a long producer kernel, in tests)."""
        self._submit(stream, lambda: time.sleep(seconds), "stall")

    # ------------------------------------------------------------------ modules and launches
    def module_load(self, image):
        f = tempfile.NamedTemporaryFile(prefix="hs_emu_", suffix=".so", delete=False)
        f.write(image)
        f.close()
        self._files.append(f.name)
        self._libs.append(ctypes.CDLL(f.name))
        return len(self._libs) - 1

    def module_unload(self, module): pass

    def module_function(self, module, name):
        lib = self._libs[module]
        fn = ctypes.cast(getattr(lib, "emu_" + name), ctypes.c_void_p).value
        self._fns[fn] = lib
        self._names[fn] = name
        self._fn_device[fn] = self._device
        return fn

    def param_types(self, function) -> tuple:
        """The ctypes type of each parameter of the kernel `function` (a module_function handle), in
        order, from the descriptor its build records (LAUNCHER's emu_param_kind): what a caller holding
        only a kernelParams array needs to read the values."""
        known = self.__dict__.setdefault("_param_types", {})
        if function in known:
            return known[function]
        lib, name = self._fns[function], self._names[function]
        n = ctypes.c_ubyte.in_dll(lib, "emu_params_" + name).value
        raw = bytes((ctypes.c_ubyte * (1 + 2 * n)).in_dll(lib, "emu_params_" + name))[1:]
        types = []
        for kind, size in zip(raw[0::2], raw[1::2]):
            t = _PARAM_CTYPES.get((chr(kind), size)) or _PARAM_CTYPES.get(("u", size))
            if t is None:
                raise GpuError("launch", f"emulator: {name}: a {size}-byte kernel parameter has no ctypes scalar",
                               name="hipErrorInvalidValue")
            types.append(t)
        known[function] = tuple(types)
        return known[function]

    def launch(self, function, grid, block, args, shared_bytes=0, stream=0):
        grid, block = tuple(int(v) for v in grid), tuple(int(v) for v in block)
        # first what the emulated device's driver would refuse, with its error (tests/support/emu_limits.py)
        emu_limits.refuse(self.device_info(0).arch, self.platform, self._names.get(function), grid, block,
                          shared_bytes)
        if block[1] != 1 or block[2] != 1 or block[0] % self.warp:   # what emu_launch can run
            raise GpuError("launch", f"emulator: unsupported block shape {block}")
        lib, name = self._fns[function], self._names.get(function, hex(function))
        # the caller's ctypes objects may be gone or reused by the time the stream runs the kernel
        args = tuple(type(a)(a.value) for a in args)
        pointers = [a.value for a in args if isinstance(a, ctypes.c_void_p) and a.value]

        def run():
            freed = [p for p in pointers if self._freed_block(p) is not None]
            for p in freed:
                self._report(f"launch {name}: argument {p:#x} points into freed memory")
            params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
            dims = [ctypes.c_uint(v) for v in grid + block]
            # kernels of one module share its globals (gridDim, static __shared__): one launch at a time
            with self._exec_lock:
                rc = lib.emu_launch(ctypes.c_void_p(function), params, *dims, ctypes.c_uint(int(shared_bytes)))
            if rc == 2:
                raise GpuError("launch", f"emulator: {name}: threads of a block wait at a barrier the others never "
                                         "reach (a __syncthreads or warp operation under divergent control flow)")
            if rc:
                raise GpuError("launch", f"emulator: {name}: launch failed ({rc})")
            if self.kernel_seconds:
                time.sleep(self.kernel_seconds)
            for p in pointers:
                if p not in freed and self._freed_block(p) is not None:
                    self._report(f"launch {name}: argument {p:#x} was freed while the kernel ran")
        self._submit(stream, run, f"launch {name}")

    def close(self):
        """Finish queued work, stop the workers, unload; AssertionError if memcheck found anything."""
        if self.asynchronous:
            with self._lock:
                tails = [s.tail for s in self._streams.values() if s.tail is not None]
                streams = list(self._streams.values())
                self._streams.clear()
            for t in tails:
                t.done.wait()
            for s in streams:
                s.queue.put(None)
            for s in streams:
                s.thread.join()
            # frees from finalizers of arrays that outlive the runtime happen at once from here on
            self.asynchronous = False
        for path in self._files:
            try:
                os.unlink(path)
            except OSError:
                pass
        with self._lock:
            errors = list(self.memcheck_errors)
            quarantined, self._freed, self._starts, self._quarantined = list(self._freed), {}, [], 0
        for ptr in quarantined:
            _libc.free(ptr)
        if errors:
            raise AssertionError(f"emulator memcheck ({len(errors)}):\n" + "\n".join(errors[:20]))


def prelude_context(cache_dir: str, name: str, source: str, warp: int = 32):
    """(runtime, GpuContext) whose only kernel source is `name`: the kernels' prelude (kernels.prelude), then
    `source` (test kernels that call the prelude's own device functions, which no op exposes one by one),
    on the emulator."""
    from hipsched.gpu.compilation.kernels import KernelCache, prelude
    from hipsched.gpu.launch.context import GpuContext
    rt = EmuRuntime(warp)
    ctx = GpuContext(rt, cache_dir=cache_dir)
    ctx.cache = KernelCache(rt.compiler, ctx.cache.cache_dir, sources={name: prelude() + f'#line 1 "{name}"\n' + source})
    return rt, ctx


if __name__ == "__main__":
    # `python tests/support/gpu_emulator.py address|thread ARGS...` runs `python ARGS...` (e.g. -m pytest ...) with
    # every emulated kernel under that sanitizer: the one place that knows the preload and options.
    import sys
    if len(sys.argv) < 3 or sys.argv[1] not in SANITIZERS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(SANITIZERS)}}} PYTHON_ARGS...")
    args = sys.argv[2:]
    # pytest's default fd capture would swallow the report of a process that then aborts: capture only
    # Python's sys.stdout/err, so the sanitizer writes to the real stderr
    if args[:2] == ["-m", "pytest"] and not any(a == "-s" or a.startswith("--capture") for a in args):
        args[2:2] = ["--capture=sys"]
    os.execve(sys.executable, [sys.executable] + args, sanitizer_env(sys.argv[1]))
