"""silu_mul, gelu and rope through the Executor on the emulated GPU at warp 32 (NVIDIA) and warp 64 (AMD
gfx9), every dtype, with fallback off: each result is checked against the outside reference of
op_cases.py (torch's silu and gelu in float64, a float64 rope from the formula) and against the CPU
engine's result within the same bound; the unaligned (scalar) kernels too, on offset device views;
non-finite inputs propagate as the CPU engine and torch give them; rope's long positions (past 32k)
keep float64 angles on the GPU side too."""
from __future__ import annotations

import numpy as np
import pytest

import gpu_emulator
from hipsched import Executor
from hipsched.backends.gpu import GpuBackend
from hipsched.errors import GpuError
from hipsched.gpu.memory.device_array import DeviceArray, to_device
from op_cases import CASES, GELU_FORMS, NP, ROPE_FORMS, rope_reference, to_host, within
from half_formats import TINY, UNIT

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

TYPES = ("float32", "float16", "bfloat16")
FORMS = {"silu_mul": ("vector", "matrix"), "gelu": tuple(GELU_FORMS), "rope": tuple(ROPE_FORMS)}


@pytest.fixture(scope="module", params=[32, 64], ids=["warp32", "warp64"])
def ex(request, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HIPSCHED_BLAS", "none")
    rt = gpu_emulator.EmuRuntime(request.param)
    gpu = GpuBackend({"kernel_cache_dir": str(tmp_path_factory.mktemp("kernels"))}, runtime=rt)
    assert gpu.available, gpu.unavailable_reason
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path_factory.mktemp("ex")),
                  allow_fallback=False) as e:
        yield e, rt
    rt.close()
    mp.undo()


def _ran_on_gpu(e, op):
    ev = e.events[-1]
    assert (ev["op"], ev["backend"], ev["fallback"]) == (op, "gpu", None)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("op,form", [(op, f) for op, forms in FORMS.items() for f in forms])
def test_gpu_matches_reference_and_cpu(ex, op, form, dtype):
    e, rt = ex
    rng = np.random.default_rng(abs(hash((op, form, dtype))) % 2 ** 32)
    case = CASES[op]
    args, kwargs = case.make(rng, dtype, form)
    g = getattr(e, op)(*args, backend="gpu", **kwargs)
    _ran_on_gpu(e, op)
    c = getattr(e, op)(*args, backend="cpu", **kwargs)
    assert g.dtype == c.dtype == NP[dtype] and g.shape == c.shape
    case.check(g, args, kwargs, dtype)
    case.check(c, args, kwargs, dtype)


def offset_view(rt, x):
    """x on the device one element into a buffer: a foreign array off 16-byte alignment."""
    buf = to_device(np.concatenate([np.zeros(1, x.dtype), x.ravel()]), runtime=rt)
    view = DeviceArray(buf.ptr + x.itemsize, x.shape, x.dtype, rt, owner=buf)
    assert int(view.ptr) % 16
    return view


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("op", ["silu_mul", "gelu"])
def test_packed_and_unaligned_kernels_over_tails(ex, op, dtype):
    """Host inputs (aligned: the 8-element packs, with their tails) and device views one element off
    16-byte alignment (the one-element kernels), at sizes around the pack and the grid's stride."""
    e, rt = ex
    rng = np.random.default_rng(7)
    kw = {"approximate": "tanh"} if op == "gelu" else {}
    for n in (1, 7, 8, 16, 67, 4099):
        args = [(rng.standard_normal(n) * 3).astype(NP[dtype]) for _ in range(2 if op == "silu_mul" else 1)]
        CASES[op].check(getattr(e, op)(*args, backend="gpu", **kw), args, kw, dtype)
        _ran_on_gpu(e, op)
        g = to_host(getattr(e, op)(*[offset_view(rt, a) for a in args], backend="gpu", **kw))
        _ran_on_gpu(e, op)
        CASES[op].check(g, args, kw, dtype)


