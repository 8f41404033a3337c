"""Per-target hardware limits, in one table used by both the launch check (GpuContext.launch refuses a
launch the device would refuse, before it is made) and `python -m hipsched compile --report`
(theoretical occupancy), so the two can never disagree.

Where the numbers come from:

NVIDIA (sm_80 = A100, sm_90 = H100): the CUDA C++ Programming Guide, "Compute Capabilities",
technical specifications per compute capability: 1024 threads per block, block (1024, 1024, 64),
grid (2^31-1, 65535, 65535), 64K 32-bit registers per SM and per block, 255 per thread, 2048 threads
(64 warps) and 32 blocks per SM, 48 KB of shared memory per block unless the kernel opts in with
cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 164 KB per SM / 163 KB per block
opt-in on 8.0 and 228 KB / 227 KB on 9.0; the Ampere and Hopper tuning guides (1 KB of shared memory
reserved by the system per resident block); the CUDA occupancy calculator (registers are allocated
per warp in units of 256, warps per SM in units of 4, shared memory in units of 128 bytes).

AMD: LLVM's AMDGPUUsage and llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp (namespace IsaInfo):
getMaxWavesPerEU (10 on gfx9, 8 on gfx90a, 16 on gfx10.3), getTotalNumVGPRs (256 per lane; 512 on
gfx90a, where `.vgpr_count` is the unified VGPR+AGPR count; 1024 on gfx10.3 in wave32),
getVGPRAllocGranule (4; 8 on gfx90a; 16 on gfx10.3 wave32), getEUsPerCU (4 SIMDs per CU, or per WGP
on gfx10 in WGP mode, hiprtc's default), getLocalMemorySize (64 KiB per CU, 128 KiB per WGP on
gfx10; 64 KiB addressable by one work-group), getTotalNumSGPRs (800 per SIMD on gfx8/9) with
getOccupancyWithNumSGPRs (SGPRs do not limit waves on gfx10+), getMaxWorkGroupsPerCU (16 barriers
per CU, 32 per WGP on gfx10), max flat work-group size 1024; the LDS allocation granularity of 128
dwords (compute_pgm_rsrc2.LDS_SIZE). ROCm's hipModuleLaunchKernel (clr/hipamd/src/hip_module.cpp):
grid x up to 2^31-1 and y, z up to 65536 (newer releases), grid * block per dimension below 2^32 (the
32-bit HSA dispatch grid size, checked by 5.x), at most 64 KiB of dynamic LDS, and a block above the
kernel's launch bounds (.max_flat_workgroup_size) refused."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ...errors import GpuError

KB = 1024


@dataclass(frozen=True)
class Occupancy:
    """Theoretical residency of one kernel at one block size on one target."""
    blocks: int            # resident blocks per SM / CU
    waves: float           # resident warps per SM (NVIDIA) or wavefronts per SIMD (AMD)
    max_waves: int         # the most the hardware holds in the same unit
    limiter: str           # what bounds `blocks`: registers, shared memory, threads, blocks, sgprs, ...

    @property
    def fraction(self) -> float:
        return self.waves / self.max_waves if self.max_waves else 0.0


@dataclass(frozen=True)
class Target:
    name: str
    platform: str                 # "nvidia" | "amd"
    wavefront: int
    known: bool = True            # False: a generic stand-in for a target missing from TARGETS
    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    # AMD: the HSA dispatch packet holds the grid in work-items as 32-bit numbers per dimension
    max_work_items_per_dim: int | None = None
    # static + dynamic shared memory one block may use as hipsched launches (it never opts in to more)
    shared_per_block: int = 48 * KB
    shared_per_block_optin: int = 48 * KB
    # residency (occupancy): per SM on NVIDIA, per CU (per WGP on gfx10) on AMD
    shared_per_cu: int = 0
    shared_reserved_per_block: int = 0
    shared_granule: int = 128
    max_blocks_per_cu: int = 32
    simds: int = 4                 # NVIDIA: SM sub-partitions; AMD: SIMDs per CU
    max_waves_per_simd: int = 16
    regs_per_simd: int = 16384     # NVIDIA: 32-bit registers per sub-partition; AMD: VGPRs per lane
    reg_granule: int = 256         # NVIDIA: registers per warp allocation unit; AMD: VGPRs per wave
    regs_per_block: int | None = 65536
    sgprs_per_simd: int | None = None  # AMD gfx8/9 only (SGPRs do not bound waves on gfx10+)

    # ------------------------------------------------------------------ launch limits
    def fits(self, res, grid, block, shared: int = 0, warp_size: int | None = None) -> bool:
        """launch_problems(...) == [], answered with a few comparisons: every launch goes through
        this, so the common case must cost well under a kernel launch (`grid`, `block`: 3-tuples)."""
        gx, gy, gz = grid
        bx, by, bz = block
        threads = bx * by * bz
        mg, mb = self.max_grid, self.max_block
        if not (0 < gx <= mg[0] and 0 < gy <= mg[1] and 0 < gz <= mg[2] and 0 < bx <= mb[0] and 0 < by <= mb[1]
                and 0 < bz <= mb[2] and threads <= self.max_threads_per_block):
            return False
        wi = self.max_work_items_per_dim
        if wi and (gx * bx > wi or gy * by > wi or gz * bz > wi):
            return False
        if res is None:
            return shared <= self.shared_per_block and (
                warp_size is None or (warp_size == self.wavefront and threads % warp_size == 0))
        if res.static_shared + shared > self.shared_per_block or threads > res.max_threads:
            return False
        if warp_size is not None and (warp_size != res.wavefront or threads % warp_size):
            return False
        return self._block_registers(res, threads) is None

    def launch_problems(self, res, grid, block, shared: int = 0, warp_size: int | None = None):
        """[(limit, message)] for every limit this launch breaks ([] when the device would take it).
        `res` is the kernel's KernelResources (None: only the kernel-independent limits are checked);
        `warp_size` is the warp size the glue computed the launch with."""
        problems = []
        grid, block = tuple(int(v) for v in grid), tuple(int(v) for v in block)
        threads = block[0] * block[1] * block[2]
        if threads > self.max_threads_per_block:
            problems.append(("threads-per-block", f"{threads} threads per block exceeds {self.max_threads_per_block}"))
        for axis, b, top in zip("xyz", block, self.max_block):
            if not 1 <= b <= top:
                problems.append(("block-dims", f"block {axis} = {b} is outside 1..{top}"))
        for axis, g, top in zip("xyz", grid, self.max_grid):
            if not 1 <= g <= top:
                problems.append((f"grid-{axis}", f"grid {axis} = {g} is outside 1..{top}"))
        if self.max_work_items_per_dim:
            for axis, g, b in zip("xyz", grid, block):
                if g * b > self.max_work_items_per_dim:
                    problems.append(("work-items", f"grid {axis} x block {axis} = {g * b} work-items exceeds "
                                                   f"{self.max_work_items_per_dim} (32-bit dispatch grid size)"))
        static = res.static_shared if res is not None else 0
        total = static + int(shared)
        if total > self.shared_per_block:
            why = (f" (more needs cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES), up to "
                   f"{self.shared_per_block_optin // KB} KB, which hipsched does not do)"
                   if self.platform == "nvidia" else "")
            problems.append(("shared-memory", f"{static} B static + {int(shared)} B dynamic shared memory exceeds "
                                              f"{self.shared_per_block} B per block{why}"))
        if res is not None:
            if threads > res.max_threads:
                problems.append(("launch-bounds", f"{threads} threads per block exceeds the {res.max_threads} the "
                                                  f"kernel was compiled for (__launch_bounds__)"))
            regs = self._block_registers(res, threads)
            if regs is not None:
                problems.append(("registers", regs))
        if warp_size is not None:
            wave = res.wavefront if res is not None else self.wavefront
            if int(warp_size) != wave:
                problems.append(("wavefront", f"the launch was computed for warp {warp_size}, the kernel runs "
                                              f"wave{wave}"))
            if threads % int(warp_size):
                problems.append(("wavefront", f"{threads} threads per block is not a whole number of warps of "
                                              f"{warp_size} (the kernels' shuffles and reductions assume it)"))
        return problems

    def _block_registers(self, res, threads: int) -> str | None:
        """Why one block's registers do not fit the register file, or None."""
        waves = -(-threads // res.wavefront)
        if self.platform == "nvidia":
            per_warp = _align(res.registers * 32, self.reg_granule)
            if self.regs_per_block is not None and per_warp * waves > self.regs_per_block:
                return (f"{res.registers} registers x {threads} threads ({per_warp} per warp) exceeds "
                        f"{self.regs_per_block} registers per block")
            return None
        if not self.known:
            return None
        limit = self._waves_by_registers(res)[0]
        if -(-waves // self.simds) > limit:
            return (f"{waves} wavefronts of {res.registers} VGPRs need {-(-waves // self.simds)} per SIMD; the "
                    f"register file holds {limit}")
        return None

    # ------------------------------------------------------------------ occupancy
    def _waves_by_registers(self, res) -> tuple[int, str]:
        """AMD: wavefronts per SIMD the VGPRs (and on gfx8/9 the SGPRs) allow, and which binds."""
        v = res.registers
        by_v = self.max_waves_per_simd if v < self.reg_granule else \
            min(max(self.regs_per_simd // _align(v, self.reg_granule), 1), self.max_waves_per_simd)
        by_s = self.max_waves_per_simd
        if self.sgprs_per_simd is not None and res.sgprs is not None:
            s = res.sgprs
            by_s = min(self.max_waves_per_simd, 10 if s <= 80 else 9 if s <= 88 else 8 if s <= 100 else 7)
        return (by_v, "registers") if by_v <= by_s else (by_s, "sgprs")

    def occupancy(self, res, threads: int, dynamic_shared: int = 0) -> Occupancy:
        """Resident blocks and warps/wavefronts for `res` launched with `threads` per block."""
        waves = -(-int(threads) // self.wavefront)
        shared = _align(res.static_shared + int(dynamic_shared) + self.shared_reserved_per_block,
                        self.shared_granule)
        limits = []
        max_waves = self.max_waves_per_simd * self.simds
        if self.platform == "nvidia":
            limits.append((max_waves // waves, "threads"))
            limits.append((self.max_blocks_per_cu, "blocks"))
            if res.registers:
                per_warp = _align(res.registers * 32, self.reg_granule)
                limits.append(((self.regs_per_simd // per_warp) * self.simds // waves, "registers"))
            unit_max = max_waves
        else:
            by_regs, why = self._waves_by_registers(res)
            limits.append((max_waves // waves, "waves"))
            limits.append((by_regs * self.simds // waves, why))
            # one-wave work-groups need no barrier, so only larger ones count against the barriers
            if waves > 1:
                limits.append((self.max_blocks_per_cu, "barriers"))
            unit_max = self.max_waves_per_simd
        if shared:
            limits.append((self.shared_per_cu // shared, "shared memory"))
        blocks, limiter = min(limits, key=lambda t: t[0])
        resident = blocks * waves if self.platform == "nvidia" else blocks * waves / self.simds
        if resident >= unit_max:
            limiter = "-"
        return Occupancy(blocks, min(resident, unit_max), unit_max, limiter)


def _align(n: int, granule: int) -> int:
    return -(-int(n) // granule) * granule if n > 0 else 0


def _nvidia(name, shared_per_sm, shared_optin):
    return Target(name, "nvidia", 32, shared_per_cu=shared_per_sm, shared_per_block_optin=shared_optin,
                  shared_reserved_per_block=1 * KB, shared_granule=128, max_blocks_per_cu=32, simds=4,
                  max_waves_per_simd=16, regs_per_simd=16384, reg_granule=256, regs_per_block=65536)


def _amd(name, wavefront, max_waves, vgprs, granule, sgprs, lds_per_cu, barriers):
    return Target(name, "amd", wavefront, max_block=(1024, 1024, 1024), max_work_items_per_dim=2**32 - 1,
                  shared_per_block=64 * KB, shared_per_block_optin=64 * KB, shared_per_cu=lds_per_cu,
                  shared_granule=512, max_blocks_per_cu=barriers, simds=4, max_waves_per_simd=max_waves,
                  regs_per_simd=vgprs, reg_granule=granule, regs_per_block=None, sgprs_per_simd=sgprs)


TARGETS: dict[str, Target] = {
    "sm_80": _nvidia("sm_80", 164 * KB, 163 * KB),
    "sm_90": _nvidia("sm_90", 228 * KB, 227 * KB),
    "gfx906": _amd("gfx906", 64, 10, 256, 4, 800, 64 * KB, 16),
    # gfx908's AGPRs are a second 256-entry file; its `.vgpr_count` is max(VGPRs, AGPRs)
    "gfx908": _amd("gfx908", 64, 10, 256, 4, 800, 64 * KB, 16),
    "gfx90a": _amd("gfx90a", 64, 8, 512, 8, 800, 64 * KB, 16),
    "gfx1030": _amd("gfx1030", 32, 16, 1024, 16, None, 128 * KB, 32),
}


def target_for(arch: str, warp_size: int | None = None) -> Target:
    """The limits for a device or compile target ("gfx90a:sramecc+:xnack-", "sm_90"). A target
    missing from TARGETS gets its vendor's launch limits, which every current part shares, with no
    occupancy model (`known` False); `warp_size` is the device's, for such targets."""
    base = (arch or "").split(":", 1)[0]
    m = re.match(r"^(?:sm|compute)_(\d+)[af]?$", base)
    if m:
        base = f"sm_{m.group(1)}"
    if base in TARGETS:
        return TARGETS[base]
    if m:
        return Target(base, "nvidia", 32, known=False, shared_per_cu=100 * KB, shared_per_block_optin=99 * KB,
                      shared_reserved_per_block=1 * KB)
    if base.startswith("gfx"):
        wave = int(warp_size or (64 if base.startswith("gfx9") else 32))
        return Target(base, "amd", wave, known=False, max_block=(1024, 1024, 1024),
                      max_work_items_per_dim=2**32 - 1, shared_per_block=64 * KB, shared_per_block_optin=64 * KB,
                      shared_per_cu=64 * KB, shared_granule=512, regs_per_block=None)
    raise GpuError("unsupported", f"unknown GPU target {arch!r}")


def launch_error(target: Target, kernel: str, problems) -> GpuError:
    """The GpuError for a launch the device would refuse: kind "unsupported" (the call cannot run on
    this GPU, which says nothing about the GPU's health), name "launch-limit-<limit>"."""
    limit, first = problems[0]
    more = "; ".join(msg for _, msg in problems[1:])
    return GpuError("unsupported", f"{kernel} cannot be launched on {target.name}: {first}"
                    + (f"; also {more}" if more else ""), name=f"launch-limit-{limit}")


def check_launch(target: Target, kernel: str, res, grid, block, shared: int = 0, warp_size: int | None = None):
    """Raise launch_error(...) if the device would refuse this launch; return None otherwise."""
    if target.fits(res, grid, block, shared, warp_size):
        return
    problems = target.launch_problems(res, grid, block, shared, warp_size)
    if problems:
        raise launch_error(target, kernel, problems)


def occupancy_percent(occ: Occupancy) -> int:
    return int(math.floor(100 * occ.fraction + 0.5))
