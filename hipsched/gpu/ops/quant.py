"""GPU launch glue for the GGUF quant ops (kernels: src_c/hip/quant.hip).

The block bytes of a QuantizedTensor go through the resident cache keyed on `w.data` (the tensor is
immutable by contract and returns the same read-only array every time), so weights reused across calls
are uploaded once. qmatmul's x is float32, float16 or bfloat16, read in its own type (the kernels of x's
element type are launched, whatever Call.dtype says) and never re-quantized: the product accumulates in
float32 and comes back in x's dtype, rounded once, as on the CPU. dequantize gives float32."""
from __future__ import annotations

import ctypes

import numpy as np

from ...errors import GpuError
from ...gguf_blocks import BLOCK_BYTES, QK
from ..launch.context import Launch, grid_stride_blocks, pure_plan
from .common import KERNEL_SUFFIX

_DEQ_BLOCK = 256
_MATVEC_BLOCK = 128      # threads; each warp/wavefront owns _MATVEC_ROWS rows
_MATVEC_ROWS = 2         # HSQ_NR in quant.hip
_MATVEC_COLS = 8         # up to this many columns of x go through the mat-vec kernel (MC = 8)
_TILE = 64               # HSQ_TM / HSQ_TN in quant.hip


def _suffix(w) -> str:
    if w.qtype not in BLOCK_BYTES:
        raise GpuError("unsupported", f"no GPU kernel for quant type {w.qtype!r}")
    return w.qtype  # "q8_0" | "q4_0": kernel names end with it


def _x_suffix(x) -> str:
    """The kernel suffix of x's element type (the products' kernels exist per type of x and y)."""
    name = np.dtype(x.dtype).name
    if name not in KERNEL_SUFFIX:
        raise GpuError("unsupported", f"qmatmul: no GPU kernels for x of dtype {name}")
    return KERNEL_SUFFIX[name]


def weights(ctx, w, stream):
    """Device copy of the tensor's block bytes, resident across calls while the tensor lives: the
    tensor is immutable by contract, so its bytes are kept as the owner's guarantee says."""
    return ctx.upload(w.data, stream, immutable=True)


def _aligned(ctx, x, stream):
    """x on the device with its base aligned for the mat-vec's four-element loads (16 bytes of float32,
    8 of a half type): our own uploads always are; a foreign device array that is not gets copied once
    on the device."""
    x = ctx.upload(x, stream)
    if int(x.ptr) % (4 * np.dtype(x.dtype).itemsize) == 0:
        return x
    copy = ctx.empty(x.shape, x.dtype, stream)
    ctx.rt.memcpy_dtod(copy.ptr, x.ptr, x.nbytes, int(stream or 0))
    return copy


@pure_plan
def dequantize_launches(nblocks: int, qtype: str, multiprocessors: int) -> list[Launch]:
    """One thread per 4 outputs: 8 per quant block."""
    return [Launch.of("quant", f"hs_dequantize_{qtype}", grid_stride_blocks(nblocks * 8, _DEQ_BLOCK, multiprocessors),
                      _DEQ_BLOCK)]


@pure_plan
def qmatmul_launches(n: int, m: int, qtype: str, warp: int, suffix: str = "f32") -> list[Launch]:
    """W (n, k) x X (k, m): the mat-vec kernels (a warp per _MATVEC_ROWS rows) for m <= _MATVEC_COLS,
    else 64x64 output tiles on grid (n / 64, m / 64). `suffix`, x's element type, only renames the
    kernel: the geometry is the same for every type."""
    rows_per_block = (_MATVEC_BLOCK // warp) * _MATVEC_ROWS
    if m == 1:
        return [Launch.of("quant", f"hs_qmatvec_{suffix}_{qtype}", -(-n // rows_per_block), _MATVEC_BLOCK)]
    if m <= _MATVEC_COLS:
        return [Launch.of("quant", f"hs_qmatvec8_{suffix}_{qtype}", -(-n // rows_per_block), _MATVEC_BLOCK)]
    return [Launch.of("quant", f"hs_qmatmat_{suffix}_{qtype}", (-(-n // _TILE), -(-m // _TILE)), 256)]


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
    """The launches for this call ([] for an empty one); GpuError("unsupported") for a quant type or an
    x dtype without kernels, even when the call is empty (the entry point's dtype check)."""
    w, x = call.args
    n, k = w.shape
    m = 1 if len(x.shape) == 1 else int(x.shape[1])
    qtype, suffix = _suffix(w), _x_suffix(x)
    return qmatmul_launches(n, m, qtype, ctx.warp_size, suffix) if n * m * k else []


def qmatmul(ctx, call, stream):
    w, x = call.args
    # checked before the weights go up: a launch the device refuses (m columns beyond grid y) costs nothing
    plan = ctx.check_launches(qmatmul_plan(ctx, call))
    n, k = w.shape
    vector = len(x.shape) == 1
    m = 1 if vector else int(x.shape[1])
    out = ctx.empty((n,) if vector else (n, m), np.dtype(x.dtype), stream)   # y in x's type
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
        for suffix in KERNEL_SUFFIX.values():
            for m in (1, 2, 9):
                plans += qmatmul_launches(100, m, qtype, warp, suffix)
    return plans
