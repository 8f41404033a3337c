"""spread_activation on the CPU kernel against a float64 NumPy/SciPy evaluation of the documented rule:
each step a_new = clip(a + decay * A^T a, 0, 1), then 0 where a_new < threshold. Tolerance: atol 2e-6
per step (float32 accumulation, summation order differs). A value that falls within 1e-4 of the
threshold in the reference could flip either way under rounding: such cases are generated away."""
import os

import numpy as np
import pytest
from requires import need

need("scipy.sparse", reason="SciPy's sparse matrices are the reference (test extra)")
import scipy.sparse as sp  # noqa: E402
from hypothesis import assume, given, settings, strategies as st

import hipsched
from hipsched.cpu import _graph as G
from hipsched.ops import OPS

from graph_data import random_graph

EXAMPLES = 15 if os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar" else 60


def reference(indptr, indices, weights, seeds, decay, steps, threshold):
    """The rule in float64 through SciPy's CSR (duplicates summed). Also returns how close any value came
    to the threshold, to keep rounding-sensitive cases out of the comparisons."""
    n = len(indptr) - 1
    A = sp.csr_matrix((np.asarray(weights, np.float64), np.asarray(indices), np.asarray(indptr)), shape=(n, n))
    a = np.asarray(seeds, np.float64)
    margin = np.inf
    for _ in range(steps):
        a = np.clip(a + decay * (A.T @ a), 0.0, 1.0)
        if a.size:
            margin = min(margin, np.abs(a - threshold).min())
        a[a < threshold] = 0.0
    return a, margin


def check(indptr, indices, weights, seeds, decay, steps, threshold, **kw):
    out = hipsched.spread_activation((indptr, indices, weights), seeds, decay=decay, steps=steps,
                                     threshold=threshold, **kw)
    ref, margin = reference(indptr, indices, weights, seeds, decay, steps, threshold)
    assert out.dtype == np.float32 and out.shape == (len(indptr) - 1,)
    if margin > 1e-4:
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * max(steps, 1))
    return out, ref, margin


@pytest.mark.parametrize("n,m", [(1, 0), (1, 3), (7, 20), (8, 64), (9, 5), (31, 200), (33, 1000), (500, 4000)])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_random_graphs_match_reference(rng, n, m, steps):
    indptr, indices, weights = random_graph(rng, n, m, isolated=n // 4)
    seeds = np.where(rng.random(n) < 0.3, rng.random(n), 0).astype(np.float32)
    out, ref, margin = check(indptr, indices, weights, seeds, 0.4, steps, 0.05)
    assert margin > 1e-4  # the fixed seed gives a comparable case: the assertion above did run


def test_large_graph_uses_threads_and_matches(rng):
    """Past the two-thread grain (2^18 edges): rows split by edge count, accumulators summed."""
    indptr, indices, weights = random_graph(rng, 20_000, 400_000)
    seeds = (rng.random(20_000) * 0.02).astype(np.float32)
    for idx in (np.int32, np.int64):
        out = G.spread_activation(indptr.astype(idx), indices.astype(idx), weights, seeds, decay=0.01, steps=2,
                                  threshold=0.0)
        ref, _ = reference(indptr, indices, weights, seeds, 0.01, 2, 0.0)
        np.testing.assert_allclose(out, ref, rtol=0, atol=5e-6)


def test_repeated_calls_and_a_failed_call_leave_no_state(rng):
    """The kernel keeps its zeroed accumulators between calls: a call that fails half way must not leak
    its partial sums into the next one."""
    indptr, indices, weights = random_graph(rng, 20_000, 400_000)
    seeds = rng.random(20_000).astype(np.float32)
    first = G.spread_activation(indptr, indices, weights, seeds, decay=0.01, steps=1, threshold=0.0)
    bad = indices.copy()
    bad[-1] = 20_000
    with pytest.raises(ValueError, match=r"indices\[\d+\] = 20000 is out of range"):
        G.spread_activation(indptr, bad, weights, seeds, decay=0.01, steps=1, threshold=0.0)
    np.testing.assert_array_equal(G.spread_activation(indptr, indices, weights, seeds, decay=0.01, steps=1,
                                                      threshold=0.0), first)


def test_concurrent_calls_agree(rng):
    """One call at a time holds the kernel's cached accumulators; the others must use their own."""
    from concurrent.futures import ThreadPoolExecutor
    indptr, indices, weights = random_graph(rng, 20_000, 300_000)
    seeds = [rng.random(20_000).astype(np.float32) for _ in range(6)]
    want = [G.spread_activation(indptr, indices, weights, s, decay=0.05, steps=2, threshold=0.0) for s in seeds]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda s: G.spread_activation(indptr, indices, weights, s, decay=0.05, steps=2,
                                                          threshold=0.0), seeds * 3))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, want[i % 6])


