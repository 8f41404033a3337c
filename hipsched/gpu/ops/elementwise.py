"""Launch glue for add, scale and softmax (src_c/hip/{elementwise,softmax}.hip), float32, float16 and
bfloat16 (Call.dtype): the kernels of that element type are launched, and results have the inputs'
dtype."""
from __future__ import annotations

from ctypes import c_float, c_int32, c_int64

from ...errors import GpuError
from ..launch.context import Launch, grid_stride_blocks, pure_plan
from .common import (BLOCK, KERNEL_SUFFIX, _aligned, _empty_result, _param, _size, _will_align, kernel_suffix,
                     np_dtype)

# Rows up to this length are kept in shared memory by the softmax kernel (48 KiB, less its scratch).
SOFTMAX_CACHED_LEN = 11 * 1024


@pure_plan
def add_launches(n: int, nb: int, vec: bool, multiprocessors: int, suffix: str = "f32") -> list[Launch]:
    """a (n elements) + b (nb elements, repeating): 4-element work items when `vec`."""
    work = n // 4 if vec else n
    name = ("hs_add_" if nb == n else "hs_add_bias_") + suffix + ("_v4" if vec else "")
    return [Launch.of("elementwise", name, grid_stride_blocks(work, BLOCK, multiprocessors), BLOCK)]


def add_plan(ctx, call) -> list[Launch]:
    """The launches add makes for this call ([] for an empty one); GpuError("unsupported") for a call
    the kernels do not take."""
    a_in, b_in = call.args[0], call.args[1]
    suffix = kernel_suffix(call)
    n, nb = _size(a_in.shape), _size(b_in.shape)
    if n == 0:
        return []
    if nb == 0 or n % nb:
        raise GpuError("unsupported", f"add: b {tuple(b_in.shape)} does not tile a {tuple(a_in.shape)}")
    return add_launches(n, nb, n % 4 == 0 and nb % 4 == 0 and _will_align(a_in, b_in), ctx.multiprocessors, suffix)


def add(ctx, call, stream):
    a_in, b_in = call.args[0], call.args[1]
    plan = ctx.check_launches(add_plan(ctx, call))
    dtype, suffix = np_dtype(call.dtype), kernel_suffix(call)
    if not plan:
        return _empty_result(ctx, call, a_in.shape, dtype, stream)
    (launch,) = plan
    n, nb = _size(a_in.shape), _size(b_in.shape)
    vec = launch.kernel.endswith("_v4")
    a, b = ctx.upload(a_in, stream), ctx.upload(b_in, stream)
    y = ctx.empty(a_in.shape, dtype, stream)
    if vec and not _aligned(a, b, y):  # not for hipsched's own allocations; stay safe for any runtime
        vec = False
        (launch,) = add_launches(n, nb, vec, ctx.multiprocessors, suffix)
    work = n // 4 if vec else n
    if nb == n:
        args = (a, b, y, c_int64(work))
    else:
        args = (a, b, y, c_int64(work), c_int64(nb // 4 if vec else nb))
    ctx.run(launch, args, stream)
    return ctx.finish(y, call, stream)


@pure_plan
def scale_launches(n: int, vec: bool, multiprocessors: int, suffix: str = "f32") -> list[Launch]:
    work = n // 4 if vec else n
    return [Launch.of("elementwise", f"hs_scale_{suffix}" + ("_v4" if vec else ""),
                      grid_stride_blocks(work, BLOCK, multiprocessors), BLOCK)]


def scale_plan(ctx, call) -> list[Launch]:
    x_in = call.args[0]
    suffix = kernel_suffix(call)
    n = _size(x_in.shape)
    return scale_launches(n, n % 4 == 0 and _will_align(x_in), ctx.multiprocessors, suffix) if n else []


def scale(ctx, call, stream):
    x_in = call.args[0]
    alpha = float(_param(call, 1, "alpha"))
    plan = ctx.check_launches(scale_plan(ctx, call))
    dtype, suffix = np_dtype(call.dtype), kernel_suffix(call)
    if not plan:
        return _empty_result(ctx, call, x_in.shape, dtype, stream)
    (launch,) = plan
    n = _size(x_in.shape)
    vec = launch.kernel.endswith("_v4")
    x = ctx.upload(x_in, stream)
    y = ctx.empty(x_in.shape, dtype, stream)
    if vec and not _aligned(x, y):
        vec = False
        (launch,) = scale_launches(n, vec, ctx.multiprocessors, suffix)
    work = n // 4 if vec else n
    # c_float rounds alpha to float32 exactly as NumPy does for `float32_array * python_float`; for the
    # half types the product of the widened x and that float32 alpha is rounded once, as PyTorch does
    # (NumPy would round alpha to float16 first)
    ctx.run(launch, (x, y, c_float(alpha), c_int64(work)), stream)
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
    vec = inner == 1 and length % 4 == 0 and _will_align(call.args[0])
    return softmax_launches(outer, length, inner, vec, ctx.multiprocessors, kernel_suffix(call))


def softmax(ctx, call, stream):
    x_in = call.args[0]
    shape = tuple(x_in.shape)
    plan = ctx.check_launches(softmax_plan(ctx, call))
    dtype, suffix = np_dtype(call.dtype), kernel_suffix(call)
    if not plan:
        return _empty_result(ctx, call, shape, dtype, stream)
    (launch,) = plan
    outer, length, inner = _softmax_layout(call)
    vec = launch.kernel.endswith("_v4")
    x = ctx.upload(x_in, stream)
    y = ctx.empty(shape, dtype, stream)
    if vec and not _aligned(x, y):
        (launch,) = softmax_launches(outer, length, inner, False, ctx.multiprocessors, suffix)
    if inner == 1:
        cached = launch.shared > 0
        ctx.run(launch, (x, y, c_int64(outer), c_int64(length), c_int32(int(cached))), stream)
    else:
        ctx.run(launch, (x, y, c_int64(outer), c_int64(length), c_int64(inner)), stream)
    return ctx.finish(y, call, stream)


@pure_plan
def softmax_launches(outer: int, length: int, inner: int, vec: bool, multiprocessors: int,
                     suffix: str = "f32") -> list[Launch]:
    """Softmax over the middle axis of an (outer, length, inner) layout. inner == 1: one block per row,
    the row kept in dynamic shared memory when it fits (`vec`: 4-element loads), as float32 whatever
    the element type (4 bytes per element)."""
    if inner == 1:
        cached = length <= SOFTMAX_CACHED_LEN
        items = length // 4 if vec else length  # per row, what the block's threads stride over
        block = 512 if items >= 4096 else (256 if items >= 512 else 64)
        grid = min(outer, 1 << 20)  # the kernel strides over further rows
        return [Launch.of("softmax", f"hs_softmax_rows_{suffix}" + ("_v4" if vec else ""), grid, block,
                          length * 4 if cached else 0)]
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
            for length in (1, 4, 511, 512, 2044, 2048, 4095, 4096, SOFTMAX_CACHED_LEN, SOFTMAX_CACHED_LEN + 4,
                           16384, 1 << 20):
                plans += softmax_launches(8, length, 1, vec, multiprocessors, sfx)
    for sfx in KERNEL_SUFFIX.values():
        plans += softmax_launches(8, 100, 8, False, multiprocessors, sfx)
    return plans
