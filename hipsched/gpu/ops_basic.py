"""Launch glue for add, scale, softmax, cosine_similarity, top_k and matmul (src_c/hip/{elementwise,
softmax,similarity,matmul}.hip). Each function is `op(ctx, call, stream)` on a validated Call (see
hipsched/ops): inputs are float32 C-contiguous host arrays or DeviceArrays, and the result comes back
where the inputs live through ctx.finish."""
from __future__ import annotations

from ctypes import c_float, c_int32, c_int64

import numpy as np

from ..errors import GpuError

BLOCK = 256
# Rows up to this length are kept in shared memory by the softmax kernel (48 KiB, less its scratch).
SOFTMAX_CACHED_LEN = 11 * 1024
# Must match HS_TOPK_SEG / HS_TOPK_THREADS in similarity.hip. k above half a segment would make the
# multi-pass selection stall, so larger k is not offered on the GPU (the CPU takes those calls).
TOPK_SEG = 2048
TOPK_THREADS = 256
TOPK_MAX_K = TOPK_SEG // 2
# Queries scored per pass over T by the multi-query cosine kernel.
COSINE_MQ = 8


def _param(call, index, name):
    """A scalar given either positionally (call.args) or as a keyword (call.params)."""
    if name in call.params:
        return call.params[name]
    if len(call.args) > index:
        return call.args[index]
    raise GpuError("unsupported", f"{call.op}: missing parameter {name!r}")


def _aligned(*arrays, multiple=16) -> bool:
    return all(int(a.ptr) % multiple == 0 for a in arrays)


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _empty_result(ctx, call, shape, dtype, stream):
    out = ctx.empty(shape, dtype, stream)
    return ctx.finish(out, call, stream)


# ---------------------------------------------------------------------------------------- elementwise

