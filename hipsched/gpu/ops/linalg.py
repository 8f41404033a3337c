"""Launch glue for matmul (src_c/hip/matmul.hip): the vendor BLAS where one is loaded and multiplies
Call.dtype, else the tiled kernel, float32, float16 and bfloat16; the result has the inputs' dtype."""
from __future__ import annotations

from ctypes import c_int32, c_int64

from ...errors import GpuError
from ..compilation.kernel_constants import HS_MM_THREADS, HS_MM_TILE
from ..launch.context import Launch, pure_plan
from .common import KERNEL_SUFFIX, _size, kernel_suffix, np_dtype


def _matmul_shapes(a_shape, b_shape):
    """np.matmul's shape rules for our kernels: batch dims equal, or present on one side only.
    Returns (batch, M, N, K, stride_a, stride_b, out_shape)."""
    a2 = (1,) + tuple(a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b2 = tuple(b_shape) + (1,) if len(b_shape) == 1 else tuple(b_shape)
    M, K = a2[-2], a2[-1]
    K2, N = b2[-2], b2[-1]
    if K != K2:
        raise GpuError("unsupported", f"matmul: shapes {tuple(a_shape)} and {tuple(b_shape)} do not align")
    ba, bb = a2[:-2], b2[:-2]
    if ba and bb and ba != bb:
        raise GpuError("unsupported", f"matmul: batch dims {ba} and {bb} broadcast only when equal or one-sided")
    batch_shape = ba or bb
    batch = _size(batch_shape)
    out = batch_shape + ((M,) if len(a_shape) > 1 else ()) + ((N,) if len(b_shape) > 1 else ())
    return batch, M, N, K, (M * K if ba else 0), (K * N if bb else 0), out


def matmul_plan(ctx, call) -> list[Launch]:
    """The tiled kernel's launch, or [] when nothing is launched (an empty result or sum) or the vendor
    BLAS does the work (it takes any shape the kernel would; for the half types, where it has a
    mixed-precision GEMM)."""
    suffix = kernel_suffix(call)
    batch, M, N, K, _, _, _ = _matmul_shapes(tuple(call.args[0].shape), tuple(call.args[1].shape))
    if batch * M * N * K == 0 or _blas_for(ctx, call) is not None:
        return []
    return matmul_launches(batch, M, N, K, suffix)


def _blas_for(ctx, call):
    """The vendor BLAS if it multiplies call.dtype, else None."""
    blas = ctx.blas()
    if blas is None:
        return None
    supports = getattr(blas, "supports_dtype", None)
    dtype = getattr(call, "dtype", "float32") or "float32"
    return blas if dtype == "float32" or (supports is not None and supports(dtype)) else None


def matmul(ctx, call, stream):
    a_in, b_in = call.args[0], call.args[1]
    batch, M, N, K, sa, sb, out_shape = _matmul_shapes(tuple(a_in.shape), tuple(b_in.shape))
    plan = ctx.planned(call, matmul_plan)
    c = ctx.empty(out_shape, np_dtype(call.dtype), stream)
    if c.size == 0:
        return ctx.finish(c, call, stream)
    if K == 0:  # an empty sum: zeros, as NumPy gives
        ctx.rt.memset(c.ptr, 0, c.nbytes, int(stream or 0))
        return ctx.finish(c, call, stream)
    blas = None if plan else _blas_for(ctx, call)
    a, b = ctx.upload(a_in, stream), ctx.upload(b_in, stream)
    if blas is not None and call.dtype not in (None, "float32"):
        blas.gemm_ex_rowmajor(a, b, c, M, N, K, batch, sa, sb, M * N, stream, call.dtype)
    elif blas is not None:
        blas.sgemm_rowmajor(a, b, c, M, N, K, batch, sa, sb, M * N, stream)
    else:
        ctx.run(plan[0], (a, b, c, c_int32(M), c_int32(N), c_int32(K), c_int64(sa), c_int64(sb), c_int64(M * N)),
                stream)
    return ctx.finish(c, call, stream)


@pure_plan
def matmul_launches(batch: int, M: int, N: int, K: int, suffix: str = "f32") -> list[Launch]:
    """The tiled fallback kernel (no vendor BLAS): a HS_MM_TILE square tile of C per block, batch on grid z."""
    if max(M, N, K) >= 2**31:  # the kernel takes int dimensions
        raise GpuError("unsupported", f"matmul: {batch}x{M}x{N}x{K} exceeds the fallback kernel's 32-bit sizes")
    return [Launch.of("matmul", f"hs_matmul_{suffix}", (-(-N // HS_MM_TILE), -(-M // HS_MM_TILE), batch), HS_MM_THREADS)]


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """Plans for shapes that reach every kernel here at every block size it is launched with (the
    compile report's occupancy rows)."""
    plans = []
    for sfx in KERNEL_SUFFIX.values():
        plans += matmul_launches(2, 100, 100, 100, sfx)
    return plans
