"""Half precision (float16, bfloat16) through hipsched.dask: each op takes what its single-machine op takes,
declares the dtype that op returns (the chunks then have it: a Dask array whose dtype lies would give
wrong results downstream), and gives that op's values: bit for bit where the single-machine op
computes each output from the same inputs in the same order, within the stated bound for matmul."""
import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
distributed = need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")
ml_dtypes = need("ml_dtypes")

import dask  # noqa: E402

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from dask_support import job_fixture  # noqa: E402
from half_formats import UNIT  # noqa: E402

job = job_fixture("half")

HALVES = [pytest.param(np.float16, id="float16"), pytest.param(ml_dtypes.bfloat16, id="bfloat16")]


def _same(got, ref):
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert got.tobytes() == ref.tobytes()


def _computed(x):
    """x computed, after checking that its declared dtype is its chunks' dtype."""
    out = x.compute()
    assert out.dtype == x.dtype, f"declared {x.dtype}, chunks are {out.dtype}"
    return out


@pytest.mark.parametrize("dt", HALVES)
def test_top_k_search_and_cosine_over_a_half_corpus(dask_client, job, dt):
    rng = np.random.default_rng(41)
    T = rng.standard_normal((3000, 24)).astype(dt)
    T[2900] = T[7]
    Td = da.from_array(T, chunks=(250, 24)).persist()
    distributed.wait(Td)
    from hipsched.dask import direct
    for q in (rng.standard_normal(24).astype(np.float32), rng.standard_normal((12, 24)).astype(np.float32), T[7].copy()):
        ref = hs.top_k(q, T, 10)
        served = direct.search_stats["direct"]
        for got in (dask.compute(*hd.top_k(q, Td, 10)), hd.search(q, Td, 10)):
            _same(got[0], ref[0])
            _same(got[1], ref[1])
        assert direct.search_stats["direct"] == served + 1   # search answered directly, not through the graph
        _same(_computed(hd.cosine_similarity(q, Td)), hs.cosine_similarity(q, T))


@pytest.mark.parametrize("dt", HALVES)
def test_elementwise_ops_keep_the_half_type(dask_client, job, dt):
    rng = np.random.default_rng(42)
    a = rng.standard_normal((60, 40)).astype(dt)
    b = rng.standard_normal((60, 40)).astype(dt)
    bias = rng.standard_normal(40).astype(dt)
    ad, bd = da.from_array(a, chunks=(16, 40)), da.from_array(b, chunks=(25, 40))
    _same(_computed(hd.add(ad, bd)), hs.add(a, b))
    _same(_computed(hd.add(ad, bias)), hs.add(a, bias))          # a NumPy half bias stays half
    _same(_computed(hd.scale(ad, 0.3)), hs.scale(a, 0.3))
    _same(_computed(hd.softmax(ad, axis=-1)), hs.softmax(a, axis=-1))
    # a mix of types is float32, as on one machine
    _same(_computed(hd.add(ad, b.astype(np.float32))), hs.add(a, b.astype(np.float32)))
    other = np.float16 if dt is not np.float16 else ml_dtypes.bfloat16
    _same(_computed(hd.add(ad, da.from_array(b.astype(other), chunks=(16, 40)))), hs.add(a, b.astype(other)))


@pytest.mark.parametrize("dt", HALVES)
def test_matmul_and_attention_keep_the_half_type(dask_client, job, dt):
    rng = np.random.default_rng(43)
    a = rng.standard_normal((50, 64)).astype(dt)
    b = rng.standard_normal((64, 30)).astype(dt)
    ref = hs.matmul(a, b)
    # the float32 bound of the sums (as in test_dask_linalg) plus one rounding to the half type on each side
    eps = UNIT[dt]
    mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    for ca in ((10, 64), (10, 16)):   # the contraction whole, then in 4 chunks (partial sums in float32)
        got = _computed(hd.matmul(da.from_array(a, chunks=ca), da.from_array(b, chunks=(ca[1], 30))))
        assert got.dtype == ref.dtype == np.dtype(dt)
        err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        assert np.all(err <= 2 * eps * np.abs(ref.astype(np.float64)) + 2 * 70 * 2.0 ** -24 * mag)
    q = rng.standard_normal((2, 4, 33, 16)).astype(dt)
    k = rng.standard_normal((2, 4, 40, 16)).astype(dt)
    v = rng.standard_normal((2, 4, 40, 16)).astype(dt)
    for causal in (False, True):
        got = _computed(hd.attention(da.from_array(q, chunks=(1, 2, 33, 16)), da.from_array(k, chunks=(1, 2, 40, 16)),
                                     da.from_array(v, chunks=(1, 2, 40, 16)), causal=causal))
        _same(got, hs.attention(q, k, v, causal=causal))
