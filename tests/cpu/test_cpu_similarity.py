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


# ==================================================================================================
# Half precision (float16, bfloat16), cosine_similarity and top_k: formerly tests/cpu/test_cpu_half_similarity.py
#
# cosine_similarity and top_k with float16/bfloat16 queries and corpora (rerun on the scalar path by
# test_simd_paths.py), against a float64 computation on the same half values, PyTorch CPU in the same
# dtype and FAISS.
#
# Tolerances. Half values widen to float32 exactly and every product and sum is float32, so the only
# error against float64 on the same values is float32 accumulation: each of <q,t>, |q|^2, |t|^2 over d
# terms is within d * 2^-24 of its exact value relative to |q||t| (Cauchy-Schwarz bounds sum |q_j t_j|),
# and the square roots, product and division add a few units more: ACC(d) = (2d + 8) * 2^-24 absolute on
# a cosine. PyTorch's half cosine normalises each vector in the half dtype before the dot (each element
# of x/|x| and y/|y| rounded: relative error u, so each product within 2u, and their sum within
# 2u sum|x_j y_j|/(|x||y|) <= 2u by Cauchy-Schwarz, one more u for the norms' own rounding) and rounds
# its result (u |cos| <= u), u = 2^-11 for float16 and 2^-8 for bfloat16: within 4u of the exact value
# plus its float32 accumulation ACC(d); against ours: 4u + 2 ACC(d) absolute.


ml_dtypes = need("ml_dtypes")
BF16 = ml_dtypes.bfloat16
HALVES = [np.float16, BF16]
from half_formats import UNIT  # noqa: E402  (unit roundoff per type: 2^-11 float16, 2^-8 bfloat16)


def acc(d):
    return (2 * d + 8) * 2.0 ** -24


def _rank_ref_half(scores, k):
    """Stable order of float32 scores: descending, ties by index, NaN last."""
    s = np.where(np.isnan(scores), -np.inf, scores).astype(np.float64)
    return np.lexsort((np.arange(len(s)), -s, np.isnan(scores)))[:k]


def _torch(a):
    torch = need("torch")
    if a.dtype == BF16:  # torch.from_numpy does not know ml_dtypes: same bits, reinterpreted
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("n", [0, 1, 7, 9, 33, 300])
@pytest.mark.parametrize("d", [0, 1, 7, 8, 9, 31, 33, 100])
def test_cosine_one_query_half(rng, dt, n, d):
    q = rng.standard_normal(d).astype(dt)
    T = rng.standard_normal((n, d)).astype(dt)
    out = S.cosine_similarity(q, T)
    assert out.shape == (n,) and out.dtype == np.float32
    np.testing.assert_allclose(out, cos_ref(q, T), atol=acc(d), rtol=0)


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("m", [2, 5, 12, 13, 40])  # 13 and 40 take the BLAS path on widened blocks
@pytest.mark.parametrize("n,d", [(1, 1), (33, 9), (300, 64), (1000, 7)])
def test_cosine_many_queries_half(rng, monkeypatch, dt, m, n, d):
    # blocks of 16 rows at least: several blocks and a short last one on every shape above
    monkeypatch.setattr(S, "HALF_BLOCK_BYTES", 4 * 16 * d)
    q = rng.standard_normal((m, d)).astype(dt)
    T = rng.standard_normal((n, d)).astype(dt)
    out = S.cosine_similarity(q, T)
    assert out.shape == (m, n) and out.dtype == np.float32
    np.testing.assert_allclose(out, cos_ref(q, T), atol=acc(d), rtol=0)


