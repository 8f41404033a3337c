"""Launch glue for add, scale and softmax (src_c/hip/{elementwise,softmax}.hip), float32, float16 and
bfloat16 (Call.dtype): the kernels of that element type are launched, and results have the inputs'
dtype. Where every pointer is 16-byte aligned the 16-byte kernels run (_v8 elementwise, softmax rows in
registers: docs/design/kernels.md, "Bandwidth-bound kernels"); otherwise the scalar ones."""
from __future__ import annotations

from ctypes import c_float, c_int32, c_int64

from ...broadcast import bias_fits
from ...errors import GpuError
from ..compilation.kernel_constants import HS_SOFTMAX_REGS_THREADS
from ..launch.context import Launch, grid_stride_blocks, pure_plan
from .common import (BLOCK, KERNEL_SUFFIX, RESIDENT_BLOCKS_V8, _aligned, _empty_result, _param, _size, _will_align, bandwidth_blocks,
                     kernel_suffix, np_dtype, row_regs_geometry, row_regs_max_len)

# Rows up to this length are kept in shared memory by the softmax kernel (48 KiB, less its scratch).
SOFTMAX_CACHED_LEN = 11 * 1024
# Rows up to this length (and a multiple of 8) are held in registers by hs_softmax_regs_* and read once,
# in blocks up to HS_SOFTMAX_REGS_THREADS.
SOFTMAX_REGS_MAX_LEN = row_regs_max_len(HS_SOFTMAX_REGS_THREADS)