def add(ctx, call, stream):
    a_in, b_in = call.args[0], call.args[1]
    n, nb = _size(a_in.shape), _size(b_in.shape)
    if n == 0:
        return _empty_result(ctx, call, a_in.shape, np.float32, stream)
    if nb == 0 or n % nb:
        raise GpuError("unsupported", f"add: b {tuple(b_in.shape)} does not tile a {tuple(a_in.shape)}")
    a, b = ctx.upload(a_in, stream), ctx.upload(b_in, stream)
    y = ctx.empty(a_in.shape, np.float32, stream)
    vec = n % 4 == 0 and nb % 4 == 0 and _aligned(a, b, y)
    work = n // 4 if vec else n
    grid = ctx.blocks_for(work, BLOCK)
    if nb == n:
        name = "hs_add_f32_v4" if vec else "hs_add_f32"
        args = (a, b, y, c_int64(work))
    else:
        name = "hs_add_bias_f32_v4" if vec else "hs_add_bias_f32"
        args = (a, b, y, c_int64(work), c_int64(nb // 4 if vec else nb))
    ctx.launch(ctx.function("elementwise", name), grid, BLOCK, args, stream=stream)
    return ctx.finish(y, call, stream)


def scale(ctx, call, stream):
    x_in = call.args[0]
    alpha = float(_param(call, 1, "alpha"))
    n = _size(x_in.shape)
    if n == 0:
        return _empty_result(ctx, call, x_in.shape, np.float32, stream)
    x = ctx.upload(x_in, stream)
    y = ctx.empty(x_in.shape, np.float32, stream)
    vec = n % 4 == 0 and _aligned(x, y)
    work = n // 4 if vec else n
    # c_float rounds alpha to float32 exactly as NumPy does for `float32_array * python_float`
    ctx.launch(ctx.function("elementwise", "hs_scale_f32_v4" if vec else "hs_scale_f32"),
               ctx.blocks_for(work, BLOCK), BLOCK, (x, y, c_float(alpha), c_int64(work)), stream=stream)
    return ctx.finish(y, call, stream)


def softmax(ctx, call, stream):
    x_in = call.args[0]
    shape = tuple(x_in.shape)
    axis = int(call.params.get("axis", call.args[1] if len(call.args) > 1 else -1))
    if not shape:
        raise GpuError("unsupported", "softmax of a 0-d array")
    if not -len(shape) <= axis < len(shape):
        raise GpuError("unsupported", f"softmax: axis {axis} out of range for shape {shape}")
    axis %= len(shape)
    if _size(shape) == 0:
        return _empty_result(ctx, call, shape, np.float32, stream)
    outer, length, inner = _size(shape[:axis]), shape[axis], _size(shape[axis + 1:])
    x = ctx.upload(x_in, stream)
    y = ctx.empty(shape, np.float32, stream)
    if inner == 1:
        cached = length <= SOFTMAX_CACHED_LEN
        vec = length % 4 == 0 and _aligned(x, y)
        items = length // 4 if vec else length  # per row, what the block's threads stride over
        block = 512 if items >= 4096 else (256 if items >= 512 else 64)
        grid = min(outer, 1 << 20)  # the kernel strides over further rows
        ctx.launch(ctx.function("softmax", "hs_softmax_rows_f32_v4" if vec else "hs_softmax_rows_f32"), grid, block,
                   (x, y, c_int64(outer), c_int64(length), c_int32(int(cached))),
                   shared=length * 4 if cached else 0, stream=stream)
    else:
        cols = outer * inner
        ctx.launch(ctx.function("softmax", "hs_softmax_strided_f32"), ctx.blocks_for(cols, BLOCK), BLOCK,
                   (x, y, c_int64(outer), c_int64(length), c_int64(inner)), stream=stream)
    return ctx.finish(y, call, stream)


# ---------------------------------------------------------------------------------------- similarity

def _as_queries(q_in):
    """(m, d) view of q: a 1-d query is one row."""
    return (1, q_in.shape[0]) if len(q_in.shape) == 1 else tuple(q_in.shape)


def _cosine_scores(ctx, q, T, m, n, d, stream, scores):
    """(m, n) cosine scores into the device array `scores`; q and T already on the device."""
    qinv = ctx.scratch("qinv", (m,), np.float32, stream)
    warps_per_block = BLOCK // ctx.warp_size
    ctx.launch(ctx.function("similarity", "hs_row_inv_norm_f32"), max(1, min(-(-m // warps_per_block), 65535)),
               BLOCK, (q, qinv, c_int64(m), c_int64(d)), stream=stream)
    vec = d % 4 == 0 and _aligned(q, T)
    many = m > 1
    name = "hs_cosine_f32_q8" if many else "hs_cosine_f32_q1"
    name += "_v4" if vec else ""
    fn = ctx.function("similarity", name)
    grid = ctx.blocks_for(n * ctx.warp_size, BLOCK)
    step = COSINE_MQ if many else 1
    for q0 in range(0, m, step):
        ctx.launch(fn, grid, BLOCK, (q, qinv, T, scores, c_int64(m), c_int64(n), c_int64(d), c_int64(q0)),
                   stream=stream)
    return scores


def cosine_similarity(ctx, call, stream):
    q_in, T_in = call.args[0], call.args[1]
    m, d = _as_queries(q_in)
    n = T_in.shape[0]
    out_shape = (n,) if len(q_in.shape) == 1 else (m, n)
    if m == 0 or n == 0:
        return _empty_result(ctx, call, out_shape, np.float32, stream)
    if d == 0:  # every vector is a zero vector: similarity 0 by definition
        out = ctx.empty(out_shape, np.float32, stream)
        ctx.rt.memset(out.ptr, 0, out.nbytes, int(stream or 0))
        return ctx.finish(out, call, stream)
    q, T = ctx.upload(q_in, stream), ctx.upload(T_in, stream)
    scores = _cosine_scores(ctx, q, T, m, n, d, stream, ctx.empty(out_shape, np.float32, stream))
    return ctx.finish(scores, call, stream)


def top_k(ctx, call, stream):
    q_in, T_in = call.args[0], call.args[1]
    k = int(_param(call, 2, "k"))
    m, d = _as_queries(q_in)
    n = T_in.shape[0]
    kout = min(k, n)
    if kout > TOPK_MAX_K:
        raise GpuError("unsupported", f"top_k: k={k} is above the GPU limit {TOPK_MAX_K}")
    if n >= 2**31 // TOPK_SEG * TOPK_SEG or m > 65535:  # segments and queries index the grid
        raise GpuError("unsupported", f"top_k: {m} queries x {n} targets is above the GPU grid limits")
    one = len(q_in.shape) == 1
    out_shape = (kout,) if one else (m, kout)
    if m == 0 or kout == 0:
        idx = ctx.empty(out_shape, np.int64, stream)
        return ctx.finish((idx, ctx.empty(out_shape, np.float32, stream)), call, stream)
    q, T = ctx.upload(q_in, stream), ctx.upload(T_in, stream)
    scores = ctx.scratch("scores", (m, n), np.float32, stream)
    if d == 0:
        ctx.rt.memset(scores.ptr, 0, scores.nbytes, int(stream or 0))
    else:
        _cosine_scores(ctx, q, T, m, n, d, stream, scores)
    vals, idx, length = scores, None, n
    fn = ctx.function("similarity", "hs_topk_select_f32")
    for p in range(64):  # each pass keeps the best kout of every segment until one segment per row is left
        nseg = -(-length // TOPK_SEG)
        if nseg > 65535:
            raise GpuError("unsupported", f"top_k: {n} targets needs more than 65535 segments")
        if nseg == 1:  # the last pass writes the results
            out_v, out_i = ctx.empty(out_shape, np.float32, stream), ctx.empty(out_shape, np.int64, stream)
        else:  # partial results of two consecutive passes are alive at once: alternate two scratch pairs
            out_v = ctx.scratch(f"topk_v{p % 2}", (m, nseg * kout), np.float32, stream)
            out_i = ctx.scratch(f"topk_i{p % 2}", (m, nseg * kout), np.int64, stream)
        ctx.launch(fn, (nseg, m, 1), TOPK_THREADS, (vals, idx, c_int64(length), c_int32(kout), out_v, out_i),
                   stream=stream)
        vals, idx, length = out_v, out_i, nseg * kout
        if nseg == 1:
            return ctx.finish((out_i, out_v), call, stream)
    raise GpuError("runtime", "top_k: the selection passes did not converge")  # kout <= SEG/2 halves each pass


# ---------------------------------------------------------------------------------------- matmul

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


def matmul(ctx, call, stream):
    a_in, b_in = call.args[0], call.args[1]
    batch, M, N, K, sa, sb, out_shape = _matmul_shapes(tuple(a_in.shape), tuple(b_in.shape))
    c = ctx.empty(out_shape, np.float32, stream)
    if c.size == 0:
        return ctx.finish(c, call, stream)
    if K == 0:  # an empty sum: zeros, as NumPy gives
        ctx.rt.memset(c.ptr, 0, c.nbytes, int(stream or 0))
        return ctx.finish(c, call, stream)
    a, b = ctx.upload(a_in, stream), ctx.upload(b_in, stream)
    blas = ctx.blas()
    if blas is not None:
        blas.sgemm_rowmajor(a, b, c, M, N, K, batch, sa, sb, M * N, stream)
    else:
        if max(M, N, K) >= 2**31 or batch > 65535 or -(-M // 64) > 65535:
            raise GpuError("unsupported", f"matmul: {batch}x{M}x{N}x{K} is beyond the fallback kernel's grid")
        grid = (-(-N // 64), -(-M // 64), batch)
        ctx.launch(ctx.function("matmul", "hs_matmul_f32"), grid, 256,
                   (a, b, c, c_int32(M), c_int32(N), c_int32(K), c_int64(sa), c_int64(sb), c_int64(M * N)),
                   stream=stream)
    return ctx.finish(c, call, stream)