@pytest.mark.parametrize("qdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("tdt", HALVES)
@pytest.mark.parametrize("m", [1, 3])
def test_mixed_dtypes_are_the_float32_computation_on_the_given_values(rng, qdt, tdt, m):
    """Documented: a mix is not promoted in memory; each input is converted in registers, which gives
    what promotion to float32 would (the fused kernel runs the same float32 operations in the same
    order), bit for bit."""
    q = rng.standard_normal((m, 50)).astype(qdt)
    T = rng.standard_normal((200, 50)).astype(tdt)
    out = hipsched.cosine_similarity(q, T)
    np.testing.assert_array_equal(out, hipsched.cosine_similarity(q.astype(np.float32), T.astype(np.float32)))
    np.testing.assert_allclose(out, cos_ref(q, T), atol=acc(50), rtol=0)


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("d", [8, 100, 768])
def test_cosine_against_torch_same_dtype(rng, dt, d):
    torch = need("torch")
    q = rng.standard_normal((1, d)).astype(dt)
    T = rng.standard_normal((500, d)).astype(dt)
    ours = S.cosine_similarity(q, T)[0]
    theirs = torch.nn.functional.cosine_similarity(_torch(q), _torch(T), dim=1).float().numpy()
    ref = cos_ref(q, T)[0]
    np.testing.assert_allclose(ours, theirs, atol=4 * UNIT[dt] + 2 * acc(d), rtol=0)
    np.testing.assert_allclose(ours, ref, atol=acc(d), rtol=0)


@pytest.mark.parametrize("dt", HALVES)
def test_zero_nan_inf_rows_half(dt):
    T = np.array([[1, 2, 3], [0, 0, 0], [np.nan, 1, 1], [np.inf, 0, 0], [-1, -2, -3]], dtype=dt)
    q = np.array([1, 2, 3], dtype=dt)
    out = S.cosine_similarity(q, T)
    np.testing.assert_allclose(out[[0, 1, 4]], cos_ref(q, T)[[0, 1, 4]], atol=acc(3))
    assert out[1] == 0 and np.isnan(out[2]) and np.isnan(out[3])
    assert np.all(S.cosine_similarity(np.zeros(3, dt), T)[[0, 1, 4]] == 0)


def test_bfloat16_tiny_and_huge_rows_are_scored_in_double(rng):
    """bfloat16 has float32's range: rows whose float32 squares would under- or overflow take the
    double path, as float32 rows do (float16 cannot reach it: its squares stay within float32)."""
    q = rng.standard_normal(40).astype(BF16)
    T = rng.standard_normal((6, 40)).astype(np.float32)
    T[1] *= 1e-25
    T[2] *= 1e25
    T[3] *= 1e-38
    T = T.astype(BF16)
    for m in (1, 3):
        Q = np.stack([q] * m)
        np.testing.assert_allclose(S.cosine_similarity(Q, T), cos_ref(Q, T), atol=acc(40), rtol=0)


def test_float16_extremes_stay_finite(rng):
    """float16's largest values (65504) square to 4.3e9: no overflow in float32 sums, exact scores."""
    T = np.full((3, 768), 65504, np.float16)
    T[1, ::2] = -65504
    T[2] = np.float16(2.0 ** -24)  # the least subnormal: squares 3.6e-15 are normal in float32
    q = np.ones(768, np.float16)
    np.testing.assert_allclose(S.cosine_similarity(q, T), cos_ref(q, T), atol=acc(768), rtol=0)


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("n", [1, 9, 1000, 140_000])  # the last splits one row over threads
@pytest.mark.parametrize("k", [1, 10, 200])
def test_top_k_half_one_query(rng, dt, n, k):
    d = 4 if n > 10_000 else 16
    T = rng.standard_normal((n, d)).astype(dt)
    q = rng.standard_normal(d).astype(dt)
    idx, val = S.top_k(q, T, k)
    scores = S.cosine_similarity(q, T)
    assert idx.dtype == np.int64 and val.dtype == np.float32 and idx.shape == (min(k, n),)
    np.testing.assert_array_equal(idx, _rank_ref_half(scores, k))
    np.testing.assert_array_equal(val, scores[idx])
    ref = cos_ref(q, T)
    np.testing.assert_allclose(val, ref[idx], atol=acc(d))
    # against float64's own ranking: where a gap over 2 ACC(d) separates the k-th and (k+1)-th exact
    # scores, the selected set is forced
    kk = min(k, n)
    order = np.argsort(-ref, kind="stable")
    if kk < n and ref[order[kk - 1]] - ref[order[kk]] > 2 * acc(d):
        assert set(idx.tolist()) == set(order[:kk].tolist())


@pytest.mark.parametrize("dt", HALVES)
def test_top_k_half_ties_and_nan(dt):
    T = np.array([[1, 0], [0, 1], [1, 0], [np.nan, 0], [2, 0], [0, 0], [-1, 0], [np.nan, 1]], dtype=dt)
    q = np.array([1, 0], dtype=dt)
    idx, val = S.top_k(q, T, 3)
    np.testing.assert_array_equal(idx, _rank_ref_half(S.cosine_similarity(q, T), 3))
    np.testing.assert_array_equal(idx, np.flatnonzero(cos_ref(q, T) == 1.0)[:3])  # equal scores: by index
    idx, val = S.top_k(q, T, 100)
    np.testing.assert_array_equal(idx[-2:], np.flatnonzero(np.isnan(T.astype(np.float32)).any(axis=1)))
    assert np.isnan(val[-2:]).all()


@pytest.mark.parametrize("dt", HALVES)
def test_top_k_half_many_queries_match_torch_topk(rng, monkeypatch, dt):
    """Many queries (BLAS on widened blocks, several top_k blocks) against torch.topk over float32
    cosines of the same half values: equal where no two exact scores are within 2 ACC(d)."""
    torch = need("torch")
    monkeypatch.setattr(S, "TOPK_BLOCK_BYTES", 4 * 3000 * 7)
    monkeypatch.setattr(S, "HALF_BLOCK_BYTES", 4 * 700 * 32)
    q = rng.standard_normal((20, 32)).astype(dt)
    T = rng.standard_normal((3000, 32)).astype(dt)
    idx, val = S.top_k(q, T, 10)
    tq = torch.nn.functional.normalize(_torch(q).double(), dim=1)
    tt = torch.nn.functional.normalize(_torch(T).double(), dim=1)
    tv, ti = torch.topk(tq @ tt.T, 11, dim=1)
    for i in range(20):
        if np.all(np.diff(-tv[i].numpy()) > 2 * acc(32)):
            np.testing.assert_array_equal(idx[i], ti[i, :10].numpy())
        np.testing.assert_allclose(val[i], tv[i, :10].numpy(), atol=acc(32))


def test_top_k_fp16_matches_faiss_scalar_quantizer(rng):
    """FAISS's QT_fp16 index stores the same float16 values; on normalised vectors its inner product
    is the cosine (FAISS accumulates in float32 too): same indices where scores are separated."""
    faiss = need("faiss")
    T = rng.standard_normal((5000, 32)).astype(np.float32)
    T /= np.linalg.norm(T, axis=1, keepdims=True)
    q = rng.standard_normal((64, 32)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    Th = T.astype(np.float16)
    index = faiss.IndexScalarQuantizer(32, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    index.train(Th.astype(np.float32))
    index.add(Th.astype(np.float32))
    fv, fi = index.search(q, 11)
    idx, val = hipsched.top_k(q, Th, 10)
    ref = cos_ref(q, Th)
    # FAISS's inner product differs from the cosine by the fp16 norms' error, |1 - |t|| <= 2u (each
    # element rounded relatively by u): a rank is forced where the gaps around it exceed 4u + 2 ACC(d)
    sep = 4 * UNIT[np.float16] + 2 * acc(32)
    checked = 0
    for i in range(len(q)):
        gaps = -np.diff(np.sort(ref[i])[::-1][:11])
        if gaps[-1] > sep:
            assert set(idx[i].tolist()) == set(fi[i, :10].tolist())
            checked += 1
        if np.all(gaps > sep):
            np.testing.assert_array_equal(idx[i], fi[i, :10])
    assert checked >= 1
    # FAISS's scores are inner products of the fp16 vectors, whose norms are not exactly 1 any more;
    # ours are cosines of those same values: compared with float64's cosines
    np.testing.assert_allclose(val, np.take_along_axis(ref, idx, 1), atol=acc(32))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from(HALVES), st.integers(0, 40), st.integers(0, 20), st.integers(1, 50), st.data())
def test_half_cosine_top_k_properties(dt, n, d, k, data):
    bits = st.integers(0, 0xFFFF).map(lambda b: np.uint16(b))
    raw = data.draw(st.lists(bits, min_size=n * d + d, max_size=n * d + d))
    a = np.array(raw, np.uint16).view(dt)
    # keep finite values (NaN/inf rules are tested above); any finite pattern, subnormals included
    a = np.where(np.isfinite(a.astype(np.float32)), a, dt(1.0)).astype(dt)
    q, T = a[:d], a[d:].reshape(n, d)
    scores = hipsched.cosine_similarity(q, T)
    np.testing.assert_allclose(scores, cos_ref(q, T), atol=acc(d), rtol=0)
    idx, _ = hipsched.top_k(q, T, k)
    np.testing.assert_array_equal(idx, _rank_ref_half(scores, min(k, n)))


def test_public_api_half_dtypes_and_errors(rng):
    from hipsched.ops import OPS
    T = rng.standard_normal((50, 16)).astype(BF16)
    q = rng.standard_normal(16).astype(np.float16)
    call = OPS["top_k"].prepare(q, T, 5)
    assert call.dtype == "bfloat16" and call.args[1] is T  # the corpus is not copied or widened
    assert call.nbytes == 2 * 16 + 2 * 50 * 16 + 12 * 5
    assert set(OPS["cosine_similarity"].cpu_dtypes) == set(OPS["cosine_similarity"].gpu_dtypes) == \
        {"float32", "float16", "bfloat16"}
    idx, val = hipsched.top_k(q, T, 5, backend="cpu")
    assert val.dtype == np.float32
    with pytest.raises(TypeError, match="top_k.*'T'.*float16"):
        hipsched.top_k(q, T.astype(np.complex64), 5)
    with pytest.raises(TypeError):
        S.cosine_similarity(q.astype(np.float32), T.astype(np.float64))  # the extension's own guard


# ==================================================================================================
# Half precision (float16, bfloat16), matmul: formerly tests/cpu/test_cpu_half_matmul.py
#
# matmul with float16/bfloat16 operands on the CPU (rerun on the scalar path by test_simd_paths.py),
# against a float64 product of the same half values and PyTorch CPU in the same dtype.
#
# Tolerance. The operands widen to float32 exactly; a float32 dot over k terms is within
# k 2^-24 (|a| @ |b|) of the exact one (the standard gamma_k bound), and the result is rounded once to
# the half format, relative error u (2^-11 float16, 2^-8 bfloat16): |ours - exact| <= u |exact| +
# (1 + u) k 2^-24 (|a| @ |b|). PyTorch's CPU product accumulates in float32 and rounds once too, so the
# same bound holds for it, and twice the bound between the two.


def _bound(a, b, dt):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = np.matmul(a64, b64)
    k = a.shape[-1]
    return exact, UNIT[dt] * np.abs(exact) + (1 + UNIT[dt]) * k * 2.0 ** -24 * np.matmul(np.abs(a64), np.abs(b64))


def _torch_half(a):
    torch = need("torch")
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("sa,sb", [((7, 9), (9, 33)), ((9,), (9, 8)), ((7, 9), (9,)), ((9,), (9,)),
                                   ((3, 4, 5), (5, 6)), ((4, 5), (3, 5, 6)), ((2, 4, 5), (2, 5, 1)),
                                   ((0, 3), (3, 4)), ((4, 0), (0, 5)), ((300, 70), (70, 50))])
def test_half_matmul_against_float64(rng, monkeypatch, dt, sa, sb):
    monkeypatch.setattr(S, "MATMUL_PANEL_BYTES", 4 * 70 * 16)  # several row panels on the last shape
    a = rng.standard_normal(sa).astype(dt)
    b = rng.standard_normal(sb).astype(dt)
    out = hipsched.matmul(a, b, backend="cpu")
    assert out.dtype == np.dtype(dt) and out.shape == np.matmul(a.astype(np.float32), b.astype(np.float32)).shape
    exact, bound = _bound(a, b, dt)
    assert np.all(np.abs(out.astype(np.float64) - exact) <= bound)


@pytest.mark.parametrize("dt", HALVES)
def test_half_matmul_against_torch_same_dtype(rng, dt):
    a = rng.standard_normal((64, 256)).astype(dt)
    b = rng.standard_normal((256, 48)).astype(dt)
    ours = S.matmul(a, b).astype(np.float64)
    theirs = (_torch_half(a) @ _torch_half(b)).float().numpy().astype(np.float64)
    exact, bound = _bound(a, b, dt)
    assert np.all(np.abs(ours - exact) <= bound) and np.all(np.abs(ours - theirs) <= 2 * bound)


# bfloat16 x bfloat16 on AVX512_BF16 (cpu_features()["bf16_dot"]: the plain run on such a CPU;
# test_simd_paths.py reruns this file with HIPSCHED_CPU_FEATURES=avx512, the widening path). vdpbf16ps adds
# exact products in float32, so _bound holds as it is; these shapes cross its 12-row x 32-column register
# tiles, its work items of 128 columns and up to 192 rows (fewer at k = 3001), and odd k (the last pair padded); b of fewer than 16
# columns (and a vector b) takes the widening path at every level.
BF16_DOT = hipsched.cpu_features()["bf16_dot"]


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 4, 15), (5, 9, 16), (3, 4, 17), (11, 2, 31), (12, 3, 32),
                                   (13, 64, 33), (25, 7, 65), (97, 130, 257), (200, 1, 300), (200, 3001, 20),
                                   (5, 0, 17), (0, 4, 20), (4, 5, 0)])