def test_self_loops_and_duplicate_edges_add_up():
    # 0 -> 0 (0.5), 0 -> 1 twice (0.25 + 0.25), 1 -> 2 (1.0); node 3 isolated
    indptr = np.array([0, 3, 4, 4, 4])
    indices = np.array([0, 1, 1, 2])
    weights = np.array([0.5, 0.25, 0.25, 1.0], np.float32)
    seeds = np.array([0.4, 0.0, 0.0, 0.7], np.float32)
    out = hipsched.spread_activation((indptr, indices, weights), seeds, decay=0.5, steps=1)
    np.testing.assert_allclose(out, [0.4 + 0.5 * 0.5 * 0.4, 0.5 * 0.5 * 0.4, 0.0, 0.7], rtol=1e-6)
    out2 = hipsched.spread_activation((indptr, indices, weights), seeds, decay=0.5, steps=2)
    np.testing.assert_allclose(out2, reference(indptr, indices, weights, seeds, 0.5, 2, 0.0)[0], atol=1e-6)


def test_clamp_threshold_and_steps_zero():
    indptr, indices = np.array([0, 2, 2, 2]), np.array([1, 2])
    weights = np.array([10.0, -10.0], np.float32)
    seeds = np.array([0.5, 0.1, 0.3], np.float32)
    out = hipsched.spread_activation((indptr, indices, weights), seeds, decay=1.0, steps=1, threshold=0.2)
    np.testing.assert_array_equal(out, [0.5, 1.0, 0.0])  # 0.1 + 5 -> 1; 0.3 - 5 -> 0
    seeds_out_of_range = np.array([-1.0, 2.0, 0.1], np.float32)
    np.testing.assert_array_equal(  # steps=0: the seeds as given, no rule applied
        hipsched.spread_activation((indptr, indices, weights), seeds_out_of_range, steps=0), seeds_out_of_range)


def test_empty_graph_and_no_edges():
    out = hipsched.spread_activation((np.array([0]), np.array([], np.int64), np.array([], np.float32)),
                                     np.array([], np.float32))
    assert out.shape == (0,) and out.dtype == np.float32
    seeds = np.array([0.2, 0.9, 0.0], np.float32)
    out = hipsched.spread_activation(sp.csr_matrix((3, 3), dtype=np.float32), seeds, decay=0.7, steps=4)
    np.testing.assert_array_equal(out, seeds)


def test_nan_and_inf_follow_the_rule():
    indptr, indices = np.array([0, 1, 2, 3]), np.array([1, 2, 0])
    weights = np.array([1.0, np.inf, 1.0], np.float32)
    # node 0 (NaN) feeds node 1 -> NaN; node 1 (0.5) feeds node 2 through inf -> clamps to 1
    out = hipsched.spread_activation((indptr, indices, weights), np.array([np.nan, 0.5, 0.0], np.float32),
                                     decay=0.5, steps=1)
    assert np.isnan(out[0]) and np.isnan(out[1]) and out[2] == 1.0
    # an inactive node's inf weight: 0 * inf is NaN, which reaches its target as in SciPy's A.T @ a
    out = hipsched.spread_activation((indptr, indices, weights), np.array([0.0, 0.0, 0.4], np.float32),
                                     decay=0.5, steps=1)
    np.testing.assert_allclose(out, [0.2, 0.0, np.nan])


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_non_finite_weights_of_inactive_nodes_match_scipy(rng, steps):
    """SciPy's formula multiplies every stored weight, 0 * NaN and 0 * inf included, so a NaN or inf
    weight out of an inactive node makes its target NaN (the README: NaN propagates as NumPy's
    formulas would). The kernel skips inactive nodes' edges; these must still count, in the first step
    and after (a node active in step 1, inactive in step 2, with a NaN weight)."""
    indptr, indices, weights = random_graph(rng, 400, 3000, isolated=40)
    weights = weights.copy()
    bad = rng.choice(weights.size, 12, replace=False)
    weights[bad[:6]] = np.nan
    weights[bad[6:9]] = np.inf
    weights[bad[9:]] = -np.inf
    seeds = np.where(rng.random(400) < 0.1, rng.random(400), 0).astype(np.float32)
    out = hipsched.spread_activation((indptr, indices, weights), seeds, decay=0.3, steps=steps, threshold=0.05)
    ref, _ = reference(indptr, indices, weights, seeds, 0.3, steps, 0.05)
    assert np.isnan(ref).sum() > 0
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    finite = ~np.isnan(ref)
    np.testing.assert_allclose(out[finite], ref[finite], rtol=0, atol=1e-4)


