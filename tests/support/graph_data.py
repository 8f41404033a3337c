"""Random CSR graphs for the graph tests (CPU engine, emulated GPU, decision path)."""
import numpy as np


def random_graph(rng, n, m, self_loops=True, duplicates=True, isolated=0):
    """CSR arrays of m random edges (unsorted within rows), optionally with self loops, repeated edges,
    and `isolated` nodes that no edge touches."""
    live = max(n - isolated, 0)
    if live == 0 or m == 0:
        return np.zeros(n + 1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    src = rng.integers(0, live, m)
    dst = rng.integers(0, live, m)
    if not self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if duplicates and len(src) > 2:
        src = np.concatenate([src, src[:3]])
        dst = np.concatenate([dst, dst[:3]])
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst.astype(np.int64), rng.random(len(dst)).astype(np.float32)