def test_bf16_matmul_tiles_against_float64(rng, m, k, n):
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    out = S.matmul(a, b)
    assert out.dtype == BF16 and out.shape == (m, n)
    exact, bound = _bound(a, b, BF16)
    assert np.all(np.abs(out.astype(np.float64) - exact) <= bound)
    v = rng.standard_normal(k).astype(BF16)   # a vector b: the (k, 1) matrix
    outv = S.matmul(a, v)
    exact, bound = _bound(a, v, BF16)
    assert outv.shape == (m,) and np.all(np.abs(outv.astype(np.float64) - exact) <= bound)


def test_bf16_matmul_nonfinite_values_reach_their_row_and_column_only(rng):
    a = rng.standard_normal((20, 40)).astype(BF16)
    b = rng.standard_normal((40, 50)).astype(BF16)
    a[3, 7] = np.inf
    b[11, 45] = np.nan
    out = S.matmul(a, b).astype(np.float64)
    with np.errstate(invalid="ignore"):
        ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
    fin = np.isfinite(ref)
    exact, bound = _bound(np.where(np.isfinite(a), a, 0).astype(BF16), np.where(np.isfinite(b), b, 0).astype(BF16), BF16)
    assert np.all(np.abs(out[fin] - exact[fin]) <= bound[fin])


