"""What a real device refuses at launch, for the kernel emulator (tests/support/gpu_emulator.py): the emulator
runs any launch it can, so without this a launch that sm_90 or gfx90a would refuse would pass in CI.

This models the drivers' own launch validation, independently of hipsched/gpu/compilation/targets.py (which it
exists to check), with the driver's own error names:
- CUDA, cuLaunchKernel: CUDA_ERROR_INVALID_VALUE for a block or grid beyond the device limits
  (block (1024, 1024, 64), 1024 threads, grid (2^31-1, 65535, 65535)) and for more than the 48 KB of
  static + dynamic shared memory a kernel gets without cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES);
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ("too many resources requested for launch") for more threads
  than the kernel's registers (64K per block, allocated per warp in units of 256) or its
  __launch_bounds__ allow.
- ROCm 5.x, hipModuleLaunchKernel (clr hipamd/src/hip_module.cpp): hipErrorInvalidConfiguration for
  grid x block above 2^32-1 work-items in a dimension or a block above 1024 threads,
  hipErrorInvalidValue for a zero dimension, grid x above 2^31-1 or y/z above 65536 (newer clr), or
  more than 64 KiB of LDS, and hipErrorLaunchFailure for a block above the kernel's launch bounds
  (.max_flat_workgroup_size: the runtime logs "Launch params ... are larger than launch bounds").

A kernel's registers, static shared memory and launch bounds come from compiling the same source
with the real compiler for the emulated device's arch (NVRTC for sm_90, hiprtc for gfx90a), once per
process; without that compiler only the kernel-independent limits are checked."""
from __future__ import annotations

import threading

from hipsched.errors import GpuError
from hipsched.gpu.bindings.status import classify

_lock = threading.Lock()
_resources: dict[str, dict] = {}


def _kernel_resources(arch: str) -> dict:
    """{kernel: KernelResources} of every hipsched kernel compiled for `arch` with the real compiler."""
    with _lock:
        if arch not in _resources:
            found = {}
            try:
                from hipsched.gpu.compilation.codeobject import kernel_resources
                from hipsched.gpu.bindings.compilers import get_compiler
                from hipsched.gpu.compilation.kernels import KernelCache
                cache = KernelCache(get_compiler(arch))
                for source in cache.sources:
                    found.update(kernel_resources(cache.code_object(source, arch)))
            except GpuError:
                pass   # no NVRTC / hiprtc here: kernel-independent limits only
            _resources[arch] = found
        return _resources[arch]


def _nvidia(res, grid, block, shared):
    threads = block[0] * block[1] * block[2]
    if any(b < 1 for b in block) or block[0] > 1024 or block[1] > 1024 or block[2] > 64 or threads > 1024:
        return "CUDA_ERROR_INVALID_VALUE", f"block {block}"
    if any(g < 1 for g in grid) or grid[0] > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        return "CUDA_ERROR_INVALID_VALUE", f"grid {grid}"
    static = res.static_shared if res else 0
    if static + shared > 48 * 1024:
        return "CUDA_ERROR_INVALID_VALUE", f"{static} + {shared} bytes of shared memory without the opt-in"
    if res is not None:
        if threads > res.max_threads:
            return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", f"{threads} threads, __launch_bounds__({res.max_threads})"
        per_warp = -(-res.registers * 32 // 256) * 256
        if per_warp * -(-threads // 32) > 65536:
            return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", f"{res.registers} registers x {threads} threads"
    return None


def _amd(res, grid, block, shared):
    threads = block[0] * block[1] * block[2]
    if any(g * b > 2**32 - 1 for g, b in zip(grid, block)):
        return "hipErrorInvalidConfiguration", f"grid {grid} x block {block} work-items"
    if any(v < 1 for v in grid + block) or grid[0] > 2**31 - 1 or grid[1] > 65536 or grid[2] > 65536:
        return "hipErrorInvalidValue", f"grid {grid}, block {block}"
    if threads > 1024:
        return "hipErrorInvalidConfiguration", f"{threads} threads per block"
    static = res.static_shared if res else 0
    if static + shared > 64 * 1024:
        return "hipErrorInvalidValue", f"{static} + {shared} bytes of LDS"
    if res is not None and threads > res.max_threads:
        return "hipErrorLaunchFailure", f"{threads} threads, launch bounds {res.max_threads}"
    return None


def refuse(arch: str, platform: str, kernel: str | None, grid, block, shared: int) -> None:
    """Raise the GpuError the device's driver would return for this launch, if it would refuse it."""
    grid, block = tuple(int(v) for v in grid), tuple(int(v) for v in block)
    res = _kernel_resources(arch).get(kernel) if kernel else None
    found = (_nvidia if platform == "nvidia" else _amd)(res, grid, block, int(shared))
    if found is not None:
        name, why = found
        api = "cuLaunchKernel" if platform == "nvidia" else "hipModuleLaunchKernel"
        # the kind hipsched's bindings give this error name (hipsched/gpu/bindings/status.py)
        raise GpuError(classify(name), f"emulated {api}({kernel or 'kernel'}) on {arch} failed: {name} ({why})",
                       name=name)
