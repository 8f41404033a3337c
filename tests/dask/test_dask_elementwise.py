"""hipsched.dask add / scale / softmax on the 2-process LocalCluster: one float32 operation per element
(softmax: per whole slice), so the results must be bit-identical to the single-machine ops, in each float
type, whose dtype the Dask array declares and its chunks have."""
import numpy as np
import pytest
from requires import need

da = need("dask.array", reason="dask[array] is not installed (pip install 'hipsched[dask]')")
need("distributed", reason="distributed is not installed (pip install 'hipsched[dask]')")

import hipsched as hs  # noqa: E402
import hipsched.dask as hd  # noqa: E402
from dask_support import FakeGpuFactory, computed, job_fixture, same_bits  # noqa: E402
from half_formats import TYPE_IDS, TYPES  # noqa: E402


job = job_fixture("elementwise", executor_factory=FakeGpuFactory(gpu_workers=("0",)))


@pytest.fixture(scope="module")
def x():
    a = np.random.default_rng(4).standard_normal((60, 7, 33)).astype(np.float32) * 10
    a[3, 2, 5] = np.nan
    a[4, 1, :] = np.inf
    return a


def test_add_same_shape_and_bias(dask_client, job, x):
    xd = da.from_array(x, chunks=(16, 7, 11))
    np.testing.assert_array_equal(hd.add(xd, xd * 0.5).compute(), hs.add(x, x * np.float32(0.5)))
    bias = np.random.default_rng(5).standard_normal((7, 33)).astype(np.float32)
    np.testing.assert_array_equal(hd.add(xd, bias).compute(), hs.add(x, bias))
    np.testing.assert_array_equal(hd.add(xd, da.from_array(bias[0], chunks=5)).compute(), hs.add(x, bias[0]))
    with pytest.raises(ValueError, match=r"add: shapes do not match: a \(60, 7, 33\) vs b \(7,\)"):
        hd.add(xd, np.ones(7, np.float32))


def test_scale(dask_client, job, x):
    xd = da.from_array(x, chunks=(13, 7, 33))
    np.testing.assert_array_equal(hd.scale(xd, -1.7).compute(), hs.scale(x, -1.7))
    with pytest.raises(TypeError, match="scale: alpha must be a real scalar"):
        hd.scale(xd, "2")


def test_softmax_along_an_unchunked_axis(dask_client, job, x):
    xd = da.from_array(x, chunks=(16, 3, 33))
    np.testing.assert_array_equal(hd.softmax(xd).compute(), hs.softmax(x))
    np.testing.assert_array_equal(hd.softmax(da.from_array(x, chunks=(60, 3, 11)), axis=0).compute(),
                                  hs.softmax(x, axis=0))
    with pytest.raises(ValueError, match=r"chunked along axis 1 .*rechunk\(\{1: -1\}\)"):
        hd.softmax(xd, axis=1)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        hd.softmax(xd, axis=3)


@pytest.mark.parametrize("dtype", list(TYPES), ids=TYPE_IDS)
def test_each_float_type_is_kept(dask_client, job, dtype):
    rng = np.random.default_rng(42)
    dt = TYPES[dtype]
    a = rng.standard_normal((60, 40)).astype(dt)
    b = rng.standard_normal((60, 40)).astype(dt)
    bias = rng.standard_normal(40).astype(dt)
    ad, bd = da.from_array(a, chunks=(16, 40)), da.from_array(b, chunks=(25, 40))
    same_bits(computed(hd.add(ad, bd)), hs.add(a, b))
    same_bits(computed(hd.add(ad, bias)), hs.add(a, bias))          # a NumPy bias keeps its type
    same_bits(computed(hd.scale(ad, 0.3)), hs.scale(a, 0.3))
    same_bits(computed(hd.softmax(ad, axis=-1)), hs.softmax(a, axis=-1))
    # a mix of types is float32, as on one machine
    same_bits(computed(hd.add(ad, b.astype(np.float32))), hs.add(a, b.astype(np.float32)))
    other = TYPES["float16" if dtype != "float16" else "bfloat16"]
    same_bits(computed(hd.add(ad, da.from_array(b.astype(other), chunks=(16, 40)))), hs.add(a, b.astype(other)))
