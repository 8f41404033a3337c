"""Similarity ops: cosine_similarity and top_k (validation and work measures; see base.py and validation.py).

cosine_similarity(q, T): q (d,) or (m, d) against T (n, d) -> (n,) or (m, n) float32. A zero vector
(q or a row of T, norm exactly 0, including d == 0) scores 0 against any finite vector; NaN or inf in
either vector gives NaN, as NumPy's dot / (norm * norm) would. Agrees with a float64 reference to
about 1e-6 absolute.
top_k(q, T, k): the k' = min(k, n) rows of T with the highest cosine to q -> (indices int64, scores
float32), (k',) or (m, k'), best first; equal scores go to the lower index; NaN scores rank after every
number (among themselves by index). k < 1 is a ValueError.

Dtypes: q and T each float32, float16 or bfloat16 (other real types convert to float32). Scores are
float32 whatever the inputs: rounding them to half would merge distinct scores into ties (fp16 keeps
11 bits) and change top_k's ranking.
A mix of dtypes is not promoted: each input is kept as it is, because the kernel converts each in
registers and computes in float32, so the scores are exactly those of the float32 computation on the
given values (which is also what promotion to float32 would give, without widening the corpus in
memory). A half corpus is read as half: the fused pass over T reads half the bytes. The call's dtype
(the scheduler's key) is the corpus's, which decides the cost. On a device, inputs must be float32."""
from __future__ import annotations

import numpy as np

from .base import Call, Partition, partition_from_split, rand_f32, register
from .validation import (FLOATS, any_on_device, as_float, check_ndim, check_result_fits, dtype_name, finite_scalar,
                         shape_mismatch)

_CPU = "hipsched.cpu._similarity"
_GPU = "hipsched.gpu.glue.similarity"


def _queries_targets(op, q, T):
    q = as_float(q, op, "q")
    T = as_float(T, op, "T")
    check_ndim(q, (1, 2), op, "q")
    check_ndim(T, (2,), op, "T")
    if q.shape[-1] != T.shape[1]:
        raise shape_mismatch(op, "q", q.shape, "T", T.shape, "q's last axis must equal T's second (the dimension d)")
    m = 1 if len(q.shape) == 1 else int(q.shape[0])
    n, d = int(T.shape[0]), int(T.shape[1])
    on_device = any_on_device(q, T)
    return q, T, m, n, d, on_device


def _bytes(q, T):
    return q.dtype.itemsize * q.size + T.dtype.itemsize * T.size


def _split_cosine(call):
    args = call.args
    if len(args) < 2 or not isinstance(args[0], np.ndarray) or not isinstance(args[1], np.ndarray) \
            or args[1].ndim < 1 or args[1].shape[0] < 2:
        return None
    q, t = args[0], args[1]
    return t.shape[0], (lambda lo, hi: (q, t[lo:hi]) + tuple(args[2:])), (lambda rs: np.concatenate(rs, axis=-1))


def _split_top_k(call):
    x, args = call.args[0], call.args
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[0] < 2:
        return None
    return x.shape[0], (lambda lo, hi: (x[lo:hi],) + tuple(args[1:])), \
        (lambda rs: tuple(np.concatenate(p, axis=0) for p in zip(*rs)))


def _partition_cosine(call):
    return partition_from_split(_split_cosine(call))


def merge_top_k(parts, k):
    """Top k of several (indices, scores) candidate lists in the single-machine order: higher score
    first, equal scores by lower index, NaN after every number (a sort puts NaN last). Works on
    (k_i,) or (m, k_i) lists; each list may be shorter than k. The merge of a top_k split across
    processors (a row range each) and of hipsched.dask's chunks."""
    idx = np.concatenate([p[0] for p in parts], axis=-1)
    val = np.concatenate([p[1] for p in parts], axis=-1)
    # one sort on (-score, index): equal scores (0.0 and -0.0 included) by ascending index
    order = np.lexsort((idx, -val), axis=-1)[..., :k]
    if idx.ndim == 1:   # a scan merges (k,) lists every split_every chunks: plain indexing is cheaper
        return idx[order], val[order]
    return np.take_along_axis(idx, order, axis=-1), np.take_along_axis(val, order, axis=-1)


