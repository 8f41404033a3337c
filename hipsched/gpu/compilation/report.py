"""The kernel report of `python -m hipsched compile --arch X --report`: per kernel, what its code object
says it needs (registers, spills, static shared memory, scratch) and the theoretical occupancy at the
block sizes the launch glue really uses, on that target (limits and occupancy model:
hipsched/gpu/compilation/targets.py), with what bounds it; and where a disassembler is found
(hipsched/gpu/compilation/disassembly.py), what its machine code does: matrix-core instructions, the
share of 128-bit global loads and stores, local-memory instructions."""
from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
from dataclasses import dataclass


from .codeobject import KernelResources
from .disassembly import InstructionFacts
from .targets import Occupancy, Target, occupancy_percent


@dataclass(frozen=True)
class ReportRow:
    kernel: str
    source: str
    block: int
    dynamic_shared: int          # the most dynamic shared memory the glue gives this kernel at `block`
    resources: KernelResources
    occupancy: Occupancy | None  # None: a target without an occupancy model
    instructions: InstructionFacts | None = None   # None: no disassembler here

    def as_dict(self) -> dict:
        r = self.resources
        d = {"kernel": self.kernel, "source": self.source, "block": self.block, "dynamic_shared": self.dynamic_shared,
             "registers": r.registers, "static_shared": r.static_shared, "private": r.private,
             "max_threads": r.max_threads, "wavefront": r.wavefront}
        for k in ("sgprs", "agprs", "vgpr_spills", "sgpr_spills", "spill_store_bytes", "spill_load_bytes"):
            if getattr(r, k) is not None:
                d[k] = getattr(r, k)
        if self.occupancy is not None:
            o = self.occupancy
            d.update(resident_blocks=o.blocks, waves=o.waves, max_waves=o.max_waves,
                     occupancy=round(o.fraction, 4), limited_by=o.limiter)
        if self.instructions is not None:
            d["instructions"] = self.instructions.as_dict()
        return d


# The launch glue's package (gpu/glue/), whose modules are found by listing its folder, and the one module
# there that is no op family's glue but what the families share.
GLUE_PACKAGE = __package__.rpartition(".")[0] + ".glue"
GLUE_SHARED = "common"


def glue_modules() -> list:
    """Every op family's glue module (gpu/glue/<family>.py), each with its own `report_launches`: a new
    family's glue needs no entry here."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "glue")
    return [importlib.import_module(f"{GLUE_PACKAGE}.{info.name}") for info in pkgutil.iter_modules([folder])
            if info.name != GLUE_SHARED]


def glue_launches(warp: int, multiprocessors: int = 100, arch: str | None = None) -> dict[str, dict[int, int]]:
    """{kernel: {threads per block: the most dynamic shared memory}} over what the launch glue plans
    for shapes that reach every kernel and every block size it uses; on target `arch` when given (a
    family whose kernels differ by target, attention's tensor-core ones, takes it as `arch`)."""
    plans = []
    for module in glue_modules():
        if arch is not None and "arch" in inspect.signature(module.report_launches).parameters:
            plans += module.report_launches(warp, multiprocessors, arch=arch)
        else:
            plans += module.report_launches(warp, multiprocessors)
    out: dict[str, dict[int, int]] = {}
    for p in plans:
        threads = p.block[0] * p.block[1] * p.block[2]
        sizes = out.setdefault(p.kernel, {})
        sizes[threads] = max(sizes.get(threads, 0), p.shared)
    return out


def kernel_report(target: Target, resources: dict[str, tuple[str, KernelResources]],
                  launches: dict[str, dict[int, int]],
                  instructions: dict[str, InstructionFacts] | None = None) -> list[ReportRow]:
    """One row per (kernel, block size the glue uses); a kernel no glue launches gets its largest
    allowed block. `resources`: {kernel: (source, KernelResources)}; `instructions`: {kernel: facts}."""
    instructions = instructions or {}
    rows = []
    for kernel in sorted(resources):
        source, res = resources[kernel]
        sizes = launches.get(kernel) or {res.max_threads: 0}
        for block in sorted(sizes):
            occ = target.occupancy(res, block, sizes[block]) if target.known else None
            rows.append(ReportRow(kernel, source, block, sizes[block], res, occ, instructions.get(kernel)))
    return rows


def _spills(r: KernelResources) -> str:
    if r.vgpr_spills is not None:
        return f"{r.vgpr_spills}/{r.sgpr_spills}"
    if r.spill_store_bytes is not None:
        return f"{r.spill_store_bytes}/{r.spill_load_bytes}"
    return "?"


def format_report(target: Target, rows: list[ReportRow]) -> list[str]:
    """The report as text lines: a header with the target's limits, then one line per row."""
    amd = target.platform == "amd"
    if amd:
        head = (f"  occupancy in wave{target.wavefront} wavefronts per SIMD (at most {target.max_waves_per_simd}; "
                f"{target.regs_per_simd} VGPRs, granule {target.reg_granule}"
                + (f"; {target.sgprs_per_simd} SGPRs" if target.sgprs_per_simd else "")
                + f"; {target.shared_per_cu // 1024} KiB LDS per {'WGP' if target.wavefront == 32 else 'CU'}, "
                f"{target.shared_per_block // 1024} KiB per block)")
        cols = (f"  {'kernel':<28} {'block':>5} {'vgpr':>4} {'agpr':>4} {'sgpr':>4} {'spill v/s':>9} "
                f"{'lds static+dyn':>15} {'scratch':>7} {'occupancy':>14}  limited by")
    else:
        head = (f"  occupancy in warps per SM (at most {target.max_waves_per_simd * target.simds}; "
                f"{target.regs_per_simd * target.simds // 1024}K registers, {target.max_blocks_per_cu} blocks, "
                f"{target.shared_per_cu // 1024} KB shared memory with {target.shared_reserved_per_block} B "
                f"reserved per block; {target.shared_per_block // 1024} KB per block without opt-in)")
        cols = (f"  {'kernel':<28} {'block':>5} {'regs':>4} {'spill st/ld B':>13} {'smem static+dyn':>15} "
                f"{'stack':>5} {'occupancy':>14}  limited by")
    disassembled = any(row.instructions is not None for row in rows)
    width = len(cols)
    if disassembled:
        cols += f"  {'mma':>4} {'ld128/ld':>9} {'st128/st':>9} {'local':>5}"
    lines = [head, cols]
    for row in rows:
        r, o = row.resources, row.occupancy
        occ = "?" if o is None else f"{o.waves:g}/{o.max_waves} {occupancy_percent(o):3d}%"
        why = "?" if o is None else o.limiter
        smem = f"{r.static_shared}+{row.dynamic_shared}"
        if amd:
            line = (f"  {row.kernel:<28} {row.block:>5} {r.registers:>4} {r.agprs or 0:>4} {r.sgprs or 0:>4} "
                    f"{_spills(r):>9} {smem:>15} {r.private:>7} {occ:>14}  {why}")
        else:
            line = (f"  {row.kernel:<28} {row.block:>5} {r.registers:>4} {_spills(r):>13} {smem:>15} "
                    f"{r.private:>5} {occ:>14}  {why}")
        if disassembled:
            line = line.ljust(width) + _instruction_columns(row.instructions)
        lines.append(line)
    return lines


def _instruction_columns(f: InstructionFacts | None) -> str:
    if f is None:
        return f"  {'?':>4} {'?':>9} {'?':>9} {'?':>5}"
    return (f"  {f.matrix:>4} {f'{f.global_loads_128}/{f.global_loads}':>9} "
            f"{f'{f.global_stores_128}/{f.global_stores}':>9} {f.local:>5}")