@pytest.mark.parametrize("value,error", [("high", TypeError), (1j, TypeError), (None, TypeError),
                                         (b"1", TypeError), ([0.5, 0.5], ValueError)])
def test_dict_seed_values_are_validated_like_dense_seeds(value, error):
    # "high" raised NumPy's bare ValueError, 1j a bare TypeError, None spread NaN silently
    g = (np.array([0, 1, 1]), np.array([1]), np.array([0.5], np.float32))
    with pytest.raises(error, match=r"spread_activation: .*seeds\[0\]"):
        hipsched.spread_activation(g, {0: value})
    np.testing.assert_array_equal(hipsched.spread_activation(g, {0: np.float64(0.5)}, decay=0.5), [0.5, 0.125])


@pytest.mark.parametrize("steps", [2**63, 2**31, np.uint64(2**64 - 1)])
def test_steps_past_the_kernel_counter_is_a_value_error_naming_steps(steps):
    # 2**63 was a bare OverflowError from the int64 cast
    g = (np.array([0, 1, 1]), np.array([1]), np.array([0.5], np.float32))
    with pytest.raises(ValueError, match="spread_activation: steps must be <="):
        hipsched.spread_activation(g, {0: 1.0}, steps=steps)


def test_scipy_inputs_and_dict_seeds(rng):
    n = 40
    A = sp.random(n, n, density=0.1, format="csr", dtype=np.float32, random_state=3)
    seeds = {0: 1.0, 5: 0.5, np.int64(17): 0.25}
    dense = np.zeros(n, np.float32)
    dense[[0, 5, 17]] = [1.0, 0.5, 0.25]
    want = hipsched.spread_activation((A.indptr, A.indices, A.data), dense, decay=0.3, steps=2)
    ref, _ = reference(A.indptr, A.indices, A.data, dense, 0.3, 2, 0.0)
    np.testing.assert_allclose(want, ref, atol=4e-6)
    for g in (A, sp.csr_array(A), A.tocsc(), A.tocoo(), A.astype(np.float64)):
        np.testing.assert_allclose(hipsched.spread_activation(g, seeds, decay=0.3, steps=2), want, atol=1e-7)
    for idx in (np.int32, np.uint32, np.int16, np.uint64):
        np.testing.assert_array_equal(
            hipsched.spread_activation((A.indptr.astype(idx), A.indices.astype(idx), A.data), dense, decay=0.3,
                                       steps=2), want)


def test_non_contiguous_inputs(rng):
    indptr, indices, weights = random_graph(rng, 50, 300)
    seeds = rng.random(50).astype(np.float32)
    want = hipsched.spread_activation((indptr, indices, weights), seeds, decay=0.2, steps=2)
    strided = [np.repeat(x, 2)[::2] for x in (indptr, indices, weights, seeds)]
    assert not strided[0].flags.c_contiguous
    np.testing.assert_array_equal(
        hipsched.spread_activation(tuple(strided[:3]), strided[3], decay=0.2, steps=2), want)


