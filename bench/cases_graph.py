"""spread_activation benchmarks: one step over 1M nodes and 16M random float32 edges against the
SciPy product the step needs (A.T @ a on the CSR matrix: single-threaded), and a sparse-seed,
three-step case against the same rule written with SciPy. Our time includes validation and the
conversion of SciPy's int32 indptr to int64."""
import numpy as np

from harness import Case


def _scipy_rule(AT, a, decay, steps, threshold):
    for _ in range(steps):
        a = np.clip(a + decay * (AT @ a), 0, 1)
        a[a < threshold] = 0
    return a


def cases():
    import scipy.sparse as sp

    import hipsched as hs

    rng = np.random.default_rng(0)
    ex = hs.Executor()
    n, m = 1_000_000, 16_000_000
    src = np.sort(rng.integers(0, n, m))
    indptr = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    del src
    A = sp.csr_matrix((rng.random(m, dtype=np.float32), rng.integers(0, n, m, dtype=np.int32), indptr), shape=(n, n))
    a = rng.random(n, dtype=np.float32)
    nbytes = A.indptr.nbytes + A.indices.nbytes + A.data.nbytes + 2 * a.nbytes
    out = [Case("spread_activation", "1M nodes, 16M edges, 1 step",
                lambda: ex.spread_activation(A, a, decay=0.5, steps=1, threshold=0.0, backend="cpu"),
                lambda: A.T @ a, "scipy A.T @ a", bytes=nbytes, target=1.5, family="graph")]
    seeds = np.zeros(n, np.float32)
    seeds[rng.integers(0, n, 1000)] = 1.0
    out.append(Case("spread_activation", "same graph, 1000 seeds, 3 steps",
                    lambda: ex.spread_activation(A, seeds, decay=0.1, steps=3, threshold=0.01, backend="cpu"),
                    lambda: _scipy_rule(A.T, seeds, 0.1, 3, 0.01), "scipy rule (3x A.T @ a)", family="graph"))
    return out
