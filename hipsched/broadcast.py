"""add's broadcast rule, as a leaf every layer may import: the op spec (ops/elementwise.py) validates with
it, the CPU wrapper (cpu/_elementwise.pyx) and the GPU glue (gpu/glue/elementwise.py) guard their kernels
with it, and hipsched.dask checks its arguments with it before building a graph. The compiled common case
(cpu/_elementwise.pyx's AddHot) tests the same rule on the array dimensions in C, without a Python call;
tests/sched/test_hot_path.py holds the two paths equal. Imports nothing of hipsched."""
from __future__ import annotations

__all__ = ["bias_fits"]


def bias_fits(a_shape, b_shape) -> bool:
    """Whether add's b of shape `b_shape` goes with a of `a_shape`: b has a's shape or a trailing part of
    it (a bias repeated over a's leading axes; a 0-d b is a scalar), so a's elements are whole repeats
    of b's, b read again for each of a's leading indices."""
    sa, sb = tuple(a_shape), tuple(b_shape)
    return len(sb) <= len(sa) and sa[len(sa) - len(sb):] == sb
