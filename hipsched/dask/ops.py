"""The single-machine ops on Dask arrays: every chunk runs through its worker's Executor (workers.executor),
so each worker picks its own CPU or GPU per chunk. Inputs are checked on the client, before any task
is built. See docs/distributed.md for what each op moves and what equality to expect."""
from __future__ import annotations

import numbers

import dask
import dask.array as da
import numpy as np

from ..ops.base import as_f32, check_ndim, finite_scalar, shape_mismatch
from .workers import executor

SPLIT_EVERY = 8   # fan-in of the top-k merge tree: 40 chunks merge in two levels


# ---------------------------------------------------------------------------------------- validation
def _dask(x, op, arg):
    if not isinstance(x, da.Array):
        raise TypeError(f"hipsched.dask.{op}: argument {arg!r} must be a dask array, got {type(x).__name__} "
                        f"(dask.array.from_array(x, chunks=...) makes one; hipsched.{op} takes NumPy arrays)")
    return x


def _dtype_ok(x, op, arg):
    """The single-machine op's dtype check (TypeError naming op and argument), on an empty stand-in."""
    as_f32(np.empty((0,) * max(1, x.ndim), dtype=x.dtype), op, arg, allow_device=False)


def _one_block_query(q, op):
    """q as a one-chunk Dask array (it is sent whole to every task that needs it, once per worker)."""
    if isinstance(q, da.Array):
        _dtype_ok(q, op, "q")
        return q.rechunk(q.shape) if q.numblocks != (1,) * q.ndim else q
    q = as_f32(q, op, "q", allow_device=False)
    return da.from_array(q, chunks=q.shape, name=f"hipsched-query-{dask.base.tokenize(q)}")


def _corpus(q, T, op):
    """Checks q (d,) or (m, d) against T (n, d) chunked by rows only; returns (q as one block, T)."""
    T = _dask(T, op, "T")
    q_arr = _one_block_query(q, op)
    check_ndim(q_arr, (1, 2), op, "q")
    check_ndim(T, (2,), op, "T")
    _dtype_ok(T, op, "T")
    if q_arr.shape[-1] != T.shape[1]:
        raise shape_mismatch(op, "q", q_arr.shape, "T", T.shape, "q's last axis must equal T's second (the dimension d)")
    if len(T.chunks[1]) > 1:
        # Each row's score needs the whole row; rechunking here would move the whole corpus over the
        # network on every call, so the caller decides (once) to do it.
        raise ValueError(f"hipsched.dask.{op}: T {T.shape} is chunked along d (chunks {T.chunks[1]}); the corpus "
                         f"must be chunked by rows only: T = T.rechunk({{1: -1}}) once (and persist it)")
    if any(np.isnan(c) for c in T.chunks[0]):
        raise ValueError(f"hipsched.dask.{op}: T has unknown chunk sizes; call T.compute_chunk_sizes() first")
    return q_arr, T


# ---------------------------------------------------------------------------------------- cosine and top-k
def _cos_block(qb, tb):
    return executor().cosine_similarity(qb, tb)


def cosine_similarity(q, T):
    """hipsched.cosine_similarity on a Dask corpus T (n, d) chunked by rows -> a Dask array (n,) or
    (m, n) chunked as T's rows. Each chunk's scores equal the single-machine op's for those rows (the
    kernel scores each row on its own) when q has at most 12 rows; see docs/distributed.md."""
    qd, T = _corpus(q, T, "cosine_similarity")
    if qd.ndim == 1:
        return da.blockwise(_cos_block, "n", qd, "d", T, "nd", dtype=np.float32, concatenate=True,
                            name="hipsched-cosine_similarity-" + dask.base.tokenize(qd, T))
    return da.blockwise(_cos_block, "mn", qd, "md", T, "nd", dtype=np.float32, concatenate=True,
                        name="hipsched-cosine_similarity-" + dask.base.tokenize(qd, T))


def _topk_chunk(qb, tb, k, offset):
    idx, scores = executor().top_k(qb, tb, k)
    return idx + np.int64(offset), scores