def _partition_top_k(call):
    """Rows of the corpus T: each range's top k, merged (queries stay whole: each part scores all of
    them, so the parts' work is the rows' share)."""
    args = call.args
    if len(args) < 2 or not isinstance(args[1], np.ndarray) or args[1].ndim != 2 or args[1].shape[0] < 2:
        return None
    q, t, k = args[0], args[1], int(call.params["k"])
    return Partition(t.shape[0], lambda lo, hi: (q, t[lo:hi]) + tuple(args[2:]),
                     lambda results, bounds: merge_top_k([(r[0] + np.int64(lo), r[1])
                                                          for r, (lo, _) in zip(results, bounds)], k))


def _sweep(*extra, queries=1):
    """One query over 128-d corpora, then 768-d corpora (an embedding search's) up to 65536 rows, and
    with `queries` > 1 a batch of that many queries over those: a sweep that ended at 8M work left the
    demo's 12M-6G calls to a line extrapolated 10-1000x beyond its last point (docs/design/history.md,
    "Routing accuracy: what the runs missed")."""
    def sweep(rng):
        for n in (64, 256, 1024, 4096, 16384, 65536):
            yield n * 128, (rand_f32(rng, 128), rand_f32(rng, n, 128)) + extra, {}
        corpora = [rand_f32(rng, n, 768) for n in (16384, 65536)]
        for T in corpora:
            yield T.shape[0] * 768, (rand_f32(rng, 768), T) + extra, {}
        if queries > 1:
            for T in corpora:
                yield T.shape[0] * 768 * queries, (rand_f32(rng, queries, 768), T) + extra, {}
    return sweep


def _rows(call, width):
    """(width,) for a query (d,), (m, width) for queries (m, d)."""
    q = call.args[0]
    return ((int(q.shape[0]),) if len(q.shape) == 2 else ()) + (width,)


def _top_k_result(call):
    shape = _rows(call, min(int(call.params["k"]), int(call.args[1].shape[0])))
    return (shape, "int64"), (shape, "float32")


@register("cosine_similarity", cpu=(_CPU, "cosine_similarity"), gpu=(_GPU, "cosine_similarity"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=_split_cosine, partition=_partition_cosine, sweep=_sweep(queries=32), cost=(0.2, 2.0),
          result=lambda call: (_rows(call, int(call.args[1].shape[0])), "float32"))
def prepare_cosine(q, T) -> Call:
    """Cosine similarity of q (d,) or (m, d) against the rows of T (n, d) -> (n,) or (m, n) float32. A
    zero vector has similarity 0 against any finite vector; NaN or inf gives NaN. q and T each float32,
    float16 or bfloat16 (other real types convert to float32); the scores are float32 whatever the
    inputs."""
    q, T, m, n, d, on_device = _queries_targets("cosine_similarity", q, T)
    check_result_fits("cosine_similarity", m, n)
    return Call("cosine_similarity", (q, T), {}, size=n * d * m, nbytes=_bytes(q, T) + 4 * m * n,
                dtype=dtype_name(T), on_device=on_device)


@register("top_k", cpu=(_CPU, "top_k"), gpu=(_GPU, "top_k"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS, split=_split_top_k,
          partition=_partition_top_k,
          sweep=_sweep(10), cost=(4.0, 2.0), result=_top_k_result)
def prepare_top_k(q, T, k) -> Call:
    """The exact k nearest rows of T (n, d) to q by cosine -> (indices int64, scores float32), scores
    descending, ties to the lower index, NaN scores last; k > n gives n results, k < 1 is a ValueError;
    q (d,) gives (k,) arrays, q (m, d) gives (m, k) arrays. q and T each float32, float16 or bfloat16
    (other real types convert to float32); the scores are float32 whatever the inputs."""
    q, T, m, n, d, on_device = _queries_targets("top_k", q, T)
    k = int(finite_scalar(k, "top_k", "k", lo=1, integer=True))
    kk = min(k, n)
    check_result_fits("top_k", m, kk, itemsize=12)  # int64 index + float32 score
    return Call("top_k", (q, T), {"k": k}, size=n * d * m, nbytes=_bytes(q, T) + 12 * m * kk,
                dtype=dtype_name(T), on_device=on_device)
