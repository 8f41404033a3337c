"""GPU launch glue for rms_norm (kernel: src_c/hip/norm.hip): one block per row of the (rows, len) view of
x, the grid striding over rows past its cap. Same `op(ctx, call, stream)` / `op_plan(ctx, call)` /
`op_launches(...)` shape as every glue module (common.py). float32, float16 and bfloat16 (Call.dtype; x
and w of that type, y too)."""
from __future__ import annotations

import math
from ctypes import c_double, c_int64

from ..launch.context import Launch, pure_plan
from .common import KERNEL_SUFFIX, _empty_result, kernel_suffix, np_dtype

MAX_GRID = 1 << 20   # rows per launch before the kernel's row loop takes over


@pure_plan
def rms_norm_launches(rows: int, length: int, suffix: str = "f32") -> list[Launch]:
    """Threads per block grow with the row so short rows do not leave most of a block idle."""
    block = 1024 if length >= 16384 else (256 if length >= 1024 else 64)
    return [Launch.of("norm", f"hs_rms_norm_{suffix}", min(rows, MAX_GRID), block)]


def _layout(call):
    shape = tuple(call.args[0].shape)
    length = int(shape[-1])
    return (math.prod(shape) // length if length else 0), length


def rms_norm_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    rows, length = _layout(call)
    return rms_norm_launches(rows, length, suffix) if rows and length else []


def rms_norm(ctx, call, stream):
    x_in, w_in = call.args[0], call.args[1]
    plan = ctx.check_launches(rms_norm_plan(ctx, call))
    dtype = np_dtype(call.dtype)
    if not plan:
        return _empty_result(ctx, call, tuple(x_in.shape), dtype, stream)
    (launch,) = plan
    rows, length = _layout(call)
    x, w = ctx.upload(x_in, stream), ctx.upload(w_in, stream)
    y = ctx.empty(tuple(x_in.shape), dtype, stream)
    ctx.run(launch, (x, w, y, c_double(float(call.params["eps"])), c_int64(rows), c_int64(length)), stream)
    return ctx.finish(y, call, stream)


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """The kernel at each block size the glue picks (the compile report's occupancy rows)."""
    return [launch for sfx in KERNEL_SUFFIX.values() for length in (64, 1024, 16384)
            for launch in rms_norm_launches(8, length, sfx)]
