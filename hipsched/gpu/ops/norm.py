"""GPU launch glue for rms_norm (kernels: src_c/hip/norm.hip): one block per row of the (rows, len) view of
x, the grid striding over rows past its cap; rows of a multiple of 8 up to REGS_MAX_LEN with 16-byte
aligned x, w and y are held in registers and read once (hs_rms_norm_regs_*), others take the scalar
kernel. Same `op(ctx, call, stream)` / `op_plan(ctx, call)` /
`op_launches(...)` shape as every glue module (common.py). float32, float16 and bfloat16 (Call.dtype; x
and w of that type, y too)."""
from __future__ import annotations

import math
from ctypes import c_double, c_int64

from ..launch.context import Launch, pure_plan
from .common import (KERNEL_SUFFIX, _aligned, _empty_result, _will_align, kernel_suffix, np_dtype, row_regs_geometry,
                     row_regs_max_len)

MAX_GRID = 1 << 20   # rows per launch before the kernel's row loop takes over
# The register kernel's blocks stop at 512 threads: its p4 variant takes 72-80 registers on sm_90 (the
# double sum of squares), over the 64 a 1024-thread block may use. Rows up to 16384 elements are read once.
REGS_THREADS = 512
REGS_MAX_LEN = row_regs_max_len(REGS_THREADS)


@pure_plan
def rms_norm_launches(rows: int, length: int, suffix: str = "f32", vec: bool = False) -> list[Launch]:
    """`vec` (x, w and y 16-byte aligned) with length % 8 == 0 up to REGS_MAX_LEN: the row held in
    registers, read once in 16-byte accesses. Otherwise the scalar kernel, which reads it twice; its
    threads per block grow with the row so short rows do not leave most of a block idle."""
    regs = row_regs_geometry(length, REGS_THREADS) if vec and length % 8 == 0 else None
    if regs is not None:
        packs, block = regs
        return [Launch.of("norm", f"hs_rms_norm_regs_{suffix}_p{packs}", min(rows, MAX_GRID), block)]
    block = 1024 if length >= 16384 else (256 if length >= 1024 else 64)
    return [Launch.of("norm", f"hs_rms_norm_{suffix}", min(rows, MAX_GRID), block)]


def _layout(call):
    shape = tuple(call.args[0].shape)
    length = int(shape[-1])
    return (math.prod(shape) // length if length else 0), length


def rms_norm_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    rows, length = _layout(call)
    if not (rows and length):
        return []
    return rms_norm_launches(rows, length, suffix, _will_align(call.args[0], call.args[1]))


def rms_norm(ctx, call, stream):
    x_in, w_in = call.args[0], call.args[1]
    plan = ctx.planned(call, rms_norm_plan)
    dtype, suffix = np_dtype(call.dtype), kernel_suffix(call)
    if not plan:
        return _empty_result(ctx, call, tuple(x_in.shape), dtype, stream)
    (launch,) = plan
    rows, length = _layout(call)
    x, w = ctx.upload(x_in, stream), ctx.upload(w_in, stream)
    y = ctx.empty(tuple(x_in.shape), dtype, stream)
    if launch.kernel != f"hs_rms_norm_{suffix}" and not _aligned(x, w, y):   # not for our own allocations
        (launch,) = rms_norm_launches(rows, length, suffix, False)
    ctx.run(launch, (x, w, y, c_double(float(call.params["eps"])), c_int64(rows), c_int64(length)), stream)
    return ctx.finish(y, call, stream)


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """The kernel at each block size the glue picks (the compile report's occupancy rows)."""
    lengths = (64, 1024, 2048, 4096, 8192, REGS_MAX_LEN, REGS_MAX_LEN + 8)
    return [launch for sfx in KERNEL_SUFFIX.values() for vec in (False, True) for length in lengths
            for launch in rms_norm_launches(8, length, sfx, vec)]
