"""float16 and bfloat16 on a real GPU (marked `gpu`, skipped elsewhere).

The half-kernel tests of test_gpu_kernels_emulated.py run here unchanged against the device instead of
the emulator (the `emu` fixture below is the real GPU backend, with HIPSCHED_BLAS=none as there, so
matmul is our tiled kernel): the same outside references (NumPy/ml_dtypes rounding, float64) and the
same bounds, stated in that file. What only a device adds is below them: the vendor BLAS in half
precision, and PyTorch's half CUDA tensors in and out through DLPack against PyTorch's own results.

Bounds of the tests below: UNIT is the half format's unit roundoff (2^-11 float16, 2^-8 bfloat16).
- cuBLAS/hipBLAS matmul (float32 accumulation, one rounding to the half type):
  |gpu - float64| <= UNIT * |ref| + K * 2^-24 * (|a| @ |b|) * 2, the factor 2 for the BLAS's own
  summation order and split-K.
- torch in, torch out: our result and torch's are each within one half rounding of the same float32
  value, so they may differ by one unit in the last place: |ours - torch| <= 2 * UNIT * |torch| + 2e-6
  (the absolute term for softmax's exponentials below float32's resolution)."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest
from requires import need

from hipsched.ops import OPS

# the emulator's half tests live in tests/gpu/emulator, which pytest puts on the path only when it collects there
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "emulator"))
from test_gpu_kernels_emulated import (  # noqa: E402, F401  (collected here, with this module's `emu`)
    test_half_add_scale, test_half_attention_head_classes, test_half_cosine, test_half_device_in_device_out,
    test_half_dtype_without_kernels_is_refused, test_half_matmul_tiled_kernel, test_half_overflow_nan_inf,
    test_half_qmatmul, test_half_qmatmul_device_x,
    test_half_rms_norm, test_half_softmax, test_half_softmax_nan_inf, test_half_supports_table,
    test_half_top_k, half_call, HALF, UNIT)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    """The real GPU backend, under the name the emulator's tests ask for."""
    from hipsched.backends.gpu import GpuBackend
    mp = pytest.MonkeyPatch()
    mp.setenv("HIPSCHED_BLAS", "none")
    be = GpuBackend({"kernel_cache_dir": str(tmp_path_factory.mktemp("kernels"))})
    if not be.available:
        mp.undo()
        pytest.skip(f"no GPU: {be.unavailable_reason}")
    yield be
    be.close()
    mp.undo()


@pytest.fixture(scope="module")
def blas_gpu(tmp_path_factory):
    """A GPU backend with the vendor BLAS loaded (the BLAS is loaded at first use, and `emu` above
    keeps HIPSCHED_BLAS=none set for the whole module)."""
    from hipsched.backends.gpu import GpuBackend
    mp = pytest.MonkeyPatch()
    mp.delenv("HIPSCHED_BLAS", raising=False)
    be = GpuBackend({"kernel_cache_dir": str(tmp_path_factory.mktemp("kernels"))})
    blas = be._ctx.blas() if be.available else None
    mp.undo()
    if blas is None:
        be.close()
        pytest.skip(f"no vendor BLAS: {be.unavailable_reason or 'none loaded on this machine'}")
    yield be
    be.close()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (33, 100, 65), (256, 1024, 128), (1, 4096, 4096)])
def test_half_matmul_vendor_blas(blas_gpu, rng, dtype, m, k, n):
    t = HALF[dtype]
    a, b = rng.standard_normal((m, k)).astype(t), rng.standard_normal((k, n)).astype(t)
    g = blas_gpu.run(half_call("matmul", (a, b), {}, dtype))
    assert g.dtype == t and g.shape == (m, n)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref, mag = a64 @ b64, np.abs(a64) @ np.abs(b64)
    bound = UNIT[dtype] * np.abs(ref) + 2 * k * 2.0 ** -24 * mag + 1e-30
    np.testing.assert_array_less(np.abs(g.astype(np.float64) - ref), bound)


TORCH_OPS = ["add", "scale", "softmax", "rms_norm", "matmul", "attention", "cosine_similarity", "top_k"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", TORCH_OPS)
def test_torch_half_tensors_in_and_out(gpu, rng, dtype, op):
    torch = need("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no GPU here")
    F = torch.nn.functional
    tdt = getattr(torch, dtype)

    def cuda(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).cuda().to(tdt)

    x, y, w = cuda(64, 256), cuda(64, 256), cuda(256)
    q, kk, v = cuda(1, 4, 128, 64), cuda(1, 4, 128, 64), cuda(1, 4, 128, 64)
    T, qv = cuda(5000, 96), cuda(96)
    cases = {
        "add": ((x, y), {}, lambda: x + y),
        "scale": ((x, 1.5), {}, lambda: x * 1.5),
        "softmax": ((x,), {}, lambda: torch.softmax(x.float(), -1).to(tdt)),
        "rms_norm": ((x, w), {"eps": 1e-6},
                     lambda: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
                              * w.float()).to(tdt)),
        "matmul": ((x, y.T.contiguous()), {}, lambda: (x.float() @ y.T.float()).to(tdt)),
        "attention": ((q, kk, v), {}, lambda: F.scaled_dot_product_attention(q.float(), kk.float(),
                                                                              v.float()).to(tdt)),
        "cosine_similarity": ((qv, T), {}, lambda: F.cosine_similarity(T.float(), qv.float()[None, :], dim=1)),
        "top_k": ((qv, T, 10), {}, None),
    }
    args, params, reference = cases[op]
    out = gpu.run(OPS[op].prepare(*args, **params))
    if op == "top_k":
        idx, scores = (torch.from_dlpack(o) for o in out)
        assert scores.dtype == torch.float32 and idx.shape == (10,)
        want = F.cosine_similarity(T.float(), qv.float()[None, :], dim=1)
        kth = torch.topk(want, 10).values[-1]
        assert bool((want[idx.long()] >= kth - 1e-5).all())
        torch.testing.assert_close(scores, want[idx.long()], rtol=0, atol=1e-5)
        return
    got = torch.from_dlpack(out)
    want = reference()
    assert got.device.type == "cuda" and got.shape == want.shape
    assert got.dtype == (torch.float32 if op == "cosine_similarity" else tdt)   # scores are float32
    g, r = got.double(), want.double()
    unit = UNIT[dtype]
    bound = 2 * unit * r.abs() + 2e-6
    if op == "attention":
        # the tensor-core kernels round P to the input type: 2u/(1-u) M more, M = attention applied to |v|
        # (docs/gpu.md, "Attention on tensor cores")
        bound = bound + 2 * unit / (1 - unit) * F.scaled_dot_product_attention(q.double(), kk.double(), v.double().abs())
    np.testing.assert_array_less((g - r).abs().cpu().numpy(), bound.cpu().numpy() + 1e-300)