@pytest.mark.parametrize("indptr,indices,msg", [
    ([0, 2, 3], [0, 2, 1], r"indices\[1\] = 2 is out of range for a graph of 2 nodes"),
    ([0, 2, 3], [0, -1, 1], r"indices\[1\] = -1 is out of range"),
    ([0, 2, 3], [0, 1, 2**40], r"indices\[2\] = 1099511627776 is out of range"),
    ([1, 2, 3], [0, 1, 1], r"indptr is not a valid CSR row pointer at position 0"),
    ([0, 3, 2], [0, 1, 1], r"indptr is not a valid CSR row pointer at position 2"),
    ([0, 1, 2], [0, 1, 1], r"indptr is not a valid CSR row pointer at position 2 .*end at nnz = 3"),
    ([0, 2, 4], [0, 1, 1], r"indptr is not a valid CSR row pointer at position 2"),
])
@pytest.mark.parametrize("steps", [0, 1, 2])
def test_bad_graphs_are_value_errors(indptr, indices, msg, steps):
    weights = np.ones(len(indices), np.float32)
    with pytest.raises(ValueError, match=msg):
        hipsched.spread_activation((np.array(indptr), np.array(indices), weights), np.ones(2), steps=steps)


def test_bad_index_behind_an_inactive_node_is_still_caught():
    """Rows with zero activation are skipped by the scatter but their indices are still checked."""
    indptr, indices = np.array([0, 1, 2]), np.array([1, 7])
    with pytest.raises(ValueError, match=r"indices\[1\] = 7"):
        hipsched.spread_activation((indptr, indices, np.ones(2, np.float32)), np.array([1.0, 0.0]), steps=1)


def test_bad_arguments():
    g = (np.array([0, 1, 2]), np.array([1, 0]), np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"shapes do not match: seeds \(3,\) vs graph \(2, 2\)"):
        hipsched.spread_activation(g, np.ones(3))
    with pytest.raises(ValueError, match=r"shapes do not match: indices \(2,\) vs weights \(3,\)"):
        hipsched.spread_activation((g[0], g[1], np.ones(3)), np.ones(2))
    with pytest.raises(ValueError, match="must be square"):
        hipsched.spread_activation(sp.csr_matrix((2, 3)), np.ones(2))
    with pytest.raises(TypeError, match="indices must hold integers"):
        hipsched.spread_activation((g[0], g[1].astype(np.float64), g[2]), np.ones(2))
    with pytest.raises(TypeError, match="graph must be a SciPy sparse matrix"):
        hipsched.spread_activation(np.eye(2), np.ones(2))
    with pytest.raises(ValueError, match="steps must be >= 0"):
        hipsched.spread_activation(g, np.ones(2), steps=-1)
    with pytest.raises(TypeError, match="steps must be an integer"):
        hipsched.spread_activation(g, np.ones(2), steps=1.5)
    with pytest.raises(ValueError, match="decay must be finite"):
        hipsched.spread_activation(g, np.ones(2), decay=float("nan"))
    with pytest.raises(ValueError, match="threshold must be finite"):
        hipsched.spread_activation(g, np.ones(2), threshold=float("inf"))
    with pytest.raises(ValueError, match="seed node 5 is out of range"):
        hipsched.spread_activation(g, {5: 1.0})
    with pytest.raises(ValueError, match="indptr must hold n"):
        hipsched.spread_activation((np.array([], np.int64), np.array([], np.int64), np.array([])), np.ones(0))
    with pytest.raises(TypeError, match=r"indices must be a 1-d contiguous int32 \(as indptr\)"):
        G.spread_activation(g[0].astype(np.int32), g[1], g[2], np.ones(2, np.float32))  # the extension's guard


def test_call_work_measures():
    g = (np.array([0, 1, 3]), np.array([1, 0, 1], np.int32), np.ones(3, np.float32))
    call = OPS["spread_activation"].prepare(g, np.ones(2), decay=0.5, steps=4, threshold=0.1)
    assert call.size == 3 * 4
    # int64 offsets with int32 indices: the n + 1 offsets narrow (they fit), the nnz indices stay
    assert [a.dtype for a in call.args] == [np.int32, np.int32, np.float32, np.float32]
    assert call.args[1] is g[1]
    assert call.params == {"decay": 0.5, "steps": 4, "threshold": 0.1}
    assert call.nbytes == 3 * 4 + 3 * 4 + 3 * 4 + 2 * 2 * 4
    wide = (g[0], g[1].astype(np.int64), g[2])                   # both int64: no conversion at all
    assert [a.dtype for a in OPS["spread_activation"].prepare(wide, np.ones(2)).args[:2]] == [np.int64, np.int64]
    assert OPS["spread_activation"].prepare(wide, np.ones(2)).args[0] is g[0]
    assert OPS["spread_activation"].prepare(g, np.ones(2), steps=0).size == 3
    ip32 = g[0].astype(np.int32)
    call = OPS["spread_activation"].prepare((ip32, g[1], g[2]), np.ones(2))
    assert call.args[0] is ip32 and call.args[1] is g[1]  # SciPy's int32 pair passes through uncopied


