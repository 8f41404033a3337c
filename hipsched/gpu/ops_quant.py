"""GPU launch glue for the GGUF quant ops (kernels: src_c/hip/quant.hip).

The block bytes of a QuantizedTensor go through the resident cache keyed on `w.data` (the tensor is
immutable and returns the same array every time), so weights reused across calls are uploaded once.
Results are the float32 product of the dequantized matrix and x, x kept in float32, as on the CPU."""
from __future__ import annotations

import ctypes

import numpy as np

from ..errors import GpuError
from ..ops.quant import BLOCK_BYTES, QK

_DEQ_BLOCK = 256
_MATVEC_BLOCK = 128      # threads; each warp/wavefront owns _MATVEC_ROWS rows
_MATVEC_ROWS = 2         # HSQ_NR in quant.hip
_MATVEC_COLS = 8         # up to this many columns of x go through the mat-vec kernel (MC = 8)
_TILE = 64               # HSQ_TM / HSQ_TN in quant.hip
_MAX_GRID_Y = 65535


def _suffix(w) -> str:
    if w.qtype not in BLOCK_BYTES:
        raise GpuError("unsupported", f"no GPU kernel for quant type {w.qtype!r}")
    return w.qtype  # "q8_0" | "q4_0": kernel names end with it


def weights(ctx, w, stream):
    """Device copy of the tensor's block bytes, resident across calls while the tensor lives."""
    return ctx.upload(w.data, stream)


def _aligned(ctx, x, stream):
    """x on the device with a 16-byte aligned base (the mat-vec reads it as float4): our own uploads
    always are; a foreign device array that is not gets copied once on the device."""
    x = ctx.upload(x, stream)
    if int(x.ptr) % 16 == 0:
        return x
    copy = ctx.empty(x.shape, np.float32, stream)
    ctx.rt.memcpy_dtod(copy.ptr, x.ptr, x.nbytes, int(stream or 0))
    return copy


def dequantize(ctx, call, stream):
    (w,) = call.args
    n, k = w.shape
    out = ctx.empty((n, k), np.float32, stream)
    nblocks = n * k // QK
    if nblocks:
        fn = ctx.function("quant", f"hs_dequantize_{_suffix(w)}")
        ctx.launch(fn, ctx.blocks_for(nblocks * 8, _DEQ_BLOCK), _DEQ_BLOCK,
                   (weights(ctx, w, stream), out, ctypes.c_int64(nblocks)), stream=stream)
    return ctx.finish(out, call, stream)


def qmatmul(ctx, call, stream):
    w, x = call.args
    n, k = w.shape
    vector = len(x.shape) == 1
    m = 1 if vector else int(x.shape[1])
    out = ctx.empty((n,) if vector else (n, m), np.float32, stream)
    if n == 0 or m == 0:
        return ctx.finish(out, call, stream)
    if k == 0:  # empty sums: zeros, as the CPU gives
        ctx.rt.memset(out.ptr, 0, out.nbytes, int(stream or 0))
        return ctx.finish(out, call, stream)
    wd = weights(ctx, w, stream)
    q = _suffix(w)
    rows_per_block = (_MATVEC_BLOCK // ctx.warp_size) * _MATVEC_ROWS
    if m == 1:
        fn = ctx.function("quant", f"hs_qmatvec_{q}")
        ctx.launch(fn, -(-n // rows_per_block), _MATVEC_BLOCK,
                   (wd, _aligned(ctx, x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k)), stream=stream)
    elif m <= _MATVEC_COLS:
        fn = ctx.function("quant", f"hs_qmatvec8_{q}")
        ctx.launch(fn, -(-n // rows_per_block), _MATVEC_BLOCK,
                   (wd, ctx.upload(x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int32(m)),
                   stream=stream)
    else:
        grid_y = -(-m // _TILE)
        if grid_y > _MAX_GRID_Y:
            raise GpuError("unsupported", f"qmatmul: m = {m} columns exceeds the GPU kernel's grid limit "
                                          f"({_MAX_GRID_Y * _TILE})")
        fn = ctx.function("quant", f"hs_qmatmat_{q}")
        ctx.launch(fn, (-(-n // _TILE), grid_y), 256,
                   (wd, ctx.upload(x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int64(m)),
                   stream=stream)
    return ctx.finish(out, call, stream)
