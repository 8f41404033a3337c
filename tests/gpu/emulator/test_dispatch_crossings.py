"""What the dispatcher asks of the GPU backend for one call, and how often the call's arguments are walked
(issue: the judge's launch plan is the one the run uses; one walk of the host inputs serves the transfer
count, the resident cache's answers and the upload sharing rule)."""
import os
import sys

import numpy as np
import pytest

import gpu_emulator
from hipsched import Executor
from hipsched.backends import gpu as gpu_module
from hipsched.backends import interface
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu.ops import similarity as similarity_glue

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

# every member of the backend interface a dispatcher could ask about one call
ASKED = ("judge", "run", "run_timed", "would_keep", "is_resident", "supports", "max_elements", "unsupported",
         "device_bytes_needed", "free_memory", "transfer_bytes", "gpu_times", "forget_free_memory",
         "resident_summary", "measure_transfer", "transfer_totals")


# the backend's own members asking each other are not crossings: only calls from above it count
_INSIDE = tuple(os.path.dirname(m.__file__) for m in (gpu_module, similarity_glue)) + (
    os.path.dirname(os.path.dirname(similarity_glue.__file__)),)


def _count(monkeypatch, owner, name, log, from_outside=False):
    fn = getattr(owner, name)

    def counted(*a, **k):
        if not from_outside or not sys._getframe(1).f_code.co_filename.startswith(_INSIDE):
            log.append(name)
        return fn(*a, **k)
    monkeypatch.setattr(owner, name, counted)


@pytest.mark.parametrize("rows", [1 << 12, 1 << 14])   # below and above the size whose residency is asked
def test_a_host_top_k_sent_to_the_gpu_asks_the_backend_twice_and_walks_its_arguments_once(tmp_path, monkeypatch,
                                                                                         rows):
    rt = gpu_emulator.EmuRuntime(32)
    plans = []
    _count(monkeypatch, similarity_glue, "top_k_plan", plans)
    walks = []
    for module in (gpu_module, interface):
        _count(monkeypatch, module, "host_arrays", walks)
    try:
        gpu = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt)
        assert gpu.available, gpu.unavailable_reason
        ex = Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path))
        rng = np.random.default_rng(3)
        q = rng.standard_normal(64, dtype=np.float32)
        T = rng.standard_normal((rows, 64), dtype=np.float32)
        ex.top_k(q, T, 5, backend="gpu")   # kernels compiled, the op's slot and glue looked up
        asked = []
        for name in ASKED:
            if callable(getattr(gpu, name, None)):
                _count(monkeypatch, gpu, name, asked, from_outside=True)
        plans.clear()
        walks.clear()
        idx, vals = ex.top_k(q, T, 5, backend="gpu")
        assert asked == ["judge", "run"]
        assert plans == ["top_k_plan"]     # judged once; the run launches that plan
        assert walks == ["host_arrays"]    # the judge's one walk of the host inputs
        ex.close()
    finally:
        rt.close()
    scores = (T @ q) / (np.linalg.norm(T, axis=1) * np.linalg.norm(q))
    np.testing.assert_array_equal(np.sort(idx), np.sort(np.argsort(-scores.astype(np.float64))[:5]))
    np.testing.assert_allclose(vals, scores[idx], rtol=1e-5, atol=1e-6)
