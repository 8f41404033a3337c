"""Launch glue for cosine_similarity and top_k (src_c/hip/similarity.hip), float32, float16 and bfloat16
(Call.dtype; q and T of one type): the scores come back as float32 whatever the inputs' type."""
from __future__ import annotations

from ctypes import c_int32, c_int64

import numpy as np

from ...errors import GpuError
from ..compilation.kernel_constants import HS_COSINE_MQ, HS_TOPK_SEG, HS_TOPK_THREADS
from ..launch.context import Launch, grid_stride_blocks, pure_plan
from .common import BLOCK, KERNEL_SUFFIX, _aligned, _empty_result, _param, _will_align, kernel_suffix, np_dtype

# k above half a segment would make the multi-pass selection stall (kernel_constants.py)
TOPK_MAX_K = HS_TOPK_SEG // 2


def _queries_of_corpus_dtype(call) -> None:
    """The similarity kernels read q and T in one element type (the call's, T's). The CPU scores a
    float32 q against a half T exactly; rounding q to T's type here would give other scores, so a
    mix is refused before anything runs, and the call stays on the CPU."""
    q_in = call.args[0]
    if np.dtype(q_in.dtype) != np_dtype(call.dtype):
        raise GpuError("unsupported", f"{call.op}: q is {np.dtype(q_in.dtype).name} and T {call.dtype}; the GPU "
                                      f"kernels read both in one dtype")


def _shapes(call) -> tuple[int, int, int]:
    """(m, n, d): m queries (a 1-d q is one) of dimension d against n rows of T."""
    q_in, T_in = call.args[0], call.args[1]
    m, d = (1, q_in.shape[0]) if len(q_in.shape) == 1 else tuple(q_in.shape)
    return m, T_in.shape[0], d


def _top_k_shapes(call) -> tuple[int, int, int, int]:
    """(m, n, d, kout): _shapes and the number of results per query, min(k, n)."""
    m, n, d = _shapes(call)
    return m, n, d, min(int(_param(call, 2, "k")), n)


@pure_plan
def cosine_launches(m: int, n: int, d: int, vec: bool, warp: int, multiprocessors: int,
                    suffix: str = "f32") -> list[Launch]:
    """Query norms (one warp per row), then the scoring kernel, launched once per HS_COSINE_MQ queries
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
    step = HS_COSINE_MQ if m > 1 else 1
    for q0 in range(0, m, step):
        ctx.run(score, (q, qinv, T, scores, c_int64(m), c_int64(n), c_int64(d), c_int64(q0)), stream)
    return scores


def cosine_similarity_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    _queries_of_corpus_dtype(call)
    m, n, d = _shapes(call)
    if m == 0 or n == 0 or d == 0:
        return []
    return cosine_launches(m, n, d, d % 4 == 0 and _will_align(*call.args[:2]), ctx.warp_size, ctx.multiprocessors,
                           suffix)


def cosine_similarity_scratch(call, multiprocessors: int) -> int:
    """Device bytes the glue allocates beyond the call's inputs and result (the op spec's device scratch):
    the query norms, unless nothing is scored (an empty call, or d == 0)."""
    m, n, d = _shapes(call)
    return 4 * m if m and n and d else 0


def cosine_similarity(ctx, call, stream):
    q_in, T_in = call.args[0], call.args[1]
    m, n, d = _shapes(call)
    out_shape = (n,) if len(q_in.shape) == 1 else (m, n)
    ctx.planned(call, cosine_similarity_plan)
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
    """The selection passes: each keeps the best kout of every HS_TOPK_SEG-candidate segment of each of
    the m rows (grid (segments, rows)), until one segment per row is left."""
    if kout > TOPK_MAX_K:
        raise GpuError("unsupported", f"top_k: k={kout} is above the GPU limit {TOPK_MAX_K}")
    if n >= 2**31 // HS_TOPK_SEG * HS_TOPK_SEG:  # candidate positions are kept below 2^31
        raise GpuError("unsupported", f"top_k: {n} targets is above the GPU kernel's limit")
    passes, length = [], n
    for _ in range(64):  # kout <= SEG/2 at least halves the candidates each pass
        nseg = -(-length // HS_TOPK_SEG)
        if nseg > 65535:
            raise GpuError("unsupported", f"top_k: {n} targets needs more than 65535 segments")
        passes.append(Launch.of("similarity", "hs_topk_select_f32", (nseg, m, 1), HS_TOPK_THREADS))
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
    m, n, d, kout = _top_k_shapes(call)
    if kout > TOPK_MAX_K:
        raise GpuError("unsupported", f"top_k: k={int(_param(call, 2, 'k'))} is above the GPU limit {TOPK_MAX_K}")
    if m == 0 or kout == 0:
        return []
    return top_k_launches(m, n, d, kout, d % 4 == 0 and _will_align(*call.args[:2]), ctx.warp_size,
                          ctx.multiprocessors, suffix)


def top_k_scratch(call, multiprocessors: int) -> int:
    """Device bytes the glue allocates beyond the call's inputs and results (the op spec's device scratch):
    the (m, n) float32 scores, the query norms (unless d == 0), and the two alternating pairs of partial
    results (float32 scores, int64 indices) of the selection passes before the last, each pair as large
    as its first and largest use. Nothing for a call that launches nothing."""
    m, n, d, kout = _top_k_shapes(call)
    if m == 0 or kout == 0:
        return 0
    partials = [launch.grid[0] * kout for launch in top_k_select_launches(m, n, kout)[:-1]]
    return 4 * m * n + (4 * m if d else 0) + 12 * m * sum(partials[:2])


def top_k(ctx, call, stream):
    q_in, T_in = call.args[0], call.args[1]
    m, n, d, kout = _top_k_shapes(call)
    one = len(q_in.shape) == 1
    out_shape = (kout,) if one else (m, kout)
    if not ctx.planned(call, top_k_plan):
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


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """Plans for shapes that reach every kernel here at every block size it is launched with (the
    compile report's occupancy rows)."""
    plans = []
    for vec in (False, True):
        for m in (1, 9):
            for sfx in KERNEL_SUFFIX.values():
                plans += top_k_launches(m, 5000, 64, 10, vec, warp, multiprocessors, sfx)
    return plans
