"""GPU launch glue for the GGUF quant ops (kernels: src_c/hip/quant.hip).

The block bytes of a QuantizedTensor go through the resident cache keyed on `w.data` (the tensor is
immutable by contract and returns the same read-only array every time), so weights reused across calls
are uploaded once, in our own device layout (`device_layout`: repacked on the host with NumPy as they
go up, so the host bytes, what `dequantize` and the CPU engine read, stay gguf's). qmatmul's x is
float32, float16 or bfloat16, read in its own type (the kernels of x's element type are launched,
whatever Call.dtype says) and never re-quantized: the product accumulates in float32 and comes back in
x's dtype, rounded once, as on the CPU. More than 16 columns of a half x on a target with matrix cores
(common.has_mma) go to the tensor-core tiles, hs_qmatmat_{f16,bf16}_mma_<qtype>: the quants, exact in 16
bits, times x, each block's float32 sum then scaled by its d, so the product is the same float32
accumulation of exact products (quant.hip, docs/design/kernels.md). dequantize gives float32."""
from __future__ import annotations

import ctypes

import numpy as np

from ...errors import GpuError
from ...gguf_blocks import BLOCK_BYTES, QK, SUPERBLOCK, device_bytes, row_blocks, row_superblocks
from ..compilation.kernel_constants import (HSQ_LANES, HSQ_MC, HSQ_MM_THREADS, HSQ_MMA_WARPS, HSQ_MN_THREADS,
                                            HSQ_MV_THREADS, HSQ_NG, HSQ_NR, HSQ_NRN, HSQ_SBQ, HSQ_TM, HSQ_TN)
from ..launch.context import Launch, grid_stride_blocks, pure_plan
from .common import KERNEL_SUFFIX, has_mma

_DEQ_BLOCK = 256
_MATVEC_MAX_COLS = 16    # up to this many columns of x go through the mat-vec kernels; more, the tiles


def device_layout(blocks: np.ndarray, qtype: str) -> np.ndarray:
    """The device layout of (n, row bytes) gguf `qtype` blocks, as one uint8 array (quant.hip's header
    describes it): rows of superblocks of SUPERBLOCK[qtype] blocks, each HSQ_SBQ quant bytes (lane l's 16
    bytes holding weights 128 g + 4 l + c of groups g, Q8_0 biased by 128, Q4_0 two groups per word in
    its low and high nibbles) then the blocks' fp16 scales in the order (l / 8, g). The last
    superblock of a row is padded with zero weights (quant 0, scale +0)."""
    n, rb = blocks.shape
    bb, sb, ng = BLOCK_BYTES[qtype], SUPERBLOCK[qtype], HSQ_NG[qtype]
    nb = rb // bb
    nsb = row_superblocks(nb * QK, qtype)
    blk = np.ascontiguousarray(blocks).reshape(n, nb, bb)
    scales = np.zeros((n, nsb * sb, 2), np.uint8)
    scales[:, :nb] = blk[:, :, :2]
    # every group of 4 weights as one uint32 (its 4 bytes, or 4 nibbles in the low halves of 4 bytes),
    # in the row's order: moving 4-byte words rather than bytes keeps this a few passes over the bytes
    if qtype == "q8_0":
        q = np.full((n, nsb * sb, QK), 0x80, np.uint8)      # q + 128; padding: q = 0
        q[:, :nb] = blk[:, :, 2:]
        q[:, :nb] ^= 0x80
        groups = q.view(np.uint32)                          # (n, blocks, 8 groups)
    else:
        packed = np.empty((n, nb, 16), np.uint8)
        packed[:] = blk[:, :, 2:]
        words = packed.view(np.uint32)                      # word w: elements 4w.. (low), 16+4w.. (high)
        groups = np.full((n, nsb * sb, 8), 0x08080808, np.uint32)   # padding: q - 8 = 0
        groups[:, :nb, :4] = words & 0x0F0F0F0F
        groups[:, :nb, 4:] = (words >> 4) & 0x0F0F0F0F
    # group index within a superblock = 32 g + l (weight 128 g + 4 l)  ->  lane-major (l, g)
    lanes = groups.reshape(n, nsb, ng, HSQ_LANES).transpose(0, 1, 3, 2)
    if qtype == "q4_0":   # groups 2v and 2v+1 share word v: low and high nibbles
        lanes = lanes[..., 0::2] | (lanes[..., 1::2] << 4)
    quants = np.ascontiguousarray(lanes).view(np.uint8).reshape(n, nsb, HSQ_SBQ)
    # block 4 g + l/8 at scale position (l/8) ng + g
    scales = scales.reshape(n, nsb, ng, 4, 2).transpose(0, 1, 3, 2, 4)
    out = np.concatenate([quants, scales.reshape(n, nsb, -1)], axis=2)
    return out.reshape(-1)