def test_offsets_past_int32_are_never_narrowed_into_a_valid_looking_graph():
    """Narrowing int64 offsets to int32 must not wrap: 2**32 + 1 would become 1 and [0, 1, 3] a valid
    graph. Offsets outside int32 keep both arrays int64, where the check sees them as they are."""
    indices = np.array([1, 0, 1], np.int32)
    for bad in (2**32 + 1, -(2**32) + 1):
        with pytest.raises(ValueError, match="indptr is not a valid CSR row pointer"):
            OPS["spread_activation"].prepare((np.array([0, bad, 3]), indices, np.ones(3, np.float32)), np.ones(2))


def test_a_fixed_graph_is_converted_once(rng):
    """A graph whose arrays cannot change (read-only, owning their memory) is converted once and the
    same read-only copy passed on every call, so the GPU keeps it resident (a new copy per call was
    uploaded per call: the demo's 8M-edge graph, 64 MB of its indices widened to int64 each time). A
    writable graph, or a read-only view of a writable one, is converted afresh: it may have changed."""
    indptr, indices, weights = random_graph(rng, 200, 2000)
    indptr = indptr.astype(np.int64)
    indices = indices.astype(np.int32)
    seeds = np.where(rng.random(200) < 0.3, rng.random(200), 0).astype(np.float32)
    prep = OPS["spread_activation"].prepare
    first = prep((indptr, indices, weights), seeds).args[0]
    assert first is not prep((indptr, indices, weights), seeds).args[0]          # writable: afresh
    view = indptr[:]
    view.flags.writeable = False
    assert prep((view, indices, weights), seeds).args[0] is not prep((view, indices, weights), seeds).args[0]
    frozen = indptr.copy()
    frozen.flags.writeable = False
    a = prep((frozen, indices, weights), seeds).args[0]
    assert a is prep((frozen, indices, weights), seeds).args[0]
    assert a.dtype == np.int32 and not a.flags.writeable
    np.testing.assert_array_equal(a, indptr)
    wide = indices.astype(np.int64)            # int64 indices: the offsets stay int64, nothing converted
    assert prep((frozen, wide, weights), seeds).args[0] is frozen
    check(frozen, indices, weights, seeds, 0.4, 2, 0.05)
    # the kept copy goes with its source
    from hipsched.ops import converted_copies
    key = id(frozen)
    assert any(k[0] == key for k in converted_copies._converted)
    del frozen, a, view
    assert not any(k[0] == key for k in converted_copies._converted)


def test_prepare_validates_before_any_backend_runs():
    """The GPU kernels trust the Call: a bad graph must fail in prepare, not only in the CPU kernel."""
    with pytest.raises(ValueError, match=r"indices\[1\] = 9 is out of range"):
        OPS["spread_activation"].prepare((np.array([0, 1, 2]), np.array([1, 9]), np.ones(2)), np.ones(2))
    with pytest.raises(ValueError, match="indptr is not a valid CSR row pointer at position 2"):
        OPS["spread_activation"].prepare((np.array([0, 3, 2]), np.array([1, 0]), np.ones(2)), np.ones(2))


@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(0, 60), m=st.integers(0, 400), steps=st.integers(0, 4),
       decay=st.floats(-1.0, 2.0), threshold=st.floats(0.0, 0.9), density=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**32 - 1))
def test_property_random_graphs(n, m, steps, decay, threshold, density, seed):
    rng = np.random.default_rng(seed)
    indptr, indices, weights = random_graph(rng, n, m, isolated=n // 5)
    seeds = np.where(rng.random(n) < density, rng.random(n), 0).astype(np.float32)
    _, _, margin = check(indptr, indices, weights, seeds, decay, steps, threshold)
    assume(margin > 1e-4)