def test_bf16_matmul_denormals_flush_on_avx512_bf16():
    """vdpbf16ps reads bfloat16 denormals (|x| < 2^-126) as zero and flushes a product or sum that
    falls below 2^-126 to zero, whatever MXCSR says (Intel SDM, VDPBF16PS). So on the bf16_dot path a
    denormal input contributes nothing and a result in the denormal range comes out 0; the widening path
    (float32 BLAS) keeps both exactly, as float64 does."""
    den = np.array([0x0040], np.uint16).view(BF16)[0]   # 2^-127, a bfloat16 denormal
    tiny = 2.0 ** -127
    # b of 16 columns: narrower ones take the widening path at every level
    a = np.array([[den, 1]], BF16)
    b = np.zeros((2, 16), BF16)
    b[0] = 1
    prod = np.array([[2.0 ** -63]], np.float32).astype(BF16), np.full((1, 16), 2.0 ** -64, np.float32).astype(BF16)
    got_in = float(S.matmul(a, b)[0, 0])
    got_out = float(S.matmul(*prod)[0, 0])
    if BF16_DOT:
        assert got_in == 0.0 and got_out == 0.0
    else:
        assert got_in == tiny and got_out == tiny
    # normal values are untouched either way: 2^-126 (the least normal) times 1 stays
    least = np.array([[2.0 ** -126]], np.float32).astype(BF16)
    assert float(S.matmul(least, np.ones((1, 16), BF16))[0, 0]) == 2.0 ** -126


