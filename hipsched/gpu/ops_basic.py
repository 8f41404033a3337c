"""Launch glue for add, scale, softmax, cosine_similarity, top_k and matmul (src_c/hip/{elementwise,
softmax,similarity,matmul}.hip). Each function is `op(ctx, call, stream)` on a validated Call (see
hipsched/ops): inputs are float32 C-contiguous host arrays or DeviceArrays, and the result comes back
where the inputs live through ctx.finish. add, scale, softmax, cosine_similarity and top_k also take
float16 and bfloat16 (Call.dtype): the kernels of that element type are launched; results have the
inputs' dtype, except scores (cosine_similarity, top_k), which are float32. Each op's launches (kernel, grid, block, shared memory) come
from a pure `<op>_launches(...)` of shapes and device geometry, checked before any upload."""
from __future__ import annotations

import math
from ctypes import c_float, c_int32, c_int64

import numpy as np

from ..errors import GpuError
from .context import Launch, grid_stride_blocks, pure_plan

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


# Kernel name suffix per element type (prelude.h's HS_FOR_EACH_FLOAT).
KERNEL_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def kernel_suffix(call, op=None, dtypes=tuple(KERNEL_SUFFIX)) -> str:
    """The kernel suffix of call.dtype, one of `dtypes` (those the glue's kernels are built for: every
    entry point asks, so a call of another dtype is refused before its elements could be read at the
    wrong width); GpuError("unsupported") for any other."""
    dtype = getattr(call, "dtype", "float32") or "float32"
    if dtype not in dtypes:
        raise GpuError("unsupported", f"{op or call.op}: no GPU kernels for dtype {dtype}")
    return KERNEL_SUFFIX[dtype]


def np_dtype(name: str) -> np.dtype:
    """NumPy dtype of a Call.dtype name. bfloat16 is ml_dtypes' (imported only when a bfloat16 call
    comes, and only the holder of a bfloat16 array needs it)."""
    if name == "bfloat16":
        try:
            import ml_dtypes  # deferred: ml_dtypes is optional, needed only for bfloat16
        except ImportError as e:
            raise GpuError("unsupported", "bfloat16 on the GPU needs the ml_dtypes package for its NumPy "
                                          "dtype (pip install ml_dtypes)") from e
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _param(call, index, name):
    """A scalar given either positionally (call.args) or as a keyword (call.params)."""
    if name in call.params:
        return call.params[name]
    if len(call.args) > index:
        return call.args[index]
    raise GpuError("unsupported", f"{call.op}: missing parameter {name!r}")


def _aligned(*arrays, multiple=16) -> bool:
    return all(int(a.ptr) % multiple == 0 for a in arrays)


def _queries_of_corpus_dtype(call) -> None:
    """The similarity kernels read q and T in one element type (the call's, T's). The CPU scores a
    float32 q against a half T exactly; rounding q to T's type here would give other scores, so a
    mix is refused before anything runs, and the call stays on the CPU."""
    q_in = call.args[0]
    if np.dtype(q_in.dtype) != np_dtype(call.dtype):
        raise GpuError("unsupported", f"{call.op}: q is {np.dtype(q_in.dtype).name} and T {call.dtype}; the GPU "
                                      f"kernels read both in one dtype")


def _will_align(*inputs, multiple=16) -> bool:
    """Whether the device copies of these inputs will be `multiple`-aligned, known before uploading:
    hipsched's own device allocations always are (the runtimes align them to 256 bytes or more); a
    foreign device array is as its pointer says."""
    return all(isinstance(x, np.ndarray) or int(x.ptr) % multiple == 0 for x in inputs)


def _size(shape) -> int:
    return math.prod(shape)


def _empty_result(ctx, call, shape, dtype, stream):
    out = ctx.empty(shape, dtype, stream)
    return ctx.finish(out, call, stream)


# ---------------------------------------------------------------------------------------- elementwise

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


# ---------------------------------------------------------------------------------------- similarity

def _as_queries(q_in):
    """(m, d) view of q: a 1-d query is one row."""
    return (1, q_in.shape[0]) if len(q_in.shape) == 1 else tuple(q_in.shape)


