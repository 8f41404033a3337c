"""cosine_similarity, top_k and matmul on the CPU kernels against float64 NumPy, FAISS and NumPy's
matmul (rerun on the scalar path by test_simd_paths.py). Tolerances: cosine within 2e-6 absolute of a
float64 reference (float32 dots over d <= 768); top_k's order must equal a stable sort (score
descending, index ascending, NaN last) of our own float32 scores, and the scores must be those
cosine_similarity returns; matmul is NumPy's BLAS, so it must equal np.matmul exactly."""
import os

import numpy as np
from cosine_reference import cos_ref
import pytest
from requires import need
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import hipsched
from hipsched.cpu import _similarity as S

# the scalar-path rerun (test_simd_paths.py) only has to show the portable kernels agree: fewer examples
EXAMPLES = 15 if os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar" else 60

NS = [0, 1, 7, 8, 9, 31, 33, 300]
DS = [0, 1, 7, 8, 9, 31, 33, 100]


_cos_ref = cos_ref


def _rank_ref(scores, k):
    """Stable order of float32 scores: descending, ties by index, NaN last."""
    s = np.where(np.isnan(scores), -np.inf, scores).astype(np.float64)
    nan = np.isnan(scores)
    order = np.lexsort((np.arange(len(s)), -s, nan))
    return order[:k]


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("d", DS)
def test_cosine_one_query(rng, n, d):
    q = rng.standard_normal(d).astype(np.float32)
    T = rng.standard_normal((n, d)).astype(np.float32)
    out = S.cosine_similarity(q, T)
    assert out.shape == (n,) and out.dtype == np.float32
    np.testing.assert_allclose(out, _cos_ref(q, T), atol=2e-6, rtol=0)


@pytest.mark.parametrize("m", [0, 1, 2, 3, 5, 8, 12, 13, 33])  # 13 and 33 take the BLAS path
@pytest.mark.parametrize("n,d", [(0, 5), (1, 1), (33, 9), (300, 64), (1000, 7)])
def test_cosine_many_queries(rng, m, n, d):
    q = rng.standard_normal((m, d)).astype(np.float32)
    T = rng.standard_normal((n, d)).astype(np.float32)
    out = S.cosine_similarity(q, T)
    assert out.shape == (m, n)
    np.testing.assert_allclose(out, _cos_ref(q, T), atol=2e-6, rtol=0)


@pytest.mark.parametrize("m", [None, 3, 20])
def test_cosine_zero_nan_inf_vectors(rng, m):
    d = 10
    T = rng.standard_normal((6, d)).astype(np.float32)
    T[1] = 0
    T[2, 3] = np.nan
    T[3, 0] = np.inf
    q = rng.standard_normal(d if m is None else (m, d)).astype(np.float32)
    if m is not None:
        q[1] = 0
        q[2, 4] = np.nan
    with np.errstate(invalid="ignore"):  # NumPy's BLAS warns on the NaN query
        out = np.atleast_2d(S.cosine_similarity(q, T))
    assert np.all(out[:, 1][np.isfinite(np.atleast_2d(q)).all(axis=1)] == 0)  # zero target row
    assert np.all(np.isnan(out[:, 2])) and np.all(np.isnan(out[:, 3]))
    if m is not None:
        assert np.all(out[1, [0, 1, 4, 5]] == 0)  # zero query against finite rows
        assert np.all(np.isnan(out[2]))
    np.testing.assert_allclose(out, np.atleast_2d(_cos_ref(q, T)), atol=2e-6, rtol=0, equal_nan=True)


@pytest.mark.parametrize("m", [None, 2, 20])
def test_cosine_tiny_and_huge_vectors_scored_in_double(rng, m):
    T = rng.standard_normal((40, 24)).astype(np.float32)
    T[3] *= np.float32(1e-30)  # squares underflow float32
    T[5] *= np.float32(1e25)   # squares overflow float32
    T[7, :2] = [1e-45, 0]      # a subnormal, otherwise zero
    T[7, 2:] = 0
    q = rng.standard_normal(24 if m is None else (m, 24)).astype(np.float32)
    if m:
        q[1] *= np.float32(1e-32)
    np.testing.assert_allclose(S.cosine_similarity(q, T), _cos_ref(q, T), atol=2e-6, rtol=0)


def test_cosine_paths_agree(rng, monkeypatch):
    q = rng.standard_normal((5, 40)).astype(np.float32)
    T = rng.standard_normal((500, 40)).astype(np.float32)
    fused = S.cosine_similarity(q, T)
    monkeypatch.setattr(S, "FUSED_MAX_QUERIES", 0)
    np.testing.assert_allclose(S.cosine_similarity(q, T), fused, atol=1e-6)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 31, 33, 1000, 140_000])  # the last splits one row over threads
@pytest.mark.parametrize("k", [1, 10, 200])  # 200 takes the sorting path
def test_top_k_one_query(rng, n, k):
    d = 4 if n > 10_000 else 16
    T = rng.standard_normal((n, d)).astype(np.float32)
    q = rng.standard_normal(d).astype(np.float32)
    idx, val = S.top_k(q, T, k)
    scores = S.cosine_similarity(q, T)
    assert idx.dtype == np.int64 and val.dtype == np.float32 and idx.shape == (min(k, n),)
    np.testing.assert_array_equal(idx, _rank_ref(scores, k))
    np.testing.assert_array_equal(val, scores[idx])
    np.testing.assert_allclose(val, _cos_ref(q, T)[idx], atol=2e-6)