def test_float16_overflow_and_nan_follow_the_format():
    """A float32 sum past 65504 becomes inf in float16 (as PyTorch's conversion does); NaN propagates;
    bfloat16 has float32's range and stays finite."""
    a = np.full((2, 1024), 300, np.float16)
    a[1, 5] = np.nan
    b = np.full((1024, 3), 300, np.float16)
    out = S.matmul(a, b)
    assert np.all(np.isposinf(out[0])) and np.all(np.isnan(out[1]))
    torch = need("torch")
    np.testing.assert_array_equal(out.astype(np.float32), (_torch_half(a) @ _torch_half(b)).float().numpy())
    ob = S.matmul(a.astype(BF16), b.astype(BF16))
    assert np.all(np.isfinite(ob[0].astype(np.float32)))


def test_mixed_dtypes_promote_to_float32(rng):
    a = rng.standard_normal((5, 6)).astype(np.float16)
    b = rng.standard_normal((6, 4)).astype(BF16)
    out = hipsched.matmul(a, b)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.matmul(a.astype(np.float32), b.astype(np.float32)))
    from hipsched.ops import OPS
    call = OPS["matmul"].prepare(a, a.T)
    assert call.dtype == "float16" and call.nbytes == 2 * (30 + 30 + 25)
    with pytest.raises(TypeError, match="matmul"):
        S.matmul(a, b)  # the extension itself takes one dtype