@pure_plan
def cosine_launches(m: int, n: int, d: int, vec: bool, warp: int, multiprocessors: int,
                    suffix: str = "f32") -> list[Launch]:
    """Query norms (one warp per row), then the scoring kernel, launched once per COSINE_MQ queries
    (the second launch repeats with the next q0)."""
    warps_per_block = BLOCK // warp
    name = f"hs_cosine_{suffix}" + ("_q8" if m > 1 else "_q1") + ("_v4" if vec else "")
    return [Launch.of("similarity", f"hs_row_inv_norm_{suffix}", max(1, min(-(-m // warps_per_block), 65535)),
                      BLOCK),
            Launch.of("similarity", name, grid_stride_blocks(n * warp, BLOCK, multiprocessors), BLOCK)]


def _cosine_scores(ctx, q, T, m, n, d, stream, scores, suffix="f32"):
    """(m, n) float32 cosine scores into the device array `scores`; q and T already on the device."""
    qinv = ctx.scratch("qinv", (m,), np.float32, stream)
    vec = d % 4 == 0 and _aligned(q, T)
    norms, score = cosine_launches(m, n, d, vec, ctx.warp_size, ctx.multiprocessors, suffix)
    ctx.run(norms, (q, qinv, c_int64(m), c_int64(d)), stream)
    step = COSINE_MQ if m > 1 else 1
    for q0 in range(0, m, step):
        ctx.run(score, (q, qinv, T, scores, c_int64(m), c_int64(n), c_int64(d), c_int64(q0)), stream)
    return scores


def cosine_similarity_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    _queries_of_corpus_dtype(call)
    q_in, T_in = call.args[0], call.args[1]
    m, d = _as_queries(q_in)
    n = T_in.shape[0]
    if m == 0 or n == 0 or d == 0:
        return []
    return cosine_launches(m, n, d, d % 4 == 0 and _will_align(q_in, T_in), ctx.warp_size, ctx.multiprocessors,
                           suffix)


def cosine_similarity(ctx, call, stream):
    q_in, T_in = call.args[0], call.args[1]
    m, d = _as_queries(q_in)
    n = T_in.shape[0]
    out_shape = (n,) if len(q_in.shape) == 1 else (m, n)
    ctx.check_launches(cosine_similarity_plan(ctx, call))
    if m == 0 or n == 0:
        return _empty_result(ctx, call, out_shape, np.float32, stream)
    if d == 0:  # every vector is a zero vector: similarity 0 by definition
        out = ctx.empty(out_shape, np.float32, stream)
        ctx.rt.memset(out.ptr, 0, out.nbytes, int(stream or 0))
        return ctx.finish(out, call, stream)
    q, T = ctx.upload(q_in, stream), ctx.upload(T_in, stream)
    scores = _cosine_scores(ctx, q, T, m, n, d, stream, ctx.empty(out_shape, np.float32, stream), kernel_suffix(call))
    return ctx.finish(scores, call, stream)


@pure_plan
def top_k_select_launches(m: int, n: int, kout: int) -> list[Launch]:
    """The selection passes: each keeps the best kout of every TOPK_SEG-candidate segment of each of
    the m rows (grid (segments, rows)), until one segment per row is left."""
    if kout > TOPK_MAX_K:
        raise GpuError("unsupported", f"top_k: k={kout} is above the GPU limit {TOPK_MAX_K}")
    if n >= 2**31 // TOPK_SEG * TOPK_SEG:  # candidate positions are kept below 2^31
        raise GpuError("unsupported", f"top_k: {n} targets is above the GPU kernel's limit")
    passes, length = [], n
    for _ in range(64):  # kout <= SEG/2 at least halves the candidates each pass
        nseg = -(-length // TOPK_SEG)
        if nseg > 65535:
            raise GpuError("unsupported", f"top_k: {n} targets needs more than 65535 segments")
        passes.append(Launch.of("similarity", "hs_topk_select_f32", (nseg, m, 1), TOPK_THREADS))
        if nseg == 1:
            return passes
        length = nseg * kout
    raise GpuError("runtime", "top_k: the selection passes did not converge")


@pure_plan
def top_k_launches(m: int, n: int, d: int, kout: int, vec: bool, warp: int, multiprocessors: int,
                   suffix: str = "f32") -> list[Launch]:
    """Everything top_k launches: the cosine scores (unless d == 0: all zero), then the selection (of
    float32 scores whatever the inputs' type)."""
    scores = cosine_launches(m, n, d, vec, warp, multiprocessors, suffix) if d else []
    return scores + top_k_select_launches(m, n, kout)


def top_k_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    _queries_of_corpus_dtype(call)
    q_in, T_in = call.args[0], call.args[1]
    k = int(_param(call, 2, "k"))
    m, d = _as_queries(q_in)
    n = T_in.shape[0]
    kout = min(k, n)
    if kout > TOPK_MAX_K:
        raise GpuError("unsupported", f"top_k: k={k} is above the GPU limit {TOPK_MAX_K}")
    if m == 0 or kout == 0:
        return []
    return top_k_launches(m, n, d, kout, d % 4 == 0 and _will_align(q_in, T_in), ctx.warp_size, ctx.multiprocessors,
                          suffix)


def top_k(ctx, call, stream):
    q_in, T_in = call.args[0], call.args[1]
    k = int(_param(call, 2, "k"))
    m, d = _as_queries(q_in)
    n = T_in.shape[0]
    kout = min(k, n)
    one = len(q_in.shape) == 1
    out_shape = (kout,) if one else (m, kout)
    if not ctx.check_launches(top_k_plan(ctx, call)):
        idx = ctx.empty(out_shape, np.int64, stream)
        return ctx.finish((idx, ctx.empty(out_shape, np.float32, stream)), call, stream)
    q, T = ctx.upload(q_in, stream), ctx.upload(T_in, stream)
    scores = ctx.scratch("scores", (m, n), np.float32, stream)
    if d == 0:
        ctx.rt.memset(scores.ptr, 0, scores.nbytes, int(stream or 0))
    else:
        _cosine_scores(ctx, q, T, m, n, d, stream, scores, kernel_suffix(call))
    vals, idx, length = scores, None, n
    passes = top_k_select_launches(m, n, kout)
    for p, launch in enumerate(passes):
        nseg = launch.grid[0]
        if p == len(passes) - 1:  # the last pass (one segment per row) writes the results
            out_v, out_i = ctx.empty(out_shape, np.float32, stream), ctx.empty(out_shape, np.int64, stream)
        else:  # partial results of two consecutive passes are alive at once: alternate two scratch pairs
            out_v = ctx.scratch(f"topk_v{p % 2}", (m, nseg * kout), np.float32, stream)
            out_i = ctx.scratch(f"topk_i{p % 2}", (m, nseg * kout), np.int64, stream)
        ctx.run(launch, (vals, idx, c_int64(length), c_int32(kout), out_v, out_i), stream)
        vals, idx, length = out_v, out_i, nseg * kout
    return ctx.finish((idx, vals), call, stream)


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
    plan = ctx.check_launches(matmul_plan(ctx, call))
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
    """The tiled fallback kernel (no vendor BLAS): a 64x64 tile of C per block, batch on grid z."""
    if max(M, N, K) >= 2**31:  # the kernel takes int dimensions
        raise GpuError("unsupported", f"matmul: {batch}x{M}x{N}x{K} exceeds the fallback kernel's 32-bit sizes")
    return [Launch.of("matmul", f"hs_matmul_{suffix}", (-(-N // 64), -(-M // 64), batch), 256)]


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
        for m in (1, 9):
            for sfx in KERNEL_SUFFIX.values():
                plans += top_k_launches(m, 5000, 64, 10, vec, warp, multiprocessors, sfx)
    for sfx in KERNEL_SUFFIX.values():
        plans += softmax_launches(8, 100, 8, False, multiprocessors, sfx)
    for sfx in KERNEL_SUFFIX.values():
        plans += matmul_launches(2, 100, 100, 100, sfx)
    return plans
