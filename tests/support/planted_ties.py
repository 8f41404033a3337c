"""Tied top_k scores planted where a split's merge must order them: inside the top k and on both sides
of the cuts, with scores every engine computes exactly (so a CPU part and a GPU part tie bit for bit).

A query is 16 entries of +-1 at random positions, the rest 0: |q|^2 = 16. A copy of it scores exactly
1 (16 / (4 * 4)); a row agreeing with it on 12 of those entries, with 4 entries of +-1 where q is 0,
scores exactly 0.75 (12 / (4 * 4)): every dot product and squared norm is a small integer and every
square root a power of two, whatever the order of the sums or the width of the arithmetic. Random
normal rows of d >= 24 score about 0.2 +- 0.2, so the planted rows are the top of the ranking: the
copies first, then the 0.75 pair, all tied among themselves and to be ordered by ascending index."""
from __future__ import annotations

import numpy as np

ONES = 16   # nonzero entries of a planted query (|q| = 4)


def exact_query(rng, d: int) -> np.ndarray:
    if d < ONES + 4:
        raise ValueError(f"a planted query needs d >= {ONES + 4}, got {d}")
    q = np.zeros(d, np.float32)
    q[rng.choice(d, ONES, replace=False)] = rng.choice(np.float32([-1, 1]), ONES)
    return q


def near(rng, q: np.ndarray) -> np.ndarray:
    """A row scoring exactly 0.75 against q: 4 of q's entries moved to where q is 0."""
    on, off = np.flatnonzero(q), np.flatnonzero(q == 0)
    r = q.copy()
    r[rng.choice(on, 4, replace=False)] = 0
    r[rng.choice(off, 4, replace=False)] = rng.choice(np.float32([-1, 1]), 4)
    return r


def plant(rng, T: np.ndarray, q: np.ndarray, best, second=()) -> None:
    """Copies of q in T's rows `best` (score 1) and one row scoring 0.75 in each of `second`
    (the same row in each: a tie). T is changed in place, in its own dtype (+-1 and 0 are exact in
    every float type)."""
    T[list(best)] = q.astype(T.dtype)
    if len(second):
        T[list(second)] = near(rng, q).astype(T.dtype)


def expected_head(best, second=()) -> list:
    """The indices the top of a top_k over a planted T must start with: ties to the lower index."""
    return sorted(best) + sorted(second)
