"""GPU launch glue for the GGUF quant ops (kernels: src_c/hip/quant.hip).

The block bytes of a QuantizedTensor go through the resident cache keyed on `w.data` (the tensor is
immutable by contract and returns the same read-only array every time), so weights reused across calls
are uploaded once.
Results are the float32 product of the dequantized matrix and x, x kept in float32, as on the CPU."""
from __future__ import annotations

import ctypes

import numpy as np

from ..errors import GpuError
from ..gguf_blocks import BLOCK_BYTES, QK
from .context import Launch, grid_stride_blocks, pure_plan

_DEQ_BLOCK = 256
_MATVEC_BLOCK = 128      # threads; each warp/wavefront owns _MATVEC_ROWS rows
_MATVEC_ROWS = 2         # HSQ_NR in quant.hip
_MATVEC_COLS = 8         # up to this many columns of x go through the mat-vec kernel (MC = 8)
_TILE = 64               # HSQ_TM / HSQ_TN in quant.hip


def _suffix(w) -> str:
    if w.qtype not in BLOCK_BYTES:
        raise GpuError("unsupported", f"no GPU kernel for quant type {w.qtype!r}")
    return w.qtype  # "q8_0" | "q4_0": kernel names end with it


def weights(ctx, w, stream):
    """Device copy of the tensor's block bytes, resident across calls while the tensor lives: the
    tensor is immutable by contract, so its bytes are kept as the owner's guarantee says."""
    return ctx.upload(w.data, stream, immutable=True)


def _aligned(ctx, x, stream):
    """x on the device with a 16-byte aligned base (the mat-vec reads it as float4): our own uploads
    always are; a foreign device array that is not gets copied once on the device."""
    x = ctx.upload(x, stream)
    if int(x.ptr) % 16 == 0:
        return x
    copy = ctx.empty(x.shape, np.float32, stream)
    ctx.rt.memcpy_dtod(copy.ptr, x.ptr, x.nbytes, int(stream or 0))
    return copy


@pure_plan
def dequantize_launches(nblocks: int, qtype: str, multiprocessors: int) -> list[Launch]:
    """One thread per 4 outputs: 8 per quant block."""
    return [Launch.of("quant", f"hs_dequantize_{qtype}", grid_stride_blocks(nblocks * 8, _DEQ_BLOCK, multiprocessors),
                      _DEQ_BLOCK)]


@pure_plan
def qmatmul_launches(n: int, m: int, qtype: str, warp: int) -> list[Launch]:
    """W (n, k) x X (k, m): the mat-vec kernels (a warp per _MATVEC_ROWS rows) for m <= _MATVEC_COLS,
    else 64x64 output tiles on grid (n / 64, m / 64)."""
    rows_per_block = (_MATVEC_BLOCK // warp) * _MATVEC_ROWS
    if m == 1:
        return [Launch.of("quant", f"hs_qmatvec_{qtype}", -(-n // rows_per_block), _MATVEC_BLOCK)]
    if m <= _MATVEC_COLS:
        return [Launch.of("quant", f"hs_qmatvec8_{qtype}", -(-n // rows_per_block), _MATVEC_BLOCK)]
    return [Launch.of("quant", f"hs_qmatmat_{qtype}", (-(-n // _TILE), -(-m // _TILE)), 256)]


def dequantize_plan(ctx, call) -> list[Launch]:
    (w,) = call.args
    nblocks = w.shape[0] * w.shape[1] // QK
    return dequantize_launches(nblocks, _suffix(w), ctx.multiprocessors) if nblocks else []


def dequantize(ctx, call, stream):
    (w,) = call.args
    plan = ctx.check_launches(dequantize_plan(ctx, call))
    n, k = w.shape
    out = ctx.empty((n, k), np.float32, stream)
    if plan:
        ctx.run(plan[0], (weights(ctx, w, stream), out, ctypes.c_int64(n * k // QK)), stream)
    return ctx.finish(out, call, stream)


def qmatmul_plan(ctx, call) -> list[Launch]:
    w, x = call.args
    n, k = w.shape
    m = 1 if len(x.shape) == 1 else int(x.shape[1])
    return qmatmul_launches(n, m, _suffix(w), ctx.warp_size) if n * m * k else []


def qmatmul(ctx, call, stream):
    w, x = call.args
    # checked before the weights go up: a launch the device refuses (m columns beyond grid y) costs nothing
    plan = ctx.check_launches(qmatmul_plan(ctx, call))
    n, k = w.shape
    vector = len(x.shape) == 1
    m = 1 if vector else int(x.shape[1])
    out = ctx.empty((n,) if vector else (n, m), np.float32, stream)
    if n == 0 or m == 0:
        return ctx.finish(out, call, stream)
    if k == 0:  # empty sums: zeros, as the CPU gives
        ctx.rt.memset(out.ptr, 0, out.nbytes, int(stream or 0))
        return ctx.finish(out, call, stream)
    (launch,) = plan
    wd = weights(ctx, w, stream)
    if m == 1:
        ctx.run(launch, (wd, _aligned(ctx, x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k)), stream)
    elif m <= _MATVEC_COLS:
        ctx.run(launch, (wd, ctx.upload(x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int32(m)),
                stream)
    else:
        ctx.run(launch, (wd, ctx.upload(x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int64(m)),
                stream)
    return ctx.finish(out, call, stream)


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """Every quant kernel at the block sizes the glue uses (the compile report's occupancy rows)."""
    plans = []
    for qtype in ("q8_0", "q4_0"):
        plans += dequantize_launches(100, qtype, multiprocessors)
        for m in (1, 2, 9):
            plans += qmatmul_launches(100, m, qtype, warp)
    return plans