@pytest.mark.parametrize("dtype", TYPES)
def test_nonfinite_inputs_propagate_as_on_the_cpu(ex, dtype):
    e, rt = ex
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -30.0, 30.0, 2.0, -2.0, np.nan, 1.0] * 3, np.float32)
    u = np.array([1.0, 2.0, 1.0, np.nan, np.inf, -np.inf, 1.0, 1.0, np.inf, 1.0, 1.0, -1.0] * 3, np.float32)
    x, u = x.astype(NP[dtype]), u.astype(NP[dtype])
    for op, args, kw in [("silu_mul", (x, u), {}), ("gelu", (x,), {"approximate": "none"}),
                         ("gelu", (x,), {"approximate": "tanh"})]:
        with np.errstate(all="ignore"):
            g = getattr(e, op)(*args, backend="gpu", **kw).astype(np.float64)
            c = getattr(e, op)(*args, backend="cpu", **kw).astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(c), err_msg=f"{op} {kw}")
        fin = np.isfinite(c)
        np.testing.assert_array_equal(g[~fin & ~np.isnan(c)], c[~fin & ~np.isnan(c)])
        np.testing.assert_allclose(g[fin], c[fin], rtol=UNIT[dtype] * 2 + 1e-6, atol=TINY[dtype])
    xr = x[:32].reshape(1, 2, 2, 8)
    ref, _ = rope_reference(xr, np.array([3, 9]), 10000.0, 1.0, "neox")
    g = e.rope(xr, np.array([3, 9]), backend="gpu").astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(ref))


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_long_positions_keep_float64_angles(ex, style):
    e, rt = ex
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 7, 32)).astype(np.float32)
    positions = np.array([0, 4095, 32767, 32768, 131071, 3_000_000, 60_000_000])
    g = e.rope(x, positions, base=500000.0, scale=1.0, style=style, backend="gpu")
    _ran_on_gpu(e, "rope")
    ref, mag = rope_reference(x, positions, 500000.0, 1.0, style)
    within(g, ref, 4 * 2.0 ** -24 * mag + 2.0 ** -24 * np.abs(ref), "rope long positions")


def test_rope_angles_past_the_kernels_reduction_are_refused(ex):
    """Past 2^26 rad the GPU kernel's reduction would lose accuracy: the planner refuses the call
    (GpuError "unsupported", which the scheduler's fallback sends to the CPU), naming the limit."""
    e, rt = ex
    x = np.ones((1, 1, 2, 8), np.float32)
    with pytest.raises(GpuError, match=r"2\^26"):
        e.rope(x, np.array([0, 70_000_000]), backend="gpu")
    # a base below 1 makes the highest frequency the largest: its angle counts
    with pytest.raises(GpuError, match=r"2\^26"):
        e.rope(x, np.array([0, 1_000_000]), base=1e-3, backend="gpu")
    e.rope(x, np.array([0, 1_000_000]), base=10000.0, backend="gpu")
    _ran_on_gpu(e, "rope")


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("op,form", [(op, f) for op, forms in FORMS.items() for f in forms])
def test_out_and_in_place_on_both_sides(ex, op, form, dtype):
    """out= on each side: the result is the given array, holding that side's result bit for bit; in
    place (out= the first input itself) too, where the GPU reads its upload of the input and the CPU
    kernel reads each element before writing it."""
    e, rt = ex
    rng = np.random.default_rng(abs(hash((op, form, dtype, "out"))) % 2 ** 32)
    args, kwargs = CASES[op].make(rng, dtype, form)
    for side in ("gpu", "cpu"):
        want = getattr(e, op)(*args, backend=side, **kwargs)
        out = np.full_like(want, np.nan)
        got = getattr(e, op)(*args, backend=side, out=out, **kwargs)
        assert got is out
        if side == "gpu":
            _ran_on_gpu(e, op)
        np.testing.assert_array_equal(_bits(out), _bits(want), err_msg=f"{op} {form} {dtype} {side} out=")
        first = args[0].copy()
        got = getattr(e, op)(first, *args[1:], backend=side, out=first, **kwargs)
        assert got is first
        np.testing.assert_array_equal(_bits(first), _bits(want), err_msg=f"{op} {form} {dtype} {side} in place")