def host_layout(dev: np.ndarray, n: int, k: int, qtype: str) -> np.ndarray:
    """The inverse of device_layout: (n, row bytes) gguf blocks from the device layout's bytes."""
    bb, sb, ng = BLOCK_BYTES[qtype], SUPERBLOCK[qtype], HSQ_NG[qtype]
    nb, nsb = row_blocks(k), row_superblocks(k, qtype)
    d = np.asarray(dev, np.uint8).reshape(n, nsb, -1)
    q = d[:, :, :HSQ_SBQ].reshape(n, nsb, HSQ_LANES, -1)
    if qtype == "q4_0":
        w = q.reshape(n, nsb, HSQ_LANES, ng // 2, 1, 4)
        q = np.concatenate([w & 0x0F, w >> 4], axis=4).reshape(n, nsb, HSQ_LANES, ng, 4)
    q = q.reshape(n, nsb, HSQ_LANES, ng, 4).transpose(0, 1, 3, 2, 4).reshape(n, nsb * sb, QK)[:, :nb]
    scales = d[:, :, HSQ_SBQ:].reshape(n, nsb, 4, ng, 2).transpose(0, 1, 3, 2, 4).reshape(n, nsb * sb, 2)[:, :nb]
    if qtype == "q8_0":
        body = q ^ 0x80
    else:
        body = q[:, :, :16] | (q[:, :, 16:] << 4)
    return np.concatenate([scales, body], axis=2).reshape(n, nb * bb)


# one packing function per quant type, the same objects every call: the resident cache serves a kept
# copy only to the pack it was made with
class _RowPack:
    """device_layout for one quant type, as the resident cache's `pack`: a row-wise layout, so a row range
    of a kept tensor's blocks (the GPU's rows of a qmatmul split across processors) is a byte range of
    its device copy: host row r starts at r * device_row_bytes(host row bytes)."""

    def __init__(self, qtype):
        self.qtype = qtype

    def __call__(self, blocks):
        return device_layout(blocks, self.qtype)

    def device_row_bytes(self, host_row_bytes: int) -> int:
        return device_bytes(1, host_row_bytes // BLOCK_BYTES[self.qtype] * QK, self.qtype)


_PACK = {qt: _RowPack(qt) for qt in BLOCK_BYTES}


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
    """Device copy of the tensor's blocks in the device layout, resident across calls while the tensor
    lives: the tensor is immutable by contract, so its bytes are kept as the owner's guarantee says."""
    return ctx.upload(w.data, stream, immutable=True, pack=_PACK[w.qtype])


def _is_aligned(x) -> bool:
    """Whether device array x's base takes the mat-vec's four-element loads."""
    return int(x.ptr) % (4 * np.dtype(x.dtype).itemsize) == 0


def _aligned(ctx, x, stream):
    """x on the device with its base aligned for the mat-vec's four-element loads (16 bytes of float32,
    8 of a half type): our own uploads always are; a foreign device array that is not gets copied once
    on the device."""
    x = ctx.upload(x, stream)
    if _is_aligned(x):
        return x
    copy = ctx.empty(x.shape, x.dtype, stream)
    ctx.rt.memcpy_dtod(copy.ptr, x.ptr, x.nbytes, int(stream or 0))
    return copy


@pure_plan
def dequantize_launches(n: int, k: int, qtype: str, multiprocessors: int) -> list[Launch]:
    """One thread per lane chunk of a superblock (32 per superblock, 16 or 32 weights each)."""
    chunks = n * row_superblocks(k, qtype) * HSQ_LANES
    return [Launch.of("quant", f"hs_dequantize_{qtype}", grid_stride_blocks(chunks, _DEQ_BLOCK, multiprocessors),
                      _DEQ_BLOCK)]


@pure_plan
def qmatmul_launches(n: int, m: int, qtype: str, warp: int, suffix: str = "f32", mma: bool = False) -> list[Launch]:
    """W (n, k) x X (k, m): the one-column mat-vec (a team of 32 lanes per HSQ_NR rows) for m == 1, the
    several-column one (teams of HSQ_NRN rows, grid y: chunks of HSQ_MC columns) up to _MATVEC_MAX_COLS,
    else HSQ_TM x HSQ_TN output tiles: on the matrix cores when `mma` (the target has them) and x is a half
    type (HSQ_MMA_WARPS warps of `warp` lanes), else SIMT (HSQ_MM_THREADS threads). The
    mat-vecs' geometry is in teams of 32 lanes whatever the warp size; `suffix`, x's element type, only
    renames those kernels."""
    if m == 1:
        rows_per_block = (HSQ_MV_THREADS // HSQ_LANES) * HSQ_NR
        return [Launch.of("quant", f"hs_qmatvec_{suffix}_{qtype}", -(-n // rows_per_block), HSQ_MV_THREADS)]
    if m <= _MATVEC_MAX_COLS:
        rows_per_block = (HSQ_MN_THREADS // HSQ_LANES) * HSQ_NRN[qtype]
        return [Launch.of("quant", f"hs_qmatvecn_{suffix}_{qtype}", (-(-n // rows_per_block), -(-m // HSQ_MC)),
                          HSQ_MN_THREADS)]
    grid = (-(-n // HSQ_TM), -(-m // HSQ_TN))
    if mma and suffix != "f32":   # a float32 x would be rounded by the matrix cores: SIMT (quant.hip)
        return [Launch.of("quant", f"hs_qmatmat_{suffix}_mma_{qtype}", grid, HSQ_MMA_WARPS * warp)]
    return [Launch.of("quant", f"hs_qmatmat_{suffix}_{qtype}", grid, HSQ_MM_THREADS)]


def dequantize_plan(ctx, call) -> list[Launch]:
    (w,) = call.args
    n, k = w.shape
    return dequantize_launches(n, k, _suffix(w), ctx.multiprocessors) if n * k else []


def _layout_padding(w) -> int:
    """The bytes w's device layout (`weights`) holds beyond its gguf blocks: its rows padded to whole
    superblocks (nothing when k is a multiple of 512 / 1024)."""
    return device_bytes(w.shape[0], w.shape[1], w.qtype) - w.nbytes


def dequantize_scratch(call, multiprocessors: int) -> int:
    """Device bytes the glue allocates beyond the call's input and result (the op spec's device scratch):
    the padding of w's device layout, for a call that uploads it (a nonempty one)."""
    (w,) = call.args
    return _layout_padding(w) if w.shape[0] * w.shape[1] else 0


def dequantize(ctx, call, stream):
    (w,) = call.args
    plan = ctx.planned(call, dequantize_plan)
    n, k = w.shape
    out = ctx.empty((n, k), np.float32, stream)
    if plan:
        ctx.run(plan[0], (weights(ctx, w, stream), out, ctypes.c_int64(n), ctypes.c_int64(k)), stream)
    return ctx.finish(out, call, stream)


def qmatmul_plan(ctx, call) -> list[Launch]:
    """The launches for this call ([] for an empty one); GpuError("unsupported") for a quant type or an
    x dtype without kernels, even when the call is empty (the entry point's dtype check)."""
    w, x = call.args
    n, k = w.shape
    m = 1 if len(x.shape) == 1 else int(x.shape[1])
    qtype, suffix = _suffix(w), _x_suffix(x)
    return qmatmul_launches(n, m, qtype, ctx.warp_size, suffix, has_mma(ctx.arch)) if n * m * k else []


def qmatmul_scratch(call, multiprocessors: int) -> int:
    """Device bytes the glue allocates beyond the call's inputs and result (the op spec's device scratch):
    the padding of w's device layout, for a call that uploads it (none of n, m, k zero), and for a
    matrix-vector product on a device x whose base the four-element loads cannot take, the aligned copy
    of x (`_aligned`)."""
    w, x = call.args
    n, k = w.shape
    m = 1 if len(x.shape) == 1 else int(x.shape[1])
    if n * m * k == 0:
        return 0
    copy = x.nbytes if m == 1 and not isinstance(x, np.ndarray) and not _is_aligned(x) else 0
    return _layout_padding(w) + copy


def qmatmul(ctx, call, stream):
    w, x = call.args
    # checked before the weights go up: a launch the device refuses (m columns beyond grid y) costs nothing
    plan = ctx.planned(call, qmatmul_plan)
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
    elif m <= _MATVEC_MAX_COLS:
        ctx.run(launch, (wd, ctx.upload(x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int32(m)),
                stream)
    else:
        ctx.run(launch, (wd, ctx.upload(x, stream), out, ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int64(m)),
                stream)
    return ctx.finish(out, call, stream)


def report_launches(warp: int, multiprocessors: int, arch: str | None = None) -> list[Launch]:
    """Every quant kernel at the block sizes the glue uses (the compile report's occupancy rows): the
    matrix-core tiles too when `arch` has them. Without an arch only the kernels every target has (the
    names kernel_names finds in quant.hip: the `_mma_` ones exist only where prelude.h's HS_MM16 is)."""
    mma = has_mma(arch)
    plans = []
    for qtype in ("q8_0", "q4_0"):
        plans += dequantize_launches(100, 1024, qtype, multiprocessors)
        for suffix in KERNEL_SUFFIX.values():
            for m in (1, 2, 17):
                plans += qmatmul_launches(100, m, qtype, warp, suffix)
            if mma:
                plans += qmatmul_launches(100, 17, qtype, warp, suffix, mma=True)
    return plans
