"""Every registered op x every dtype its GPU side declares, through the Executor, generated from the op
specs (hipsched.ops.OPS): a new op, or a dtype added to an op's `gpu_dtypes`, is a new case here
without an edit, and an op with no builder below fails (coverage cannot shrink silently).

Each case runs `getattr(ex, op)(..., backend="gpu")` with fallback off (a GPU failure cannot hide behind
a CPU rerun), in the op's vector and matrix forms, on host arrays and on device arrays, and checks:
- the GPU ran it, under the dtype the spec declares (the telemetry event's `dtype`);
- the result lives where the inputs live (NumPy for host inputs, a DeviceArray for device inputs);
- values and dtype equal `backend="cpu"`'s (bit for bit for the elementwise ops and dequantize);
- values within a stated bound of an outside reference: float64 NumPy, scipy.special.softmax, SciPy
  sparse, gguf's dequantization, torch CPU's scaled_dot_product_attention in float64. The CPU engine is
  itself rounded, so it is no reference for the half types.

The builders, checks and bounds are tests/support/op_cases.py's (test_compiled_call_path.py replays the
same cases).

The `emulator` variant runs the kernels on tests/support/gpu_emulator.py (warp 32) in CI; the `device`
variant is marked `gpu` and runs the same cases on a real GPU (`pytest -m gpu`; skipped without one).
Shapes are small: the emulator runs each block's threads as OS threads."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import emu_c_driver
import gpu_emulator
from hipsched import Executor
from hipsched.errors import GpuError
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu.memory.device_array import DeviceArray, to_device
from hipsched.ops import OPS
from op_cases import CASES, NP, assert_same_bits, matrix, to_host

# ------------------------------------------------------------------------------ the GPU under test

@pytest.fixture(scope="module", params=[pytest.param("emulator"), pytest.param("device", marks=pytest.mark.gpu)])
def runtime(request):
    """The emulator's runtime (in CI), or None: the real GPU the process detects (`-m gpu`)."""
    if request.param == "device":
        yield None
        return
    if not gpu_emulator.available():
        pytest.skip("needs g++ (C++20) for the kernel emulator")
    mp = pytest.MonkeyPatch()
    mp.setenv("HIPSCHED_BLAS", "none")   # the emulator has no vendor BLAS: matmul is the tiled kernel
    rt = gpu_emulator.EmuRuntime(32)
    emu_c_driver.attach(rt)   # C entry points, as a real driver's: the compiled call path replays the second calls
    yield rt
    rt.close()
    mp.undo()


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture
def executor(runtime, kernel_dir, tmp_path):
    """A fresh Executor per case on the module's GPU (a failure of one case cannot open another op's
    breaker), fallback off."""
    # a real GPU's code objects go to the user's kernel cache (what `hipsched compile` may have filled)
    gpu = GpuBackend({} if runtime is None else {"kernel_cache_dir": str(kernel_dir)}, runtime=runtime)
    if not gpu.available:
        if runtime is None:
            pytest.skip(f"no GPU: {gpu.unavailable_reason}")
        raise AssertionError(gpu.unavailable_reason)
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), allow_fallback=False) as ex:
        yield ex, gpu._ctx.rt


def test_every_op_with_a_gpu_side_has_a_builder():
    gpu_ops = {op for op, spec in OPS.items() if spec.gpu is not None}
    assert set(CASES) == gpu_ops, (f"ops without a builder: {sorted(gpu_ops - set(CASES))}; builders of no "
                                   f"registered op: {sorted(set(CASES) - gpu_ops)}")


@pytest.mark.parametrize("op,dtype,form,where", matrix())
def test_op_dtype_matrix(executor, op, dtype, form, where):
    case = CASES.get(op)
    if case is None:
        pytest.fail(f"{op} is registered with a GPU side but CASES in op_cases.py has no builder for it: add one")
    ex, rt = executor
    rng = np.random.default_rng(zlib.crc32(f"{op} {dtype} {form}".encode()))   # the same data every run
    args, kwargs = case.make(rng, dtype, form)
    if where == "device":
        args = tuple(to_device(a, runtime=rt) if i in case.device else a for i, a in enumerate(args))
    host_args = tuple(to_host(a) for a in args)
    declared = OPS[op].gpu_dtypes
    called = OPS[op].prepare(*args, **kwargs).dtype
    fn = getattr(ex, op)
    lives = DeviceArray if where == "device" else np.ndarray

    c = fn(*args, backend="cpu", **kwargs)
    assert ex.events[-1]["backend"] == "cpu"
    for o in c if isinstance(c, tuple) else (c,):
        assert isinstance(o, lives), (op, where, type(o))
    c = to_host(c)
    case.check(c, host_args, kwargs, dtype)

    if called not in declared:
        # inputs the GPU side has no kernels for: refused before anything runs, never computed as another type
        with pytest.raises(GpuError):
            fn(*args, backend="gpu", **kwargs)
        assert dtype not in declared, f"prepare names {dtype} inputs {called!r}, which the GPU side does not declare"
        return

    plans = ex._fast.plan_count
    g = fn(*args, backend="gpu", **kwargs)
    recorded = ex._fast.plan_count - plans
    event = ex.events[-1]
    assert (event["op"], event["backend"], event["fallback"]) == (op, "gpu", None)
    for o in g if isinstance(g, tuple) else (g,):
        assert isinstance(o, lives), (op, where, type(o))
    g = to_host(g)

    out_dtype = NP[case.out_dtype(dtype)]
    if op == "top_k":
        (gi, gs), (ci, cs) = g, c
        assert gs.dtype == cs.dtype == out_dtype and gi.dtype == ci.dtype
        np.testing.assert_array_equal(gi, ci)
        np.testing.assert_allclose(gs, cs, rtol=0, atol=5e-6)
    else:
        assert (g.dtype, g.shape) == (c.dtype, c.shape), "GPU and CPU results differ in dtype or shape"
        assert g.dtype == out_dtype
        if case.exact:
            assert_same_bits(g, c)
    case.check(g, host_args, kwargs, dtype)
    # the call again: where the first run left a plan, the compiled call path replays it (from C on the
    # emulator's driver double) and gives the first run's bits
    launches = emu_c_driver.calls(rt)["launch"] if hasattr(rt, "_emu_c") else None
    again = fn(*args, backend="gpu", **kwargs)
    assert (ex.events[-1]["backend"], ex.events[-1]["fallback"], ex._fast.plan_count) == ("gpu", None, plans + recorded)
    if recorded and launches is not None:
        assert emu_c_driver.calls(rt)["launch"] > launches or not event["size"], f"{op}: the plan was not replayed"
    for o in again if isinstance(again, tuple) else (again,):
        assert isinstance(o, lives), (op, where, type(o))
    again = to_host(again)
    if op != "spread_activation":   # its float atomics add in any order: checked against the reference only
        for a, b in zip(again if isinstance(again, tuple) else (again,), g if isinstance(g, tuple) else (g,)):
            assert_same_bits(a, b)
    case.check(again, host_args, kwargs, dtype)
    # the dtype the scheduler, the GPU's capability check and the telemetry saw is the inputs' own
    assert called == event["dtype"] == dtype, (f"{op}: inputs built as {dtype} were called {called!r}: the GPU "
                                               f"side cannot tell them from another type")
