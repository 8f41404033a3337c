"""Other libraries' host arrays: a torch CPU tensor in gives a torch tensor out, sharing memory both
ways (the input read in place, the result a view of hipsched's); bfloat16 tensors are read as they are;
a tensor that requires grad is refused by name (hipsched records no gradients)."""
import numpy as np
import pytest
from requires import need

torch = need("torch")
ml_dtypes = need("ml_dtypes")

import hipsched  # noqa: E402
from hipsched.ops.foreign_arrays import host_array, result_converter  # noqa: E402
from hipsched.ops.validation import as_float  # noqa: E402


@pytest.fixture
def ex():
    with hipsched.Executor(force_cpu_mode=True, persist_model=False, telemetry_enabled=False) as e:
        yield e


def test_torch_cpu_tensors_come_back_as_torch_tensors(ex):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 33, generator=g)
    out = ex.scale(x, 2.0)
    assert type(out) is torch.Tensor and out.dtype == torch.float32 and out.device.type == "cpu"
    torch.testing.assert_close(out, x * 2.0, rtol=0, atol=0)
    T, q = torch.randn(100, 16, generator=g), torch.randn(16, generator=g)
    idx, scores = ex.top_k(q, T, 5)
    assert type(idx) is torch.Tensor and idx.dtype == torch.int64 and type(scores) is torch.Tensor
    want = torch.nn.functional.cosine_similarity(T, q[None], dim=1).topk(5)
    assert idx.tolist() == want.indices.tolist()
    # a NumPy input beside it: still the torch tensor's library (the first foreign host array decides)
    out = ex.add(x, np.ones(33, np.float32))
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, x + 1)


def test_no_copy_either_way():
    x = torch.randn(4, 8)
    view = as_float(x, "scale", "x")
    assert view.__array_interface__["data"][0] == x.data_ptr()
    with hipsched.Executor(force_cpu_mode=True, persist_model=False, telemetry_enabled=False) as ex:
        out = ex.softmax(x)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    # the result is handed over as the tensor's memory, not copied
    convert = result_converter((x,), {})
    for a in (np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)):
        t = convert(a)
        assert t.data_ptr() == a.__array_interface__["data"][0] and t.dtype in (torch.float32, torch.bfloat16)
    assert result_converter((np.ones(3), 2.0), {"k": 1}) is None


class _HostArray:
    """A minimal array-API library's CPU array: DLPack and a namespace with from_dlpack."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __array_namespace__(self, api_version=None):
        return _Namespace


class _Namespace:
    @staticmethod
    def from_dlpack(x):
        return _HostArray(np.from_dlpack(x))


def test_other_array_api_host_arrays_come_back_in_their_library(ex):
    x = np.random.default_rng(2).standard_normal((5, 7), dtype=np.float32)
    out = ex.scale(_HostArray(x), 3.0)
    assert type(out) is _HostArray
    np.testing.assert_array_equal(out.a, x * np.float32(3.0))
    assert np.shares_memory(host_array(_HostArray(x), "scale", "x"), x)


@pytest.mark.parametrize("op", ["softmax", "rms_norm", "matmul"])
def test_bfloat16_tensors_are_read_as_they_are(ex, op):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 64, generator=g).to(torch.bfloat16)
    args = {"softmax": (x,), "rms_norm": (x, torch.ones(64, dtype=torch.bfloat16)),
            "matmul": (x, torch.randn(64, 5, generator=g).to(torch.bfloat16))}[op]
    out = getattr(ex, op)(*args)
    assert type(out) is torch.Tensor and out.dtype == torch.bfloat16
    # the same as the ml_dtypes arrays of the same bits give (the documented bfloat16 path)
    as_np = [a.view(torch.int16).numpy().view(ml_dtypes.bfloat16) for a in args]
    want = getattr(ex, op)(*as_np)
    np.testing.assert_array_equal(out.view(torch.int16).numpy(), want.view(np.int16))
    assert np.shares_memory(host_array(x, op, "x"), x.view(torch.int16).numpy())


def test_a_tensor_that_requires_grad_is_refused_by_name(ex):
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(TypeError, match=r"softmax: argument 'x' is a torch tensor that requires grad; hipsched "
                                        r"does not record gradients.*x\.detach\(\)"):
        ex.softmax(x)
    out = ex.softmax(x.detach())
    assert type(out) is torch.Tensor and not out.requires_grad