def merge_top_k(parts, k):
    """Top k of several (indices, scores) candidate lists in the single-machine order: higher score
    first, equal scores by lower index, NaN after every number (np.argsort puts NaN last). Works on
    (k_i,) or (m, k_i) lists; each list may be shorter than k."""
    idx = np.concatenate([p[0] for p in parts], axis=-1)
    val = np.concatenate([p[1] for p in parts], axis=-1)
    by_index = np.argsort(idx, axis=-1, kind="stable")
    idx = np.take_along_axis(idx, by_index, axis=-1)
    val = np.take_along_axis(val, by_index, axis=-1)
    # stable on -score: equal scores (0.0 and -0.0 included) keep ascending index order
    by_score = np.argsort(-val, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(idx, by_score, axis=-1), np.take_along_axis(val, by_score, axis=-1)


def _merge(k, *parts):
    return merge_top_k(parts, k)


def top_k(q, T, k, *, split_every: int = SPLIT_EVERY):
    """hipsched.top_k on a Dask corpus T (n, d) chunked by rows -> (indices int64, scores float32) as
    Dask arrays, (k',) or (m, k') with k' = min(k, n): each chunk's top k through its worker's
    Executor, indices offset to the whole corpus, then a merge tree of fan-in `split_every` that keeps
    the single-machine order (ties on the lower index, NaN last). Equal to hipsched.top_k on the
    computed corpus, bit for bit when q has at most 12 rows (see docs/distributed.md)."""
    qd, T = _corpus(q, T, "top_k")
    k = int(finite_scalar(k, "top_k", "k", lo=1, integer=True))
    if not isinstance(split_every, numbers.Integral) or split_every < 2:
        raise ValueError(f"hipsched.dask.top_k: split_every must be an integer >= 2, got {split_every!r}")
    n = int(T.shape[0])
    kk = min(k, n)
    out_shape = (kk,) if qd.ndim == 1 else (int(qd.shape[0]), kk)
    if kk == 0 or (qd.ndim == 2 and qd.shape[0] == 0):
        return (da.zeros(out_shape, dtype=np.int64, chunks=out_shape),
                da.zeros(out_shape, dtype=np.float32, chunks=out_shape))
    q_del = qd.to_delayed().ravel()[0]
    token = dask.base.tokenize(qd, T, k)
    chunk = dask.delayed(_topk_chunk, pure=True)
    level, offset = [], 0
    for i, (blk, rows) in enumerate(zip(T.to_delayed().ravel(), T.chunks[0])):
        if rows:
            level.append(chunk(q_del, blk, k, offset, dask_key_name=(f"hipsched-top_k-chunk-{token}", i)))
        offset += rows
    merge = dask.delayed(_merge, pure=True)
    depth = 0
    while len(level) > 1:
        depth += 1
        level = [merge(k, *level[j:j + split_every], dask_key_name=(f"hipsched-top_k-merge{depth}-{token}", j))
                 for j in range(0, len(level), split_every)]
    result = level[0]
    idx = da.from_delayed(result[0], shape=out_shape, dtype=np.int64, name=f"hipsched-top_k-indices-{token}")
    val = da.from_delayed(result[1], shape=out_shape, dtype=np.float32, name=f"hipsched-top_k-scores-{token}")
    return idx, val


# ---------------------------------------------------------------------------------------- elementwise
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _as_dask_like(b, chunks, op, arg):
    """b (NumPy or Dask) chunked as `chunks` (the trailing chunks of the array it combines with)."""
    if isinstance(b, da.Array):
        _dtype_ok(b, op, arg)
        return b.rechunk(chunks) if b.chunks != tuple(chunks) else b
    b = as_f32(b, op, arg, allow_device=False)
    return da.from_array(b, chunks=tuple(chunks))


def _add_block(ab, bb):
    return executor().add(ab, bb)


def add(a, b):
    """hipsched.add on Dask arrays, chunk by chunk through each worker's executor: b has a's shape or a
    trailing part of it (a bias), NumPy or Dask; it is rechunked to match a's chunks. Bit-identical to
    the single-machine op (one float32 add per element)."""
    a = _dask(a, "add", "a")
    _dtype_ok(a, "add", "a")
    sb = tuple(getattr(b, "shape", np.shape(b)))
    sa = tuple(a.shape)
    if sb != sa and not (len(sb) <= len(sa) and sa[len(sa) - len(sb):] == sb):
        raise shape_mismatch("add", "a", sa, "b", sb, "b must have a's shape or a trailing part of it")
    b = _as_dask_like(b, a.chunks[a.ndim - len(sb):], "add", "b")
    ia = _LETTERS[:a.ndim]
    return da.blockwise(_add_block, ia, a, ia, b, ia[a.ndim - len(sb):], dtype=np.float32,
                        name="hipsched-add-" + dask.base.tokenize(a, b))


def _scale_block(xb, alpha):
    return executor().scale(xb, alpha)


def scale(x, alpha):
    """hipsched.scale on a Dask array, chunk by chunk; bit-identical to the single-machine op."""
    from ..ops.elementwise import _real_scalar
    x = _dask(x, "scale", "x")
    _dtype_ok(x, "scale", "x")
    alpha = _real_scalar(alpha, "scale", "alpha")
    return x.map_blocks(_scale_block, alpha, dtype=np.float32, name="hipsched-scale-" + dask.base.tokenize(x, alpha))


def _softmax_block(xb, axis):
    return executor().softmax(xb, axis=axis)


def softmax(x, axis=-1):
    """hipsched.softmax on a Dask array along an unchunked `axis` (each chunk holds whole slices, so
    each is bit-identical to the single-machine op); a chunked axis is a ValueError naming the rechunk."""
    x = _dask(x, "softmax", "x")
    _dtype_ok(x, "softmax", "x")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"softmax: axis must be an integer, got {axis!r}")
    if x.ndim == 0:
        raise ValueError("softmax: x must have at least one dimension, got a 0-d array")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"softmax: axis {axis} is out of range for shape {tuple(x.shape)}")
    axis = int(axis) % x.ndim
    if len(x.chunks[axis]) > 1:
        raise ValueError(f"hipsched.dask.softmax: x {x.shape} is chunked along axis {axis} (chunks {x.chunks[axis]}); "
                         f"softmax needs whole slices: x = x.rechunk({{{axis}: -1}})")
    return x.map_blocks(_softmax_block, axis, dtype=np.float32, name="hipsched-softmax-" + dask.base.tokenize(x, axis))
