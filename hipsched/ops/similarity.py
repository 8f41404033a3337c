"""Similarity ops: cosine_similarity and top_k (validation and work measures; see base.py).

cosine_similarity(q, T): q (d,) or (m, d) against T (n, d) -> (n,) or (m, n) float32. A zero vector
(q or a row of T, norm exactly 0, including d == 0) scores 0 against any finite vector; NaN or inf in
either vector gives NaN, as NumPy's dot / (norm * norm) would. Agrees with a float64 reference to
about 1e-6 absolute.
top_k(q, T, k): the k' = min(k, n) rows of T with the highest cosine to q -> (indices int64, scores
float32), (k',) or (m, k'), best first; equal scores go to the lower index; NaN scores rank after every
number (among themselves by index). k < 1 is a ValueError."""
from __future__ import annotations

from .base import Call, any_on_device, as_f32, check_ndim, check_result_fits, finite_scalar, register, \
    shape_mismatch


def _queries_targets(op, q, T):
    q = as_f32(q, op, "q")
    T = as_f32(T, op, "T")
    check_ndim(q, (1, 2), op, "q")
    check_ndim(T, (2,), op, "T")
    if q.shape[-1] != T.shape[1]:
        raise shape_mismatch(op, "q", q.shape, "T", T.shape, "q's last axis must equal T's second (the dimension d)")
    m = 1 if len(q.shape) == 1 else int(q.shape[0])
    n, d = int(T.shape[0]), int(T.shape[1])
    on_device = any_on_device(q, T)
    return q, T, m, n, d, on_device


@register("cosine_similarity")
def prepare_cosine(q, T) -> Call:
    q, T, m, n, d, on_device = _queries_targets("cosine_similarity", q, T)
    check_result_fits("cosine_similarity", m, n)
    return Call("cosine_similarity", (q, T), {}, size=n * d * m, nbytes=4 * (m * d + n * d + m * n),
                on_device=on_device)


@register("top_k")
def prepare_top_k(q, T, k) -> Call:
    q, T, m, n, d, on_device = _queries_targets("top_k", q, T)
    k = int(finite_scalar(k, "top_k", "k", lo=1, integer=True))
    kk = min(k, n)
    check_result_fits("top_k", m, kk, itemsize=12)  # int64 index + float32 score
    return Call("top_k", (q, T), {"k": k}, size=n * d * m, nbytes=4 * (m * d + n * d) + 12 * m * kk,
                on_device=on_device)
