"""A CPU executor for hipsched's HIP kernel sources, for tests only (never used by the package).

CI has no GPU, so compile checks alone would leave the kernels' logic (block reductions, shuffles,
multi-pass top-k, tails, warp 32 vs 64) untested. This runs the very same sources on the CPU: g++
compiles them after a shim that defines the HIP/CUDA kernel model, and a launch runs blockDim OS threads
that walk the grid's blocks in order. `__syncthreads` is a block-wide std::barrier and each warp's
shuffles go through a warp-wide barrier, so the code only passes if it is correct for any interleaving
the barriers allow. `__shared__` becomes `static` (blocks run one after another) and the dynamic
shared buffer is per launch. Device pointers are host pointers, so `EmuRuntime` implements the Runtime
interface with malloc and memmove. Slow (threads per block), so tests keep shapes small."""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from hipsched.errors import GpuError
from hipsched.gpu.runtime import Compiler, DeviceInfo, Runtime

SHIM = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
extern thread_local dim3 threadIdx, blockIdx;
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
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long pool = ((unsigned long long)y << 32) | x; unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((pool >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
struct EmuWarp { std::barrier<>* bar; unsigned long long slot[64]; };
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
extern unsigned char* emu_dyn_smem;
"""

LAUNCHER = r"""
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
EmuWarp* emu_warps;
unsigned char* emu_dyn_smem;
static std::barrier<>* emu_block_bar;
void __syncthreads() { emu_block_bar->arrive_and_wait(); }
extern "C" int emu_launch(void (*thunk)(void**), void** params, unsigned gx, unsigned gy, unsigned gz,
                          unsigned bx, unsigned by, unsigned bz, unsigned shared) {
    if (by != 1 || bz != 1 || bx % EMU_WARP) return 1;  // 1-D blocks of whole warps only
    gridDim = dim3{gx, gy, gz}; blockDim = dim3{bx, by, bz};
    std::vector<unsigned char> smem(shared + 16); emu_dyn_smem = smem.data();
    const int nw = bx / EMU_WARP;
    std::vector<EmuWarp> warps(nw); std::vector<std::unique_ptr<std::barrier<>>> bars;
    for (int i = 0; i < nw; ++i) { bars.emplace_back(new std::barrier<>(EMU_WARP)); warps[i].bar = bars.back().get(); }
    emu_warps = warps.data();
    std::barrier<> block_bar(bx); emu_block_bar = &block_bar;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < bx; ++t) threads.emplace_back([=, &block_bar] {
        threadIdx = dim3{t, 0, 0};
        for (unsigned z = 0; z < gz; ++z) for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x) {
            blockIdx = dim3{x, y, z};
            thunk(params);
            block_bar.arrive_and_wait();  // the next block reuses the static shared memory
        }
    });
    for (auto& t : threads) t.join();
    return 0;
}
"""

# Kernels are found after preprocessing, with __global__ spelled as this marker, so kernels a macro
# stamps out (hs_attention_d##D) are seen with their real names and parameter lists.
_MARK = "__hs_emu_kernel__"
_KERNEL = re.compile(_MARK + r"\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
                     r"(\w+)\s*\(([^)]*)\)")


def available() -> bool:
    return shutil.which("g++") is not None


def _param_types(signature: str) -> list[str]:
    return [re.match(r"(.*?)\w+$", p.strip()).group(1).strip() for p in signature.split(",") if p.strip()]


class EmuCompiler(Compiler):
    name = "emu-g++"

    def __init__(self, warp: int):
        self.warp = warp
        self.platform = "amd" if warp == 64 else "nvidia"

    def version(self) -> str:
        return "emu-" + hashlib.sha256((SHIM + LAUNCHER + str(self.warp)).encode()).hexdigest()[:16]

    def supports(self, arch: str) -> bool:
        return True

    def compile(self, source, name, arch, options=()):
        vendor = "#define __HIP__ 1\n#define __AMDGCN_WAVEFRONT_SIZE 64\n" if self.warp == 64 else ""
        with tempfile.TemporaryDirectory(prefix="hs_emu_") as d:
            source = self._preprocess(vendor + f"#define __global__ {_MARK}\n" + source, name, d)
            # the dynamic shared buffer is per launch; every kernel gets a thunk taking kernelParams
            body = re.sub(r"extern __shared__ (\w+) (\w+)\[\];", r"\1* \2 = (\1*)emu_dyn_smem;", source)
            thunks = []
            for kernel, sig in _KERNEL.findall(source):
                args = ", ".join(f"*({t}*)p[{i}]" for i, t in enumerate(_param_types(sig)))
                thunks.append(f'extern "C" void emu_{kernel}(void** p) {{ {kernel}({args}); }}')
            text = (f"#define EMU_WARP {self.warp}\n{SHIM}\n#define {_MARK}\n{body}\n{LAUNCHER}\n"
                    + "\n".join(thunks) + "\n")
            cpp, so = os.path.join(d, "k.cpp"), os.path.join(d, "k.so")
            with open(cpp, "w") as f:
                f.write(text)
            r = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", cpp, "-o", so],
                               capture_output=True, text=True)
            if r.returncode:
                raise GpuError("compile", f"{name}: {r.stderr[-3000:]}")
            with open(so, "rb") as f:
                return f.read()


    @staticmethod
    def _preprocess(text, name, d):
        src = os.path.join(d, "pre.cpp")
        with open(src, "w") as f:
            f.write(text)
        r = subprocess.run(["g++", "-std=c++20", "-E", "-P", "-x", "c++", src], capture_output=True, text=True)
        if r.returncode:
            raise GpuError("compile", f"{name}: {r.stderr[-3000:]}")
        return r.stdout


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]


class EmuRuntime(Runtime):
    """Runtime on the CPU: synchronous, one device whose 'memory' is the host heap."""

    name = "emu"

    def __init__(self, warp: int = 32):
        self.compiler = EmuCompiler(warp)
        self.platform = self.compiler.platform
        self.warp = warp
        self._libs, self._fns, self._files = [], {}, []
        self.live = set()

    def device_count(self): return 1
    def current_device(self): return 0
    def set_device(self, index): pass
    def mem_info(self): return (1 << 31, 1 << 32)

    def device_info(self, index):
        return DeviceInfo(0, f"cpu-emulated-warp{self.warp}", "gfx90a" if self.warp == 64 else "sm_90",
                          1 << 32, self.platform, self.warp, 2)

    def malloc(self, nbytes):
        ptr = _libc.malloc(max(int(nbytes), 1))
        self.live.add(ptr)
        return ptr

    def free(self, ptr):
        self.live.discard(ptr)
        _libc.free(ptr)

    def memcpy_htod(self, dst, src, nbytes, stream=0): ctypes.memmove(dst, src, nbytes)
    def memcpy_dtoh(self, dst, src, nbytes, stream=0): ctypes.memmove(dst, src, nbytes)
    def memcpy_dtod(self, dst, src, nbytes, stream=0): ctypes.memmove(dst, src, nbytes)
    def memset(self, dst, value, nbytes, stream=0): ctypes.memset(dst, value, nbytes)
    def stream_create(self): return 1
    def stream_destroy(self, stream): pass
    def stream_synchronize(self, stream): pass
    def event_create(self): return 1
    def event_destroy(self, event): pass
    def event_record(self, event, stream=0): pass
    def event_synchronize(self, event): pass
    def event_elapsed_ms(self, start, end): return 0.0
    def stream_wait_event(self, stream, event): pass
    def synchronize(self): pass

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
        return fn

    def launch(self, function, grid, block, args, shared_bytes=0, stream=0):
        params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
        dims = [ctypes.c_uint(int(v)) for v in tuple(grid) + tuple(block)]
        if self._fns[function].emu_launch(ctypes.c_void_p(function), params, *dims, ctypes.c_uint(int(shared_bytes))):
            raise GpuError("launch", f"emulator: unsupported block shape {block}")

    def close(self):
        for path in self._files:
            try:
                os.unlink(path)
            except OSError:
                pass
