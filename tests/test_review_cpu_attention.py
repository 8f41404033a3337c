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
