"""The float64 cosine reference the similarity tests compare against (float32 and half inputs alike)."""
import numpy as np


def cos_ref(q, T):
    """float64 cosine of the given values, q (d,) or (m, d) against T (n, d), with the documented zero
    rule: a zero vector (against a finite one) scores 0."""
    Q = np.atleast_2d(q).astype(np.float64)
    T = T.astype(np.float64)
    qn, tn = np.linalg.norm(Q, axis=1), np.linalg.norm(T, axis=1)
    with np.errstate(all="ignore"):
        r = (Q @ T.T) / np.outer(qn, tn)
    r[np.outer(qn == 0, np.isfinite(tn)) | np.outer(np.isfinite(qn), tn == 0)] = 0.0
    return r[0] if q.ndim == 1 else r