def _v8_items(n: int) -> int:
    """Work items of a _v8 kernel over n elements: each thread takes two 8-element packs per iteration
    (the n % 8 tail is a handful of scalar steps on top)."""
    return -(-(n // 8) // 2)


@pure_plan
def add_launches(n: int, nb: int, vec: bool, multiprocessors: int, suffix: str = "f32") -> list[Launch]:
    """a (n elements) + b (nb elements, repeating). `vec`: every pointer is 16-byte aligned, so the
    16-byte kernels can run (for a bias, also needs nb % 8 == 0, b's packs then line up with a's)."""
    vec = vec and (nb == n or nb % 8 == 0)
    name = ("hs_add_" if nb == n else "hs_add_bias_") + suffix
    if vec:
        return [Launch.of("elementwise", name + "_v8", bandwidth_blocks(_v8_items(n), multiprocessors,
                                                                        RESIDENT_BLOCKS_V8), BLOCK)]
    return [Launch.of("elementwise", name, bandwidth_blocks(n, multiprocessors), BLOCK)]


def add_plan(ctx, call) -> list[Launch]:
    """The launches add makes for this call ([] for an empty one); GpuError("unsupported") for a call
    the kernels do not take."""
    a_in, b_in = call.args[0], call.args[1]
    suffix = kernel_suffix(call)
    n, nb = _size(a_in.shape), _size(b_in.shape)
    if not bias_fits(a_in.shape, b_in.shape):
        raise GpuError("unsupported", f"add: b {tuple(b_in.shape)} is neither a's shape {tuple(a_in.shape)} "
                                      "nor a trailing part of it")
    if n == 0:
        return []
    return add_launches(n, nb, _will_align(a_in, b_in), ctx.multiprocessors, suffix)


def add(ctx, call, stream):
    a_in, b_in = call.args[0], call.args[1]
    plan = ctx.planned(call, add_plan)
    dtype, suffix = np_dtype(call.dtype), kernel_suffix(call)
    if not plan:
        return _empty_result(ctx, call, a_in.shape, dtype, stream)
    (launch,) = plan
    n, nb = _size(a_in.shape), _size(b_in.shape)
    a, b = ctx.upload(a_in, stream), ctx.upload(b_in, stream)
    y = ctx.empty(a_in.shape, dtype, stream)
    if launch.kernel.endswith("_v8") and not _aligned(a, b, y):   # not for hipsched's own allocations
        (launch,) = add_launches(n, nb, False, ctx.multiprocessors, suffix)
    vec = launch.kernel.endswith("_v8")
    if nb == n:
        args = (a, b, y, c_int64(n))
    elif vec:
        args = (a, b, y, c_int64(n // 8), c_int64(nb // 8))
    else:
        args = (a, b, y, c_int64(n), c_int64(nb))
    ctx.run(launch, args, stream)
    return ctx.finish(y, call, stream)


@pure_plan
def scale_launches(n: int, vec: bool, multiprocessors: int, suffix: str = "f32") -> list[Launch]:
    """`vec`: x and y 16-byte aligned (the _v8 kernel takes any n, its tail element by element)."""
    if vec:
        return [Launch.of("elementwise", f"hs_scale_{suffix}_v8",
                          bandwidth_blocks(_v8_items(n), multiprocessors, RESIDENT_BLOCKS_V8), BLOCK)]
    return [Launch.of("elementwise", f"hs_scale_{suffix}", bandwidth_blocks(n, multiprocessors), BLOCK)]


def scale_plan(ctx, call) -> list[Launch]:
    x_in = call.args[0]
    suffix = kernel_suffix(call)
    n = _size(x_in.shape)
    return scale_launches(n, _will_align(x_in), ctx.multiprocessors, suffix) if n else []


def scale(ctx, call, stream):
    x_in = call.args[0]
    alpha = float(_param(call, 1, "alpha"))
    plan = ctx.planned(call, scale_plan)
    dtype, suffix = np_dtype(call.dtype), kernel_suffix(call)
    if not plan:
        return _empty_result(ctx, call, x_in.shape, dtype, stream)
    (launch,) = plan
    n = _size(x_in.shape)
    x = ctx.upload(x_in, stream)
    y = ctx.empty(x_in.shape, dtype, stream)
    if launch.kernel.endswith("_v8") and not _aligned(x, y):
        (launch,) = scale_launches(n, False, ctx.multiprocessors, suffix)
    # c_float rounds alpha to float32 exactly as NumPy does for `float32_array * python_float`; for the
    # half types the product of the widened x and that float32 alpha is rounded once, as PyTorch does
    # (NumPy would round alpha to float16 first)
    ctx.run(launch, (x, y, c_float(alpha), c_int64(n)), stream)
    return ctx.finish(y, call, stream)


def _softmax_layout(call):
    """(outer, length, inner) of the softmax axis of call's x."""
    shape = tuple(call.args[0].shape)
    axis = int(call.params.get("axis", call.args[1] if len(call.args) > 1 else -1))
    if not shape:
        raise GpuError("unsupported", "softmax of a 0-d array")
    if not -len(shape) <= axis < len(shape):
        raise GpuError("unsupported", f"softmax: axis {axis} out of range for shape {shape}")
    axis %= len(shape)
    return _size(shape[:axis]), shape[axis], _size(shape[axis + 1:])


def softmax_plan(ctx, call) -> list[Launch]:
    outer, length, inner = _softmax_layout(call)
    if outer * length * inner == 0:
        return []
    vec = inner == 1 and _will_align(call.args[0])
    return softmax_launches(outer, length, inner, vec, ctx.multiprocessors, kernel_suffix(call))


def softmax(ctx, call, stream):
    x_in = call.args[0]
    shape = tuple(x_in.shape)
    plan = ctx.planned(call, softmax_plan)
    dtype, suffix = np_dtype(call.dtype), kernel_suffix(call)
    if not plan:
        return _empty_result(ctx, call, shape, dtype, stream)
    (launch,) = plan
    outer, length, inner = _softmax_layout(call)
    x = ctx.upload(x_in, stream)
    y = ctx.empty(shape, dtype, stream)
    if inner == 1 and launch.kernel != f"hs_softmax_rows_{suffix}" and not _aligned(x, y):
        (launch,) = softmax_launches(outer, length, inner, False, ctx.multiprocessors, suffix)
    if launch.kernel.startswith("hs_softmax_regs_"):
        ctx.run(launch, (x, y, c_int64(outer), c_int64(length)), stream)
    elif inner == 1:
        cached = launch.shared > 0
        ctx.run(launch, (x, y, c_int64(outer), c_int64(length), c_int32(int(cached))), stream)
    else:
        ctx.run(launch, (x, y, c_int64(outer), c_int64(length), c_int64(inner)), stream)
    return ctx.finish(y, call, stream)


@pure_plan
def softmax_launches(outer: int, length: int, inner: int, vec: bool, multiprocessors: int,
                     suffix: str = "f32") -> list[Launch]:
    """Softmax over the middle axis of an (outer, length, inner) layout. inner == 1: one block per row.
    `vec` (x and y 16-byte aligned) and length % 8 == 0 up to SOFTMAX_REGS_MAX_LEN: the row in registers,
    read once. Otherwise the row kept in dynamic shared memory when it fits, as float32 whatever the
    element type (4 bytes per element), 8 elements per access when `vec` and length % 8 == 0 (the
    longer rows: 16-byte packs), 4 when length % 4 == 0."""
    if inner == 1:
        grid = min(outer, 1 << 20)  # the kernel strides over further rows
        regs = row_regs_geometry(length, HS_SOFTMAX_REGS_THREADS) if vec and length % 8 == 0 else None
        if regs is not None:
            packs, block = regs
            return [Launch.of("softmax", f"hs_softmax_regs_{suffix}_p{packs}", grid, block)]
        width = (8 if length % 8 == 0 else 4 if length % 4 == 0 else 1) if vec else 1
        cached = length <= SOFTMAX_CACHED_LEN
        items = length // width  # per row, what the block's threads stride over
        block = 512 if items >= 4096 else (256 if items >= 512 else 64)
        return [Launch.of("softmax", f"hs_softmax_rows_{suffix}" + (f"_v{width}" if width > 1 else ""), grid,
                          block, length * 4 if cached else 0)]
    return [Launch.of("softmax", f"hs_softmax_strided_{suffix}",
                      grid_stride_blocks(outer * inner, BLOCK, multiprocessors), BLOCK)]


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """Plans for shapes that reach every kernel here at every block size it is launched with (the
    compile report's occupancy rows)."""
    plans = []
    for vec in (False, True):
        for sfx in KERNEL_SUFFIX.values():
            plans += add_launches(1024, 1024, vec, multiprocessors, sfx)
            plans += add_launches(1024, 64, vec, multiprocessors, sfx)
            plans += scale_launches(1024, vec, multiprocessors, sfx)
            # aligned: the register kernel at 64 .. 1024 threads (512 .. SOFTMAX_REGS_MAX_LEN), the 4-wide
            # shared-memory one for lengths of 4 (mod 8) and past the register kernel's reach
            for length in (1, 4, 12, 511, 512, 2044, 2048, 4095, 4096, 8192, SOFTMAX_CACHED_LEN - 4,
                           SOFTMAX_CACHED_LEN, SOFTMAX_CACHED_LEN + 4, 16384, SOFTMAX_REGS_MAX_LEN,
                           SOFTMAX_REGS_MAX_LEN + 4, 1 << 20):
                plans += softmax_launches(8, length, 1, vec, multiprocessors, sfx)
    for sfx in KERNEL_SUFFIX.values():
        plans += softmax_launches(8, 100, 8, False, multiprocessors, sfx)
    return plans
