"""GPU launch glue for spread_activation (kernels: src_c/hip/graph.hip).

Per step, on one stream: zero the accumulator, push w_ij * a[i] along every edge (atomic adds), then
apply a_new = a + decay * acc, clamp to [0, 1] and zero under threshold into the other of two ping-pong
buffers; the inputs are never written. The CSR arrays go through the resident cache, so a graph reused
across calls is uploaded once when its arrays are read-only or registered (Executor.resident)."""
from __future__ import annotations

import ctypes

import numpy as np

from ..compilation.kernel_constants import HSG_GROUP
from ..launch.context import Launch, grid_stride_blocks, pure_plan
from .common import kernel_suffix

_BLOCK = 256


def _index_pair(indptr, indices):
    """indptr and indices as the kernels take them: both int32 or both int64. The op's prepare already
    hands them over that way (untouched, so resident copies are reused); anything else is converted."""
    if indptr.dtype == indices.dtype and indptr.dtype in (np.int32, np.int64):
        return indptr, indices
    return (np.ascontiguousarray(indptr, dtype=np.int64), np.ascontiguousarray(indices, dtype=np.int64))


@pure_plan
def spread_launches(n: int, index_dtype, multiprocessors: int) -> list[Launch]:
    """One step: push along the edges (HSG_GROUP lanes per row), then the finishing rule per node."""
    push = "hs_spread_push_i32" if np.dtype(index_dtype) == np.int32 else "hs_spread_push_i64"
    return [Launch.of("graph", push, grid_stride_blocks(n * HSG_GROUP, _BLOCK, multiprocessors), _BLOCK),
            Launch.of("graph", "hs_spread_finish", grid_stride_blocks(n, _BLOCK, multiprocessors), _BLOCK)]


def spread_activation_plan(ctx, call) -> list[Launch]:
    kernel_suffix(call, dtypes=("float32",))   # the kernels read float32 activations and weights only
    indptr, indices, _, seeds = call.args
    n = int(seeds.shape[0])
    if n == 0 or int(call.params["steps"]) == 0:
        return []
    return spread_launches(n, _index_pair(indptr, indices)[1].dtype, ctx.multiprocessors)


def spread_activation_scratch(call, multiprocessors: int) -> int:
    """Device bytes the glue allocates beyond the call's inputs and result (the op spec's device scratch):
    the accumulator with its non-finite mark (n + 1 floats) and, for more than one step, the second
    ping-pong buffer of activations; nothing for a call that launches nothing."""
    n, steps = int(call.args[3].shape[0]), int(call.params["steps"])
    if n == 0 or steps == 0:
        return 0
    return 4 * (n + 1) + (4 * n if steps > 1 else 0)


def spread_activation(ctx, call, stream):
    indptr, indices, weights, seeds = call.args
    plan = ctx.planned(call, spread_activation_plan)
    decay = float(call.params["decay"])
    steps = int(call.params["steps"])
    threshold = float(call.params["threshold"])
    s = int(stream or 0)
    n = int(seeds.shape[0])
    cur = ctx.upload(seeds, stream)
    out = ctx.empty((n,), np.float32, stream)
    if n == 0 or steps == 0:
        if n:
            ctx.rt.memcpy_dtod(out.ptr, cur.ptr, 4 * n, s)
        return ctx.finish(out, call, stream)

    indptr, indices = _index_pair(indptr, indices)
    push, finish = plan
    ip, ix = ctx.upload(indptr, stream), ctx.upload(indices, stream)
    w = ctx.upload(np.ascontiguousarray(weights, dtype=np.float32), stream)
    acc = ctx.empty((n + 1,), np.float32, stream)   # acc[n]: the push kernel's non-finite mark (graph.hip)
    other = ctx.empty((n,), np.float32, stream) if steps > 1 else None
    # The last step must land in `out`: with an even count the first step writes `other`.
    dst = out if steps % 2 == 1 else other
    for step in range(steps):
        ctx.rt.memset(acc.ptr, 0, 4 * (n + 1 if step == 0 else n), s)   # the mark lives on after step 1
        ctx.run(push, (ip, ix, w, cur, acc, ctypes.c_int64(n), ctypes.c_int32(step == 0)), stream)
        ctx.run(finish, (cur, acc, dst, ctypes.c_int64(n), ctypes.c_float(decay), ctypes.c_float(threshold)),
                stream)
        cur, dst = dst, (other if dst is out else out)
    return ctx.finish(out, call, stream)


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """Both index widths' kernels (the compile report's occupancy rows)."""
    return [launch for dtype in (np.int32, np.int64) for launch in spread_launches(1000, dtype, multiprocessors)]
