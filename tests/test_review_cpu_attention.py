"""Causal attention: a key hidden from a query never reaches its output, even when that key's value row
holds inf or NaN (its weight is 0, and 0 * inf must not turn the output NaN). Before, it depended on
whether the key fell in the 16-query strip's last key tile."""
import numpy as np
import pytest

import hipsched


@pytest.mark.parametrize("sq,bad_key,bad", [(40, 5, np.inf), (40, 17, np.nan), (200, 100, -np.inf), (70, 63, np.nan)])
def test_hidden_nonfinite_value_does_not_reach_earlier_queries(sq, bad_key, bad):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, sq, 9)).astype(np.float32) for _ in range(3))
    clean = hipsched.attention(q, k, v, causal=True)
    v[0, 1, bad_key, 3] = bad
    out = hipsched.attention(q, k, v, causal=True)
    np.testing.assert_array_equal(out[0, 1, :bad_key], clean[0, 1, :bad_key])
    np.testing.assert_array_equal(out[0, 0], clean[0, 0])
    assert not np.isfinite(out[0, 1, bad_key:, 3]).any()
    assert np.isfinite(np.delete(out[0, 1, bad_key:], 3, axis=-1)).all()


def test_scale_beyond_float32_is_refused():
    # finite as a Python float, inf as the kernels' float32: zero scores would become 0 * inf = NaN
    q = np.ones((1, 1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="scale"):
        hipsched.attention(q, q, q, scale=1e39)
    assert np.isfinite(hipsched.attention(q, q, q, scale=1e30)).all()


def test_spread_decay_beyond_float32_is_refused():
    g = (np.array([0, 1, 1]), np.array([1]), np.array([1.0], np.float32))
    seeds = np.array([0.5, 0.2], np.float32)
    with pytest.raises(ValueError, match="decay"):
        hipsched.spread_activation(g, seeds, decay=1e39)
    np.testing.assert_array_equal(hipsched.spread_activation(g, seeds, decay=1e38), [0.5, 1.0])
