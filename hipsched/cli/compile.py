"""python -m hipsched compile --arch gfx90a [--arch sm_90 ...] [--cache-dir DIR]: compile every GPU
kernel source ahead of time into the code-object cache, with no GPU needed (containers, clusters, CI).
Prints one line per source: its kernels, code-object size, compile (or cache) time and the compiler.
--report adds, per kernel, what its code object needs (registers, spills, static shared memory,
scratch) and its theoretical occupancy on that target at the block sizes the launch glue uses, with
what limits it, and where cuobjdump (NVIDIA) or llvm-objdump (AMD) is found, what its machine code does:
matrix-core instructions, 128-bit global loads and stores, local memory
(hipsched/gpu/compilation/report.py). Exit status 1 if any source failed for any target."""
from __future__ import annotations

import json
import os
import sys

from ..errors import GpuError


def add_arguments(parser):
    parser.add_argument("--arch", action="append", required=True, metavar="TARGET",
                        help="target: gfx906, gfx90a, gfx90a:sramecc+:xnack-, gfx1030, sm_80, sm_90, ... "
                             "(repeat for several)")
    parser.add_argument("--cache-dir", default=None, help="code-object cache (default: HIPSCHED_CACHE_DIR "
                        "or ~/.cache/hipsched/kernels)")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.add_argument("--report", action="store_true",
                        help="per kernel: registers, spills, static shared memory and occupancy on the target")


def run(args) -> int:
    # deferred: __main__ imports every command, so this loads only when the command runs (the GPU layer)
    from ..gpu.bindings.compilers import get_compiler
    from ..gpu.compilation.kernels import KernelCache, compile_all

    failed = 0
    rows_out = []
    for arch in args.arch:
        try:
            compiler = get_compiler(arch)
            if not compiler.supports(arch):
                why = getattr(compiler, "why_unsupported", lambda a: "unsupported target")(arch)
                raise GpuError("compile", f"{compiler.version()} cannot compile for {arch}: {why}")
        except GpuError as e:
            print(f"{arch}: {e}", file=sys.stderr)
            failed += 1
            continue
        cache_dir = KernelCache(compiler, args.cache_dir).cache_dir
        try:   # the cache is the point of this command: a directory it cannot write is an error
            os.makedirs(cache_dir, exist_ok=True)
            if not os.access(cache_dir, os.W_OK):
                raise PermissionError(f"no write permission for {cache_dir}")
        except OSError as e:
            print(f"{arch}: cannot write the kernel cache {cache_dir}: {e}", file=sys.stderr)
            failed += 1
            continue
        rows = compile_all(compiler, arch, cache_dir=args.cache_dir)
        if not rows:
            print(f"{arch}: no kernel sources found", file=sys.stderr)
            failed += 1
            continue
        if not args.json:
            print(f"{arch} with {compiler.version()} -> {KernelCache(compiler, args.cache_dir).cache_dir}")
        report = _report(compiler, arch, rows, args.cache_dir) if args.report else None
        for source, kernels, result, seconds, version in rows:
            ok = not isinstance(result, Exception)
            failed += not ok
            row = {"arch": arch, "source": source, "kernels": kernels, "ok": ok, "seconds": round(seconds, 3),
                   "compiler": version, "bytes": len(result) if ok else None, "error": None if ok else str(result)}
            if report is not None:
                row["report"] = [r.as_dict() for r in report[1] if r.source == source]
            rows_out.append(row)
            if args.json:
                continue
            status = f"{row['bytes']:>9,d} B" if ok else "   FAILED  "
            print(f"  {source:<18} {status} {seconds:7.2f} s  {len(kernels):2d} kernels: {', '.join(kernels)}")
            if not ok:
                print("    " + str(result).replace("\n", "\n    "), file=sys.stderr)
        if report is not None and not args.json:
            print(f"{arch} kernel report")
            for line in report[0]:
                print(line)
    if args.json:
        print(json.dumps(rows_out, indent=2))
    return 1 if failed else 0


def _report(compiler, arch, rows, cache_dir):
    """(text lines, ReportRows) for the compiled sources of one target."""
    # deferred: the GPU layer, loaded only when the command runs (__main__ imports every command)
    from ..gpu.compilation.codeobject import kernel_resources, with_ptxas_spills
    from ..gpu.compilation.disassembly import disassembler, instruction_facts
    from ..gpu.compilation.kernels import KernelCache
    from ..gpu.compilation.report import format_report, glue_launches, kernel_report
    from ..gpu.compilation.targets import target_for

    cache = KernelCache(compiler, cache_dir)
    resources, instructions = {}, {}
    for source, _kernels, result, _seconds, _version in rows:
        if isinstance(result, Exception):
            continue
        instructions.update(instruction_facts(result, compiler.platform, arch) or {})
        found = kernel_resources(result)
        if compiler.platform == "nvidia" and found:
            # a CUBIN does not record spills; ptxas prints them when asked, for the same compile
            try:
                _, log = compiler.compile_with_log(cache.source(source), source, arch, ("--ptxas-options=-v",))
                found = with_ptxas_spills(found, log)
            except GpuError:
                pass
        resources.update({k: (source, r) for k, r in found.items()})
    target = target_for(arch)
    report = kernel_report(target, resources, glue_launches(target.wavefront, arch=arch), instructions)
    lines = format_report(target, report)
    tool = disassembler(compiler.platform)
    lines.append(f"  machine code read with {tool}" if instructions else
                 "  (no instruction columns: " + ("no cuobjdump (pip install nvidia-cuda-cuobjdump)"
                                                  if compiler.platform == "nvidia" else "no llvm-objdump")
                 + (" or it could not read these code objects)" if tool else ")"))
    if not resources:
        lines.append("  (no kernel resources in these code objects: PTX or an unknown format)")
    return lines, report
