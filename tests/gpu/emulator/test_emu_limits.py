"""The kernel emulator refuses what the emulated device (sm_90 / gfx90a) would refuse, with the driver's
error (tests/support/emu_limits.py), and hipsched's own check (hipsched/gpu/compilation/targets.py) refuses the same
launches, naming the limit, given the same kernel resources (those of the real compiler's code object:
the emulator's own code objects are host libraries without any); end to end, a call beyond a launch
limit is decided for the CPU (reason gpu_unsupported) without a launch, an upload or a mark against the
GPU's health."""
import ctypes

import numpy as np
import pytest

import emu_limits
import gpu_emulator
from call_counts import count_calls
from hipsched import Executor
from hipsched.backends.gpu import GpuBackend
from hipsched.errors import GpuError
from hipsched.gpu.launch.context import GpuContext
from hipsched.gpu.compilation.targets import check_launch
from requires import missing_tool

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


@pytest.fixture(scope="module", params=[32, 64], ids=["sm_90", "gfx90a"])
def ctx(request, tmp_path_factory):
    rt = gpu_emulator.EmuRuntime(request.param)
    c = GpuContext(rt, cache_dir=str(tmp_path_factory.mktemp("kernels")))
    yield c
    c.close()
    rt.close()


def _real_resources_or_skip(ctx):
    res = emu_limits._kernel_resources(ctx.arch)
    if not res:
        missing_tool(f"a compiler for {ctx.arch} (register counts and launch bounds unknown without it)",
                     "pip install -e '.[test]' for NVRTC; Debian's libamdhip64-dev for hiprtc")
    return res


def _both_refuse(ctx, source, kernel, grid, block, shared, driver_name, limit):
    """The emulated driver refuses with `driver_name`; hipsched's check refuses with `limit`."""
    fn = ctx.function(source, kernel)
    args = (ctypes.c_void_p(0),) * 8          # never used: a refused launch does not run
    with pytest.raises(GpuError) as e:
        ctx.rt.launch(fn, grid, block, args, shared, 0)
    assert e.value.name == driver_name, str(e.value)
    assert kernel in str(e.value)
    res = emu_limits._kernel_resources(ctx.arch).get(kernel)
    with pytest.raises(GpuError) as e:
        check_launch(ctx.target, kernel, res, grid, block, shared, ctx.warp_size)
    assert e.value.kind == "unsupported" and e.value.name == f"launch-limit-{limit}", str(e.value)
    assert kernel in str(e.value)


def _nv(ctx, nvidia, amd):
    return nvidia if ctx.platform == "nvidia" else amd


def test_grid_beyond_the_device(ctx):
    grid = (1, _nv(ctx, 65536, 65537), 1)     # newer ROCm takes y up to 65536; hipsched stops at 65535
    _both_refuse(ctx, "similarity", "hs_topk_select_f32", grid, (256, 1, 1), 0,
                 _nv(ctx, "CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidValue"), "grid-y")


def test_block_beyond_the_device(ctx):
    _both_refuse(ctx, "elementwise", "hs_add_f32", (1, 1, 1), (2048, 1, 1), 0,
                 _nv(ctx, "CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidConfiguration"), "threads-per-block")


def test_shared_memory_beyond_the_block_limit(ctx):
    limit = _nv(ctx, 48 * 1024, 64 * 1024)
    _both_refuse(ctx, "softmax", "hs_softmax_rows_f32", (1, 1, 1), (256, 1, 1), limit + 4,
                 _nv(ctx, "CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidValue"), "shared-memory")
    if _real_resources_or_skip(ctx):   # the kernel's 128 static bytes (reduction scratch) count too
        _both_refuse(ctx, "softmax", "hs_softmax_rows_f32", (1, 1, 1), (256, 1, 1), limit - 128 + 4,
                     _nv(ctx, "CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidValue"), "shared-memory")


def test_block_beyond_the_kernels_launch_bounds(ctx):
    _real_resources_or_skip(ctx)
    # HIP reports this as hipErrorLaunchFailure, which hipsched's status table reads as a lost device:
    # the pre-launch check is what keeps such a call from marking the GPU lost
    _both_refuse(ctx, "attention", "hs_attention_d64", (1, 1, 1), (256, 1, 1), 0,
                 _nv(ctx, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "hipErrorLaunchFailure"), "launch-bounds")


def test_registers_beyond_the_register_file(ctx):
    res = _real_resources_or_skip(ctx)
    if ctx.platform != "nvidia":
        pytest.skip("AMD compilers fit the registers to the launch bounds: the launch-bounds case covers it")
    r = res["hs_cosine_f32_q8"]
    assert r.max_threads == 1024 and r.registers * 1024 > 65536, r
    _both_refuse(ctx, "similarity", "hs_cosine_f32_q8", (1, 1, 1), (1024, 1, 1), 0,
                 "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "registers")


def test_amd_work_items_per_dimension(ctx):
    if ctx.platform != "amd":
        pytest.skip("a 32-bit HSA dispatch grid is AMD's")
    _both_refuse(ctx, "quant", "hs_qmatvec_f32_q8_0", (2**25, 1, 1), (128, 1, 1), 0,
                 "hipErrorInvalidConfiguration", "work-items")


def test_a_launch_within_the_limits_runs(ctx):
    x = np.arange(256, dtype=np.float32)
    from hipsched.gpu.memory.device_array import to_device
    dx, dy = to_device(x, runtime=ctx.rt), to_device(np.zeros_like(x), runtime=ctx.rt)
    ctx.launch(ctx.function("elementwise", "hs_scale_f32"), 1, 256,
               (dx, dy, ctypes.c_float(2.0), ctypes.c_int64(256)))
    np.testing.assert_array_equal(dy.get(), 2 * x)


def test_executor_runs_a_call_beyond_a_limit_on_the_cpu(tmp_path, monkeypatch):
    """top_k with 65536 queries needs grid y = 65536: refused before any upload or launch, rerun on the
    CPU, and the GPU's health untouched."""
    rt = gpu_emulator.EmuRuntime(32)
    calls = count_calls(monkeypatch, rt, ("launch", "malloc"))
    gpu = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=rt)
    assert gpu.available, gpu.unavailable_reason
    rng = np.random.default_rng(5)
    q = rng.standard_normal((65536, 4), dtype=np.float32)
    T = rng.standard_normal((8, 4), dtype=np.float32)
    try:
        with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), strategy="gpu_preferred",
                      breaker_failures=1) as ex:
            calls.update(launch=0, malloc=0)     # the executor's start measures copies
            for _ in range(3):
                gi, gs = ex.top_k(q, T, 3)
            ci, cs = ex.top_k(q, T, 3, backend="cpu")
            np.testing.assert_array_equal(gi, ci)
            np.testing.assert_array_equal(gs, cs)
            assert calls == {"launch": 0, "malloc": 0}
            health = ex.gpu_health("top_k")
            assert health["state"] == "closed" and health["failures"] == 0
            # decided before the run, with its own reason and the planner's words: not a failed GPU run
            assert [(e["backend"], e["reason"], e["fallback"]) for e in ex.events] == \
                [("cpu", "gpu_unsupported", None)] * 3 + [("cpu", "user_preference", None)]
            assert all("launch-limit-grid-y" in e["detail"] for e in ex.events[:3])
            assert "detail" not in ex.events[3]
            # a call the device can take still runs there
            ex.top_k(q[:100], T, 3)
            assert calls["launch"] > 0
    finally:
        gpu.close()
        rt.close()
