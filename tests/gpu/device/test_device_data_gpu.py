"""Device data on a real GPU (issue 19; `pytest -m gpu`): a device-array pipeline from a cold model runs on
the GPU (on the H100 it ran 32 of 40 calls on the CPU), and torch CUDA tensors and CuPy arrays come back
as torch tensors and CuPy arrays, on the GPU path and on the CPU path that downloads and uploads."""
import collections

import numpy as np
import pytest

from hipsched import Executor
from requires import need

pytestmark = pytest.mark.gpu

N = 1 << 20


def _torch_cuda():
    torch = need("torch")      # the test extra's CPU build: a GPU test then skips for want of CUDA, not torch
    return torch if torch.cuda.is_available() else None


@pytest.fixture
def ex(tmp_path):
    with Executor(persist_model=False, cache_dir=str(tmp_path)) as e:   # a cold model
        if not e.capabilities().gpu_available:
            pytest.skip("no GPU backend")
        yield e


def test_a_device_pipeline_from_a_cold_model_runs_on_the_gpu(ex):
    torch = _torch_cuda()
    rng = np.random.default_rng(19)
    a, b = rng.standard_normal((2, N), dtype=np.float32)
    if torch is not None:
        x, y = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    else:
        from hipsched.gpu.memory.device_array import to_device
        x, y = to_device(a), to_device(b)
    outs = [ex.add(x, y) for _ in range(40)]
    picks = collections.Counter((e["backend"], e["reason"]) for e in ex.events)
    assert sum(n for (be, _), n in picks.items() if be == "gpu") >= 0.99 * 40, picks
    last = outs[-1].cpu().numpy() if torch is not None else outs[-1].get()
    np.testing.assert_array_equal(last, a + b)
    assert ex.performance_tracker.samples("add", "gpu"), "no GPU time was learned from the runs' events"


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_torch_cuda_tensors_in_torch_tensors_out(ex, backend):
    torch = _torch_cuda()
    if torch is None:
        pytest.skip("needs torch with CUDA")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 4096), dtype=np.float32)
    x, y = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = ex.add(x, y, backend=backend)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.dtype == torch.float32
    np.testing.assert_array_equal(out.cpu().numpy(), a + b)
    q = torch.from_numpy(rng.standard_normal(64, dtype=np.float32)).cuda()
    T = torch.from_numpy(rng.standard_normal((1000, 64), dtype=np.float32)).cuda()
    idx, scores = ex.top_k(q, T, 5, backend=backend)
    want_idx, want_scores = ex.top_k(q.cpu().numpy(), T.cpu().numpy(), 5, backend="cpu")
    assert isinstance(idx, torch.Tensor) and isinstance(scores, torch.Tensor) and idx.dtype == torch.int64
    np.testing.assert_array_equal(idx.cpu().numpy(), want_idx)
    np.testing.assert_allclose(scores.cpu().numpy(), want_scores, rtol=1e-5, atol=1e-6)
    # a result used on a side stream of the caller's: ordered after our work
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = ex.add(x, y, backend=backend)
        w = z * 2
    s.synchronize()
    np.testing.assert_array_equal(w.cpu().numpy(), 2 * (a + b))


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_cupy_arrays_in_cupy_arrays_out(ex, backend):
    cp = need("cupy")            # outside the test extra: skipped where it is not installed
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((2, 4096), dtype=np.float32)
    out = ex.add(cp.asarray(a), cp.asarray(b), backend=backend)
    assert isinstance(out, cp.ndarray) and out.dtype == cp.float32
    np.testing.assert_array_equal(cp.asnumpy(out), a + b)
