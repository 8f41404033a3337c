"""GPU launch glue for rms_norm (kernel: src_c/hip/norm.hip): one block per row of the (rows, len) view of
x, the grid striding over rows past its cap. Same `op(ctx, call, stream)` / `op_plan(ctx, call)` /
`op_launches(...)` shape as ops_basic.py."""
from __future__ import annotations

from ctypes import c_double, c_int64

import numpy as np

from .context import Launch
from .ops_basic import _empty_result

MAX_GRID = 1 << 20   # rows per launch before the kernel's row loop takes over


def rms_norm_launches(rows: int, length: int) -> list[Launch]:
    """Threads per block grow with the row so short rows do not leave most of a block idle."""
    block = 1024 if length >= 16384 else (256 if length >= 1024 else 64)
    return [Launch.of("norm", "hs_rms_norm_f32", min(rows, MAX_GRID), block)]


def _layout(call):
    shape = tuple(call.args[0].shape)
    length = int(shape[-1])
    return (int(np.prod(shape, dtype=np.int64)) // length if length else 0), length


def rms_norm_plan(ctx, call) -> list[Launch]:
    rows, length = _layout(call)
    return rms_norm_launches(rows, length) if rows and length else []


def rms_norm(ctx, call, stream):
    x_in, w_in = call.args[0], call.args[1]
    plan = ctx.check_launches(rms_norm_plan(ctx, call))
    if not plan:
        return _empty_result(ctx, call, tuple(x_in.shape), np.float32, stream)
    (launch,) = plan
    rows, length = _layout(call)
    x, w = ctx.upload(x_in, stream), ctx.upload(w_in, stream)
    y = ctx.empty(tuple(x_in.shape), np.float32, stream)
    ctx.run(launch, (x, w, y, c_double(float(call.params["eps"])), c_int64(rows), c_int64(length)), stream)
    return ctx.finish(y, call, stream)


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """The kernel at each block size the glue picks (the compile report's occupancy rows)."""
    return [launch for length in (64, 1024, 16384) for launch in rms_norm_launches(8, length)]