@pytest.mark.parametrize("m", [0, 1, 2, 5, 40])
def test_top_k_many_queries_in_blocks(rng, monkeypatch, m):
    monkeypatch.setattr(S, "TOPK_BLOCK_BYTES", 4 * 300 * 3)  # three queries per block
    T = rng.standard_normal((300, 12)).astype(np.float32)
    q = rng.standard_normal((m, 12)).astype(np.float32)
    idx, val = S.top_k(q, T, 7)
    assert idx.shape == (m, 7) and val.shape == (m, 7)
    # each block of three is scored as its own cosine_similarity call would (the fused path)
    scores = np.concatenate([S.cosine_similarity(q[b:b + 3], T) for b in range(0, m, 3)]) if m else q
    for i in range(m):
        np.testing.assert_array_equal(idx[i], _rank_ref(scores[i], 7))
        np.testing.assert_array_equal(val[i], scores[i, idx[i]])


@pytest.mark.parametrize("k", [3, 150])
def test_top_k_ties_nan_and_k_above_n(k):
    T = np.array([[1, 0], [0, 1], [1, 0], [np.nan, 0], [2, 0], [0, 0], [-1, 0], [np.nan, 1]], np.float32)
    T = np.tile(T, (20, 1)) if k > 128 else T
    q = np.array([1, 0], np.float32)
    idx, val = S.top_k(q, T, k)
    scores = S.cosine_similarity(q, T)
    kk = min(k, len(T))
    assert len(idx) == kk
    np.testing.assert_array_equal(idx, _rank_ref(scores, kk))
    if k == 3:
        np.testing.assert_array_equal(idx, [0, 2, 4])  # three equal scores of 1: by index
        idx, val = S.top_k(q, T, 100)
        np.testing.assert_array_equal(idx[-2:], [3, 7])  # NaN scores last, by index
        assert np.isnan(val[-2:]).all()


def test_top_k_matches_faiss(rng):
    faiss = need("faiss")
    T = rng.standard_normal((5000, 32)).astype(np.float32)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    Tn = T / np.linalg.norm(T, axis=1, keepdims=True)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(32)
    index.add(Tn)
    fv, fi = index.search(qn, 10)
    idx, val = hipsched.top_k(q, T, 10)
    np.testing.assert_array_equal(idx, fi)
    np.testing.assert_allclose(val, fv, atol=2e-6)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(0, 40), st.integers(0, 20), st.integers(1, 50), st.data())
def test_cosine_top_k_properties(n, d, k, data):
    elems = st.one_of(st.floats(-100, 100, width=32), st.sampled_from([0.0, -0.0, 1e-20, 1.0]))
    T = data.draw(hnp.arrays(np.float32, (n, d), elements=elems))
    q = data.draw(hnp.arrays(np.float32, (d,), elements=elems))
    scores = hipsched.cosine_similarity(q, T)
    np.testing.assert_allclose(scores, _cos_ref(q, T), atol=1e-5, rtol=0)
    assert np.all(np.abs(scores) <= 1 + 1e-5)
    idx, val = hipsched.top_k(q, T, k)
    np.testing.assert_array_equal(idx, _rank_ref(scores, min(k, n)))


@pytest.mark.parametrize("sa,sb", [((7, 9), (9, 33)), ((9,), (9, 8)), ((7, 9), (9,)), ((9,), (9,)),
                                   ((3, 4, 5), (5, 6)), ((4, 5), (3, 5, 6)), ((2, 4, 5), (2, 5, 1)),
                                   ((0, 3), (3, 4)), ((4, 0), (0, 5))])
def test_matmul_is_numpy_blas(rng, sa, sb):
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    out = S.matmul(a, b)
    np.testing.assert_array_equal(out, np.matmul(a, b))
    np.testing.assert_allclose(out, np.matmul(a.astype(np.float64), b.astype(np.float64)), rtol=1e-4, atol=1e-4)


def test_public_api_routes_to_the_cpu_kernels(rng):
    T = rng.standard_normal((50, 16)).astype(np.float32)
    q = rng.standard_normal((3, 16)).astype(np.float32)
    ex = hipsched.Executor()
    for api in (ex, hipsched):
        np.testing.assert_allclose(api.cosine_similarity(q, T, backend="cpu"), _cos_ref(q, T), atol=2e-6)
        idx, val = api.top_k(q[0], T, 5, backend="cpu")
        np.testing.assert_array_equal(idx, _rank_ref(S.cosine_similarity(q[0], T), 5))
        np.testing.assert_array_equal(api.matmul(q, T.T, backend="cpu"), q @ T.T)


def test_extension_refuses_arrays_its_kernels_cannot_read_safely():
    f32 = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError):
        S.cosine_similarity(np.ones(3), f32)  # float64
    with pytest.raises(TypeError):
        S.cosine_similarity(np.ones(3, np.float32), np.ones((3, 4), np.float32).T)  # not C-contiguous
    with pytest.raises(ValueError):
        S.cosine_similarity(np.ones(5, np.float32), f32)  # d mismatch would read out of bounds
    with pytest.raises(ValueError):
        S.top_k(f32[0], f32, 0)
