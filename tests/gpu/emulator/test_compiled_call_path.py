"""The compiled GPU call path with kernels that really run: the kernel emulator (tests/support/gpu_emulator.py)
given C entry points (tests/support/emu_c_driver.py), so a GPU call on device data is recorded as a plan
on its first run (gpu/launch/recording.py) and replayed by the dispatcher in C on later ones (_dispatch.pyx,
gpu/launch/_callpath.pyx) through the same function pointers a real driver gives.

- every op with a GPU side x every dtype it declares (the op specs, as test_executor_op_matrix.py,
  whose builders, reference checks and bounds are used here): called twice; an op the recorder can
  replay makes one plan and its second call reaches no glue, launches the very kernels with the very
  grids and scalar parameters through the C launch entry, and gives the first call's bits; every op's
  result matches the CPU's. Which ops replay is data here (REPLAYED / NOT_REPLAYED), so a change shows;
- replay keys: aliasing between inputs, shapes, alignment and scalar parameters each select a plan of
  their own;
- lifetimes on the asynchronous emulator: inputs (hipsched's own, on any stream, and a foreign
  library's, beside a hipsched array on a busy non-blocking stream) dropped while their kernels are
  queued are freed after them (its memcheck sees every use of freed memory), a replay reads an input
  after its producer's stream wrote it, and results stay valid;
- threads sharing one Executor replay at once (in a child process: the failure is a crash);
- failures: a bad stream is refused before the driver; a destroyed stream, out of memory, a failed
  staged upload and a launch failing midway through a plan rerun on the CPU with the right answer and
  the failure in the telemetry event, and leak nothing; a failure that takes the device raises one
  clear error;
- a second device and HIP: an executor on device 1 beside one on device 0, and one matrix case per op
  on device 1, under the double's CUDA table at warp 32 and its HIP table at warp 64.
The C launch entry reads each kernel parameter with the type the kernel's emulator build records
(EmuRuntime.param_types), so a plan whose slots hold the wrong bytes gives wrong results here."""
from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

import emu_c_driver
import fake_array_lib
import gpu_emulator
from call_counts import count_calls
from hipsched import Executor
from hipsched.backends import gpu as gpu_backend_module
from hipsched.backends.gpu import GpuBackend
from hipsched.errors import GpuError
from hipsched.gpu.memory.device_array import DeviceArray, to_device
from hipsched.ops import OPS

# the op matrix's builders, reference checks and bounds (tests/support)
from op_cases import CASES, NP, assert_same_bits, to_host  # noqa: E402

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

GPU_OPS = {op for op, spec in OPS.items() if spec.gpu is not None}

# Ops whose glue run the recorder (gpu/launch/recording.py) turns into a plan, for device inputs (matmul:
# without a vendor BLAS, as here; with one, its calls go through Python and the recorder refuses).
REPLAYED = {"add", "scale", "softmax", "silu_mul", "gelu", "rope", "rms_norm", "cosine_similarity", "top_k", "attention", "matmul"}
# The others, and why: they still run through the glue every time, with the right answer.
NOT_REPLAYED = {
    "qmatmul": "W is a QuantizedTensor: host block bytes, uploaded as kept (immutable) weights",
    "dequantize": "its only input is a QuantizedTensor: host block bytes, uploaded as kept weights",
    "spread_activation": "host CSR arrays and seeds only, and the glue zeroes its accumulator with ctx.rt.memset",
}
# Results that may differ in their last bits between two runs of the same kernels: float atomics
# (graph.hip's push adds along edges in whatever order the block's threads get there).
NONDETERMINISTIC = {"spread_activation"}


# ------------------------------------------------------------------------------ fixtures

def emu(**kw):
    rt = gpu_emulator.EmuRuntime(32, **kw)
    emu_c_driver.attach(rt)   # before anything asks driver_for(rt): the answer is kept on the runtime
    return rt


@pytest.fixture(scope="module")
def rt():
    mp = pytest.MonkeyPatch()
    mp.setenv("HIPSCHED_BLAS", "none")   # the emulator has no vendor BLAS: matmul is the tiled kernel
    runtime = emu()
    yield runtime
    runtime.close()
    mp.undo()


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kernels")


def make_executor(runtime, kernel_dir, tmp_path, **overrides):
    gpu = GpuBackend({"kernel_cache_dir": str(kernel_dir)}, runtime=runtime)
    assert gpu.available, gpu.unavailable_reason
    assert gpu.callpath is not None, "the emulator's C entry points gave no compiled call path"
    return gpu, Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), **overrides)


@pytest.fixture
def executor(rt, kernel_dir, tmp_path):
    """(Executor, GpuBackend) on the module's emulator, fallback off: a GPU failure, replayed or not,
    cannot hide behind a CPU rerun."""
    gpu, ex = make_executor(rt, kernel_dir, tmp_path, allow_fallback=False)
    with ex:
        yield ex, gpu
    gpu.close()


@pytest.fixture
def launches(rt, monkeypatch):
    """Every kernel launch the emulator gets (from the glue's Python calls and the C launch entry alike),
    as (function, grid, block, shared, stream, args)."""
    seen = []
    real = rt.launch

    def launch(function, grid, block, args, shared_bytes=0, stream=0):
        seen.append((int(function), tuple(grid), tuple(block), int(shared_bytes), int(stream or 0), tuple(args)))
        return real(function, grid, block, args, shared_bytes, stream)
    monkeypatch.setattr(rt, "launch", launch)
    return seen


def describe(launch, inputs):
    """A launch with its pointers into the call's inputs as (input, offset), other device pointers (the
    call's outputs and scratch, new each run) as "device", and every other parameter as its bytes."""
    fn, grid, block, shared, stream, args = launch
    params = []
    for a in args:
        if isinstance(a, ctypes.c_void_p):
            p = a.value or 0
            where = [("input", i, p - base) for i, (base, n) in enumerate(inputs) if base <= p < base + max(n, 1)]
            params.append(where[0] if where else ("device",) if p else ("null",))
        else:
            params.append((type(a).__name__, bytes(a)))
    return fn, grid, block, shared, stream, tuple(params)


def device_inputs(args):
    return [(a.ptr, a.nbytes) for a in args if isinstance(a, DeviceArray)]


# ------------------------------------------------------------------------------ the op matrix

def matrix():
    """(op, dtype, form) for every op with a GPU side and every dtype its spec declares for the GPU."""
    params = []
    for op, spec in OPS.items():
        if spec.gpu is None:
            continue
        case = CASES.get(op)
        if case is None:
            params.append(pytest.param(op, None, None, id=f"{op}-has-no-builder"))
            continue
        for dtype in spec.gpu_dtypes:
            for form in case.forms:
                params.append(pytest.param(op, dtype, form, id=f"{op}-{dtype.replace('/', '-')}-{form}"))
    return params


def rotated_subset():
    """One case per op with a GPU side: its dtypes and forms taken in turn across the ops, so every
    dtype and form kind appears somewhere (the whole matrix once more, at warp 64 on a second device,
    would double this module's two minutes on CI's two cores)."""
    params, i = [], 0
    for op, spec in OPS.items():
        case = CASES.get(op)
        if spec.gpu is None or case is None:
            continue
        dtype, form = spec.gpu_dtypes[i % len(spec.gpu_dtypes)], case.forms[i % len(case.forms)]
        params.append(pytest.param(op, dtype, form, id=f"{op}-{dtype.replace('/', '-')}-{form}"))
        i += 1
    return params


def test_which_ops_replay_is_stated_for_every_op():
    assert REPLAYED | set(NOT_REPLAYED) == GPU_OPS and not REPLAYED & set(NOT_REPLAYED), (
        f"state whether each op with a GPU side replays: unlisted {sorted(GPU_OPS - REPLAYED - set(NOT_REPLAYED))}")


@pytest.mark.parametrize("op,dtype,form", matrix())
def test_second_call_replays_the_first(executor, rt, launches, monkeypatch, op, dtype, form):
    second_call_replays_the_first(executor, rt, launches, monkeypatch, op, dtype, form)


def second_call_replays_the_first(executor, rt, launches, monkeypatch, op, dtype, form):
    """The matrix case `op, dtype, form` on `executor`'s GPU (its device arrays made on `rt`, that
    device's runtime): see the module's docstring."""
    case = CASES.get(op)
    if case is None:
        pytest.fail(f"{op} has a GPU side but op_cases.CASES has no builder for it")
    ex, gpu = executor
    rng = np.random.default_rng(zlib.crc32(f"{op} {dtype} {form}".encode()))
    host_args, kwargs = case.make(rng, dtype, form)
    args = tuple(to_device(a, runtime=rt) if i in case.device else a for i, a in enumerate(host_args))
    inputs = device_inputs(args)
    fn = getattr(ex, op)
    replays = op in REPLAYED

    c = to_host(fn(*host_args, backend="cpu", **kwargs))
    assert ex.events[-1]["backend"] == "cpu"

    glue = count_calls(monkeypatch, gpu, ["_run"])
    c_entry = emu_c_driver.calls(rt)
    c_launches = c_entry["launch"]
    plans = ex._fast.plan_count
    first = fn(*args, backend="gpu", **kwargs)
    event = ex.events[-1]
    assert (event["op"], event["backend"], event["fallback"], event["dtype"]) == (op, "gpu", None, dtype)
    assert glue["_run"] == 1
    assert ex._fast.plan_count == plans + replays, (
        f"{op}: {'no plan was recorded' if replays else 'a plan was recorded'} (REPLAYED says "
        f"{'it replays' if replays else 'it does not'})")
    glue_launches = [describe(l, inputs) for l in launches]
    assert glue_launches and c_entry["launch"] == c_launches   # the glue launches through Python

    del launches[:]
    second = fn(*args, backend="gpu", **kwargs)
    event = ex.events[-1]
    assert (event["op"], event["backend"], event["fallback"], event["dtype"]) == (op, "gpu", None, dtype)
    if replays:
        assert glue["_run"] == 1, f"{op}: the second call went through the glue, not the plan"
        # the plan's launches went through the C entry point, as the glue made them: same kernels, grids,
        # blocks, shared memory, stream, scalar parameters to the byte, and input pointers
        assert c_entry["launch"] - c_launches == len(glue_launches)
        assert [describe(l, inputs) for l in launches] == glue_launches
    else:
        assert glue["_run"] == 2 and c_entry["launch"] == c_launches
    assert emu_c_driver.take_errors(rt) == []

    lives = DeviceArray if case.device else np.ndarray
    for o in (first + second) if isinstance(first, tuple) else (first, second):
        assert isinstance(o, lives), (op, type(o))
    g1, g2 = to_host(first), to_host(second)
    if op not in NONDETERMINISTIC:
        for a, b in zip(g1 if isinstance(g1, tuple) else (g1,), g2 if isinstance(g2, tuple) else (g2,)):
            assert_same_bits(b, a)   # the replay is the glue's run again, bit for bit
    # the first call against the outside reference too: for an op whose two runs may differ in their
    # last bits, this is what holds the first one
    case.check(g1, host_args, kwargs, dtype)

    # and right: as test_executor_op_matrix compares the GPU with the CPU and an outside reference
    out_dtype = NP[case.out_dtype(dtype)]
    if op == "top_k":
        (gi, gs), (ci, cs) = g2, c
        assert gs.dtype == cs.dtype == out_dtype and gi.dtype == ci.dtype
        np.testing.assert_array_equal(gi, ci)
        np.testing.assert_allclose(gs, cs, rtol=0, atol=5e-6)
    else:
        assert (g2.dtype, g2.shape) == (c.dtype, c.shape) and g2.dtype == out_dtype
        if case.exact:
            assert_same_bits(g2, c)
    case.check(g2, host_args, kwargs, dtype)


# ------------------------------------------------------------------------------ replay keys

def dev(rt, host):
    return to_device(np.ascontiguousarray(host), runtime=rt)


def view(x, start, n):
    """Elements [start, start + n) of a 1-d device array, sharing its memory."""
    return DeviceArray(x.ptr + start * x.itemsize, (n,), x.dtype, x.runtime, owner=x)


def test_aliasing_between_inputs_is_part_of_the_key(executor, rt, monkeypatch):
    ex, gpu = executor
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 256), dtype=np.float32)
    x, y = dev(rt, a), dev(rt, b)
    np.testing.assert_array_equal(ex.add(x, x, backend="gpu").get(), a + a)
    np.testing.assert_array_equal(ex.add(x, y, backend="gpu").get(), a + b)   # not x + x's plan
    assert ex._fast.plan_count == 2 and glue["_run"] == 2
    np.testing.assert_array_equal(ex.add(x, x, backend="gpu").get(), a + a)
    np.testing.assert_array_equal(ex.add(y, x, backend="gpu").get(), b + a)
    np.testing.assert_array_equal(ex.add(y, y, backend="gpu").get(), b + b)
    assert ex._fast.plan_count == 2 and glue["_run"] == 2   # each replayed its own pattern's plan
    # overlapping views of one buffer: their offset is part of the pattern
    big = np.arange(512, dtype=np.float32)
    z = dev(rt, big)
    for (i, j), plans in (((0, 128), 3), ((0, 64), 4), ((128, 256), 4)):   # the last one: the first's pattern
        got = ex.add(view(z, i, 256), view(z, j, 256), backend="gpu").get()
        np.testing.assert_array_equal(got, big[i:i + 256] + big[j:j + 256])
        assert ex._fast.plan_count == plans
    assert ex._fast.plan_count == 4 and glue["_run"] == 4
    assert emu_c_driver.take_errors(rt) == []


def test_shapes_and_alignment_make_plans_of_their_own(executor, rt, monkeypatch):
    ex, gpu = executor
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(2)
    for n in (256, 64, 257, 256):   # the last one replays the first one's plan
        a, b = rng.standard_normal((2, n), dtype=np.float32)
        np.testing.assert_array_equal(ex.add(dev(rt, a), dev(rt, b), backend="gpu").get(), a + b)
    assert ex._fast.plan_count == 3 and glue["_run"] == 3
    # a (rows, n) x with an n bias: other kernels, other plans
    for shape_a, shape_b in (((4, 64), (64,)), ((8, 32), (32,)), ((4, 64), (64,)), ((4, 64), (4, 64))):
        a, b = rng.standard_normal(shape_a, dtype=np.float32), rng.standard_normal(shape_b, dtype=np.float32)
        np.testing.assert_array_equal(ex.add(dev(rt, a), dev(rt, b), backend="gpu").get(), a + b)
    assert ex._fast.plan_count == 6 and glue["_run"] == 6
    # an input 4 bytes off 16-byte alignment: the glue's scalar (not 4-wide) kernel, in a plan of its own
    base = rng.standard_normal(260, dtype=np.float32)
    x = dev(rt, base)
    for start in (1, 1, 0):
        got = ex.scale(view(x, start, 256), 3.0, backend="gpu").get()
        np.testing.assert_array_equal(got, base[start:start + 256] * np.float32(3.0))
    assert ex._fast.plan_count == 8 and glue["_run"] == 8
    assert emu_c_driver.take_errors(rt) == []


def test_a_scalar_parameter_selects_its_own_plan(executor, rt, monkeypatch):
    ex, gpu = executor
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(3)
    a = rng.standard_normal(256, dtype=np.float32)
    x = dev(rt, a)
    for alpha in (2.0, -0.5, 2.0, -0.5, 2):   # 2 (an int) is a key of its own, with the same answer
        np.testing.assert_array_equal(ex.scale(x, alpha, backend="gpu").get(), a * np.float32(alpha))
    assert ex._fast.plan_count == 3 and glue["_run"] == 3
    np.testing.assert_array_equal(ex.scale(x, alpha=7.5, backend="gpu").get(), a * np.float32(7.5))
    q, T = rng.standard_normal(16, dtype=np.float32), rng.standard_normal((300, 16), dtype=np.float32)
    dq, dT = dev(rt, q), dev(rt, T)
    for k in (3, 5, 3, 5, 1):
        idx, scores = ex.top_k(dq, dT, k, backend="gpu")
        want_idx, want_scores = ex.top_k(q, T, k, backend="cpu")
        assert idx.shape == (k,) and scores.shape == (k,)
        np.testing.assert_array_equal(idx.get(), want_idx)
        np.testing.assert_allclose(scores.get(), want_scores, rtol=0, atol=5e-6)
    assert ex._fast.plan_count == 3 + 1 + 3 and glue["_run"] == 3 + 1 + 3
    # rms_norm's eps travels as a double: a new eps is a new plan with the new answer
    xs, w = rng.standard_normal((4, 64), dtype=np.float32), rng.standard_normal(64, dtype=np.float32)
    dx, dw = dev(rt, xs), dev(rt, w)
    for eps in (1e-5, 10.0, 1e-5):
        got = ex.rms_norm(dx, dw, eps=eps, backend="gpu").get()
        np.testing.assert_array_equal(got, ex.rms_norm(xs, w, eps=eps, backend="cpu"))
    assert ex._fast.plan_count == 9 and glue["_run"] == 9
    assert emu_c_driver.take_errors(rt) == []


def test_a_grid_sized_to_the_device_replays_as_recorded(executor, rt, launches, monkeypatch):
    """The 16-byte elementwise kernels' grid is one resident wave of the device (its multiprocessor count
    x RESIDENT_BLOCKS_V8 blocks) once there is enough work: the plan holds it as a plain launch
    parameter, so the replay launches the glue's grid, and an input off 16-byte alignment gets the
    scalar kernel's grid in a plan of its own."""
    from hipsched.gpu.glue import common, elementwise
    ex, gpu = executor
    glue = count_calls(monkeypatch, gpu, ["_run"])
    mps = rt.device_info(0).multiprocessors
    n = 2 * 8 * common.BLOCK * common.RESIDENT_BLOCKS_V8 * mps * 3 + 5   # three passes of the grid, a tail
    a = np.random.default_rng(8).standard_normal(n + 1, dtype=np.float32)
    x = dev(rt, a)
    v8 = common.bandwidth_blocks(elementwise._v8_items(n), mps, common.RESIDENT_BLOCKS_V8)
    scalar = common.bandwidth_blocks(n, mps)
    assert v8 == mps * common.RESIDENT_BLOCKS_V8 and scalar == mps * common.RESIDENT_BLOCKS
    for view_start, grid in ((0, v8), (0, v8), (1, scalar), (1, scalar)):
        del launches[:]
        got = ex.scale(view(x, view_start, n), 2.0, backend="gpu").get()
        np.testing.assert_array_equal(got, a[view_start:view_start + n] * np.float32(2.0))
        assert [(l[1], l[2]) for l in launches] == [((grid, 1, 1), (common.BLOCK, 1, 1))]
    assert ex._fast.plan_count == 2 and glue["_run"] == 2   # each second call replayed its plan
    assert emu_c_driver.take_errors(rt) == []


def test_runs_the_recorder_refuses_keep_going_through_the_glue(executor, rt, monkeypatch):
    """A glue run that reaches past what a plan can redo (here ctx.rt.memset for zero-length vectors:
    every score 0) records nothing, and every such call runs the glue, with the right answer; an empty
    call (no launch at all) replays."""
    ex, gpu = executor
    glue = count_calls(monkeypatch, gpu, ["_run"])
    # a refused key is recorded once, not at every call (each recording exports the arguments again)
    made = []
    real_recorder = gpu_backend_module.PlanRecorder
    monkeypatch.setattr(gpu_backend_module, "PlanRecorder", lambda *a: made.append(1) or real_recorder(*a))
    for n in (1, 2):
        scores = ex.cosine_similarity(dev(rt, np.ones((3, 0), np.float32)), dev(rt, np.ones((5, 0), np.float32)),
                                      backend="gpu")
        np.testing.assert_array_equal(scores.get(), np.zeros((3, 5), np.float32))
        idx, top = ex.top_k(dev(rt, np.ones((2, 0), np.float32)), dev(rt, np.ones((5, 0), np.float32)), 2,
                            backend="gpu")
        np.testing.assert_array_equal(top.get(), np.zeros((2, 2), np.float32))
        assert idx.get().shape == (2, 2)
        assert ex._fast.plan_count == 0 and glue["_run"] == 2 * n
        assert len(made) == 2 and ex._fast.unrecordable_keys == 2
    for _ in range(2):
        out = ex.add(dev(rt, np.ones(0, np.float16)), dev(rt, np.ones(0, np.float16)), backend="gpu")
        assert (out.shape, out.dtype, ex.events[-1]["backend"]) == ((0,), np.float16, "gpu")
        assert out.get().shape == (0,)
    assert ex._fast.plan_count == 1 and glue["_run"] == 5
    assert emu_c_driver.take_errors(rt) == []


def test_a_replayed_result_feeds_a_replayed_call(executor, rt, monkeypatch):
    """Results of the compiled path (DeviceArrays it makes without their constructor) as the inputs of
    the next calls: chains of replays, on the null stream and on a stream of their own."""
    ex, gpu = executor
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 4, 64), dtype=np.float32)
    x, y = dev(rt, a), dev(rt, b)
    s = rt.stream_create()   # not destroyed: results made on it are freed on it (the runtime's close ends it)
    for stream in (None, None, s):
        h = ex.add(x, y, backend="gpu", stream=stream)
        h = ex.softmax(h, backend="gpu", stream=stream)
        h = ex.scale(h, 4.0, backend="gpu", stream=stream)
        got = h.get()
    want = ex.scale(ex.softmax(a + b, backend="cpu"), 4.0, backend="cpu")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert glue["_run"] == 3 and ex._fast.plan_count == 3
    assert emu_c_driver.take_errors(rt) == []


# ------------------------------------------------------------------------------ lifetimes

@pytest.fixture
def async_rt(monkeypatch):
    """The asynchronous emulator (every stream a worker, each item 5 ms late: a caller's next line runs
    long before its kernels), C entry points attached, and the fake array library on it."""
    from hipsched.gpu.bindings import detect
    runtime = emu(asynchronous=True, delay=0.005)
    monkeypatch.setattr(detect, "get_runtime", lambda: runtime)   # foreign arrays are wrapped with it
    lib = fake_array_lib.install(runtime)
    yield runtime, lib
    fake_array_lib.uninstall()
    runtime.close()   # AssertionError if its memcheck found anything


def test_inputs_dropped_while_replayed_work_is_queued_are_freed_after_it(async_rt, kernel_dir, tmp_path,
                                                                         monkeypatch):
    rt, lib = async_rt
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(5)
    q = rng.standard_normal(16, dtype=np.float32)
    T = rng.standard_normal((300, 16), dtype=np.float32)
    s = rt.stream_create()
    with ex:
        # the plans: add, and top_k (scratch, several launches)
        ex.add(dev(rt, q), dev(rt, q), backend="gpu")
        ex.top_k(dev(rt, q), dev(rt, T), 4, backend="gpu")
        rt.synchronize()
        recorded = glue["_run"]
        assert ex._fast.plan_count == 2
        results = []
        for stream in (None, s, None, s):
            a, b = rng.standard_normal((2, 16), dtype=np.float32)
            x, y = dev(rt, a), dev(rt, b)          # made on the null stream, read on `stream`
            out = ex.add(x, y, backend="gpu", stream=stream)
            del x, y                                # the caller lets go at once: the kernel is still queued
            dq, dT = dev(rt, a), dev(rt, T)
            idx, scores = ex.top_k(dq, dT, 4, backend="gpu", stream=stream)
            del dq, dT
            gc.collect()
            results.append((a, b, out, idx, scores))
        # a foreign library's arrays, dropped at once: held by the compiled path until their work ran
        ex.add(lib.tensor(q), lib.tensor(q), backend="gpu")   # its own key (the array type): recorded
        recorded_foreign = glue["_run"]
        a, b = rng.standard_normal((2, 16), dtype=np.float32)
        ta, tb = lib.tensor(a), lib.tensor(b)
        foreign = ex.add(ta, tb, backend="gpu")
        del ta, tb
        gc.collect()
        assert glue["_run"] == recorded_foreign == recorded + 1, "the calls were not replayed"
        assert type(foreign) is fake_array_lib.Tensor
        np.testing.assert_array_equal(foreign.numpy(), a + b)
        for a, b, out, idx, scores in results:
            np.testing.assert_array_equal(out.get(), a + b)
            want_idx, want_scores = ex.top_k(a, T, 4, backend="cpu")
            np.testing.assert_array_equal(idx.get(), want_idx)
            np.testing.assert_allclose(scores.get(), want_scores, rtol=0, atol=5e-6)
        rt.synchronize()
    gpu.close()
    del results, out, idx, scores, foreign
    gc.collect()
    rt.synchronize()
    assert rt.take_memcheck_errors() == []
    assert emu_c_driver.take_errors(rt) == []


def test_a_foreign_input_dropped_on_a_non_blocking_stream_is_held_until_its_work_has_run(async_rt, kernel_dir,
                                                                                        tmp_path, monkeypatch):
    """A foreign input (a torch/CuPy-style tensor, consumed through DLPack) beside a hipsched array, on a
    non-blocking stream that is busy (a stall): the result is hipsched's own (the first input's), so
    handing it back orders nothing, and the caller drops the foreign tensor at once. Its memory is freed
    on the legacy stream, which does not wait for a non-blocking one: only the compiled path's hold (an
    event on the call's stream) keeps it until the kernel has read it; memcheck sees the read otherwise."""
    rt, lib = async_rt
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(12)
    s = rt.stream_create()   # non-blocking, as the bindings make them
    with ex:
        results = []
        for _ in range(3):   # recorded, then replayed twice
            a, b = rng.standard_normal((2, 256), dtype=np.float32)
            x, t = dev(rt, a), lib.tensor(b)
            rt.stall(s, 0.1)
            out = ex.add(x, t, backend="gpu", stream=s)
            assert type(out) is DeviceArray and out.stream == s
            del t   # the only reference: its memory goes back now, while the kernel waits behind the stall
            gc.collect()
            results.append((a, b, x, out))
        assert glue["_run"] == 1 and ex._fast.plan_count == 1, "the later calls were not replayed"
        for a, b, x, out in results:
            np.testing.assert_array_equal(out.get(), a + b)
        del results, x, out
        rt.synchronize()
    gpu.close()
    gc.collect()
    assert rt.take_memcheck_errors() == [] and emu_c_driver.take_errors(rt) == []


def test_an_input_made_on_another_stream_is_read_after_its_producer(async_rt, kernel_dir, tmp_path, monkeypatch):
    """A replayed call on the null stream whose input a replayed call on another stream is still
    writing (behind a stall there): the replay orders its stream after the producer's (an event), so
    it reads the finished values, not the never-written (NaN) memory. The producer's own inputs stay
    alive: were they dropped, their stream-ordered frees would order the null stream after the
    producer's work anyway, and a replay that skipped the wait would still pass."""
    rt, _ = async_rt
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(7)
    s = rt.stream_create()
    with ex:
        kept = []
        for _ in range(3):   # recorded, then replayed twice
            a, b = rng.standard_normal((2, 256), dtype=np.float32)
            x, y = dev(rt, a), dev(rt, b)
            kept += [x, y]
            rt.stall(s, 0.1)
            h = ex.add(x, y, backend="gpu", stream=s)
            out = ex.scale(h, 2.0, backend="gpu")
            np.testing.assert_array_equal(out.get(), (a + b) * np.float32(2.0))
        assert glue["_run"] == 2 and ex._fast.plan_count == 2
        del h, out, x, y, kept
        rt.synchronize()
    gpu.close()
    gc.collect()
    assert rt.take_memcheck_errors() == [] and emu_c_driver.take_errors(rt) == []


def test_a_host_input_staged_for_a_call_left_queued_is_not_overwritten(async_rt, kernel_dir, tmp_path, monkeypatch):
    """A host array beside a device array: the result stays on the device and the call returns with its
    upload from the thread's staging buffer still queued (behind a stall). The next call's host array
    must not overwrite the staging buffer before that upload has read it."""
    rt, _ = async_rt
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(9)
    b = rng.standard_normal(64, dtype=np.float32)
    d = dev(rt, b)
    with ex:
        outs = []
        for _ in range(4):   # recorded, then replayed three times
            a = rng.standard_normal(64, dtype=np.float32)
            rt.stall(0, 0.05)
            outs.append((a.copy(), ex.add(a, d, backend="gpu")))
            a[:] = np.nan   # the caller reuses its array at once, as a loop over a buffer does
        assert glue["_run"] == 1 and ex._fast.plan_count == 1
        for a, out in outs:
            np.testing.assert_array_equal(out.get(), a + b)
        del outs, out, d
        rt.synchronize()
    gpu.close()
    gc.collect()
    assert rt.take_memcheck_errors() == [] and emu_c_driver.take_errors(rt) == []


@pytest.mark.parametrize("replayed", [False, True])
def test_a_stream_handle_a_retired_stream_had_is_waited_for(async_rt, kernel_dir, tmp_path, monkeypatch, replayed):
    """Drivers reuse stream handles: a stream made outside a StreamPool may get the handle of one a pool
    retired (destroyed after synchronising), which frees skip. Work queued on it makes it live again, so
    inputs dropped at once are freed after that work, on the glue's path and the compiled one."""
    from hipsched.gpu.memory.streams import _retired_streams, retire_stream
    rt, _ = async_rt
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    s = rt.stream_create()
    rng = np.random.default_rng(11)
    with ex:
        if replayed:
            ex.add(dev(rt, np.ones(64, np.float32)), dev(rt, np.ones(64, np.float32)), backend="gpu", stream=s)
        retire_stream(s)   # as if a pool had destroyed a stream with this handle before
        try:
            a, b = rng.standard_normal((2, 64), dtype=np.float32)
            rt.stall(s, 0.05)
            x, y = dev(rt, a), dev(rt, b)
            out = ex.add(x, y, backend="gpu", stream=s)
            del x, y
            gc.collect()
            np.testing.assert_array_equal(out.get(), a + b)
            if replayed:
                assert ex._fast.plan_count == 1   # the call above was the plan's replay
        finally:
            _retired_streams.discard(s)
        del out
        rt.synchronize()
    gpu.close()
    gc.collect()
    assert rt.take_memcheck_errors() == [] and emu_c_driver.take_errors(rt) == []


THREADS_SCRIPT = """
import gc, sys, threading
sys.path.insert(0, {support!r})
import numpy as np
import emu_c_driver, gpu_emulator
from hipsched import Executor
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu.memory.device_array import to_device

def main():
    rt = gpu_emulator.EmuRuntime(32, asynchronous=True, delay=0.002)
    emu_c_driver.attach(rt)
    gpu = GpuBackend({{"kernel_cache_dir": {kernels!r}}}, runtime=rt)
    ex = Executor(gpu_backend=gpu, persist_model=False, cache_dir={cache!r}, allow_fallback=False)
    a = np.arange(64, dtype=np.float32)
    x = to_device(a, runtime=rt)
    ex.add(x, x, backend="gpu")            # the plan
    rt.synchronize()
    sys.setswitchinterval(1e-6)            # every driver call (Python here) may let another thread in
    outs, errors = [], []

    def work():
        s = rt.stream_create()
        try:
            for _ in range(100):
                out = ex.add(x, x, backend="gpu", stream=s)
            outs.append(out)
        except BaseException as e:
            errors.append(repr(e))
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert ex._fast.plan_count == 1 and emu_c_driver.calls(rt)["launch"] >= 400
    for out in outs:
        assert np.array_equal(out.get(), a + a)
    rt.synchronize()
    assert rt.take_memcheck_errors() == [] and emu_c_driver.take_errors(rt) == []
    del outs, out, x
    gc.collect()
    ex.close()
    gpu.close()
    rt.close()
    print("ok")

main()
"""


def test_threads_sharing_an_executor_replay_at_once(kernel_dir, tmp_path):
    """Four threads replaying one plan through one Executor on the asynchronous emulator, whose timing
    events stay pending (in a child process: the failure this guards against is a crash)."""
    support = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "support")
    code = THREADS_SCRIPT.format(support=support, kernels=str(kernel_dir), cache=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (
        f"exit status {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


# ------------------------------------------------------------------------------ failures

def test_a_failed_replayed_launch_falls_back_to_the_cpu(rt, kernel_dir, tmp_path, monkeypatch):
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)   # fallback allowed (the default)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(6)
    a = rng.standard_normal(256, dtype=np.float32)
    x = dev(rt, a)
    with ex:
        ex.scale(x, 2.0, backend="gpu")
        assert ex._fast.plan_count == 1
        live = set(rt.live)
        emu_c_driver.fail_next(rt, "launch", code=701)   # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, once
        launches = emu_c_driver.calls(rt)["launch"]
        out = ex.scale(x, 2.0, backend="gpu")
        assert emu_c_driver.calls(rt)["launch"] == launches + 1   # the replay reached the C launch
        assert glue["_run"] == 1                                  # and not the glue
        event = ex.events[-1]
        assert (event["op"], event["backend"], event["reason"]) == ("scale", "cpu", "cpu_fallback")
        assert event["fallback"]["backend"] == "gpu"
        assert "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in event["fallback"]["error"]
        assert isinstance(out, DeviceArray)   # where the inputs live, as any device-data call
        np.testing.assert_array_equal(out.get(), a * np.float32(2.0))
        # nothing the failed replay allocated is left once the (CPU's) result is gone
        del out
        gc.collect()
        assert set(rt.live) <= live
        # the next call replays again
        out = ex.scale(x, 2.0, backend="gpu")
        assert ex.events[-1]["backend"] == "gpu" and ex.events[-1]["fallback"] is None and glue["_run"] == 1
        np.testing.assert_array_equal(out.get(), a * np.float32(2.0))
    gpu.close()
    assert emu_c_driver.take_errors(rt) == []


def _fallback_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "failed on the GPU" in r.getMessage()]


@pytest.mark.parametrize("stream", [-1, object()], ids=["negative-handle", "not-a-stream"])
def test_a_bad_stream_is_refused_before_anything_runs(rt, kernel_dir, tmp_path, monkeypatch, caplog, stream):
    """A stream argument that is no stream handle at all is the caller's error: a GpuError that says so,
    raised before the driver is asked anything, with fallback allowed too (no CPU rerun, no event)."""
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    x = dev(rt, np.arange(64, dtype=np.float32))
    with ex:
        ex.add(x, x, backend="gpu")
        ex.add(x, x, backend="gpu")
        assert ex._fast.plan_count == 1
        calls, events = dict(emu_c_driver.calls(rt)), len(ex.events)
        with caplog.at_level("WARNING", logger="hipsched"):
            with pytest.raises(GpuError, match="stream") as e:
                ex.add(x, x, backend="gpu", stream=stream)
        assert e.value.kind == "unsupported"
        assert dict(emu_c_driver.calls(rt)) == calls and len(ex.events) == events
        assert _fallback_warnings(caplog) == []
    gpu.close()
    assert emu_c_driver.take_errors(rt) == []


def test_a_destroyed_stream_reruns_on_the_cpu_with_the_same_result(rt, kernel_dir, tmp_path, monkeypatch, caplog):
    """A replay on a stream the caller destroyed: the driver refuses the handle (INVALID_HANDLE), which
    says nothing of the device's state, so the call reruns on the CPU and gives the CPU's result, and
    the warning says it did; with fallback off the driver's error reaches the caller."""
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    rng = np.random.default_rng(13)
    a = rng.standard_normal(256, dtype=np.float32)
    x = dev(rt, a)
    s = rt.stream_create()
    with ex:
        ex.scale(x, 3.0, backend="gpu", stream=s)
        np.testing.assert_array_equal(ex.scale(x, 3.0, backend="gpu", stream=s).get(), a * np.float32(3.0))
        assert ex._fast.plan_count == 1 and ex.events[-1]["fallback"] is None
        rt.synchronize()
        rt.stream_destroy(s)
        live = set(rt.live)
        with caplog.at_level("WARNING", logger="hipsched"):
            out = ex.scale(x, 3.0, backend="gpu", stream=s)
        ev = ex.events[-1]
        assert (ev["backend"], ev["reason"]) == ("cpu", "cpu_fallback")
        assert "CUDA_ERROR_INVALID_HANDLE" in ev["fallback"]["error"]
        assert isinstance(out, DeviceArray)
        assert_same_bits(out.get(), ex.scale(a, 3.0, backend="cpu"))
        warned = _fallback_warnings(caplog)
        assert len(warned) == 1 and "reran it on the CPU" in warned[0], warned
        del out
        gc.collect()
        assert set(rt.live) <= live
    gpu.close()
    _, strict = make_executor(rt, kernel_dir, tmp_path, allow_fallback=False)
    with strict:
        strict.scale(x, 3.0, backend="gpu")
        strict.scale(x, 3.0, backend="gpu")
        with pytest.raises(GpuError, match="CUDA_ERROR_INVALID_HANDLE"):
            strict.scale(x, 3.0, backend="gpu", stream=s)
    assert rt.take_memcheck_errors() == [] and emu_c_driver.take_errors(rt) == []


def test_a_failure_that_takes_the_device_raises_without_announcing_a_rerun(rt, kernel_dir, tmp_path, caplog):
    """Work queued on a destroyed stream through the emulator's own (Python) calls is a memcheck finding,
    which fails every later call as a sticky device fault does (an illegal address kills a CUDA context):
    the device inputs cannot be read back for a CPU rerun. The caller gets one GpuError that says both,
    and no warning claims a rerun that did not happen."""
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    a = np.arange(96, dtype=np.float32)
    x = dev(rt, a)
    s = rt.stream_create()
    rt.stream_destroy(s)
    try:
        with ex, caplog.at_level("WARNING", logger="hipsched"):
            with pytest.raises(GpuError, match="could not be rerun on the CPU") as e:
                ex.softmax(x, backend="gpu", stream=s)   # no plan for it: the glue, through the emulator
            assert e.value.kind == "lost" and "after stream_destroy" in str(e.value)
            assert _fallback_warnings(caplog) == []
    finally:
        found = rt.take_memcheck_errors()   # the finding the test provoked, and the sticky error with it
        gpu.close()
    assert found and all("after stream_destroy" in f for f in found), found
    assert emu_c_driver.take_errors(rt) == []


@pytest.mark.parametrize("after", [0, 2], ids=["first-output", "scratch"])
def test_out_of_memory_on_replay_reruns_on_the_cpu_and_leaks_nothing(rt, kernel_dir, tmp_path, monkeypatch, after):
    """top_k's plan allocates two outputs and its scratch from the pool: an out-of-memory answer at the
    first allocation or at the scratch (the outputs already made) reruns the call on the CPU with the
    CPU's answer, lets go of what the replay had allocated, and the next call replays again."""
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(14)
    q, T = rng.standard_normal(16, dtype=np.float32), rng.standard_normal((300, 16), dtype=np.float32)
    dq, dT = dev(rt, q), dev(rt, T)
    want_idx, want_scores = ex.top_k(q, T, 5, backend="cpu")
    with ex:
        ex.top_k(dq, dT, 5, backend="gpu")
        assert ex._fast.plan_count == 1
        live = set(rt.live)
        emu_c_driver.fail_next(rt, "malloc_async", code=2, after=after)   # CUDA_ERROR_OUT_OF_MEMORY
        idx, scores = ex.top_k(dq, dT, 5, backend="gpu")
        ev = ex.events[-1]
        assert (ev["backend"], ev["reason"]) == ("cpu", "cpu_fallback")
        assert "CUDA_ERROR_OUT_OF_MEMORY" in ev["fallback"]["error"]
        assert glue["_run"] == 1   # the replay failed; the glue was not tried
        np.testing.assert_array_equal(idx.get(), want_idx)
        np.testing.assert_allclose(scores.get(), want_scores, rtol=0, atol=5e-6)
        del idx, scores
        gc.collect()
        assert set(rt.live) <= live, "the failed replay left device memory allocated"
        idx, scores = ex.top_k(dq, dT, 5, backend="gpu")
        assert ex.events[-1]["backend"] == "gpu" and glue["_run"] == 1
        np.testing.assert_array_equal(idx.get(), want_idx)
    gpu.close()
    assert emu_c_driver.take_errors(rt) == []


@pytest.mark.parametrize("host_result", [False, True], ids=["device-result", "host-result"])
def test_a_failed_staged_upload_reruns_on_the_cpu(rt, kernel_dir, tmp_path, monkeypatch, host_result):
    """Small host arrays are staged up in one copy: that copy failing reruns the call on the CPU (with
    the caller's arrays, whatever the staging buffer held), and the next call's staging gives its own
    values, not the failed call's."""
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(15)
    b = rng.standard_normal(64, dtype=np.float32)
    other = b if host_result else dev(rt, b)   # all-host inputs: the result comes back down too
    with ex:
        ex.add(rng.standard_normal(64, dtype=np.float32), other, backend="gpu")
        assert ex._fast.plan_count == 1
        a = rng.standard_normal(64, dtype=np.float32)
        emu_c_driver.fail_next(rt, "memcpy_htod", code=1)
        htod = emu_c_driver.calls(rt)["memcpy_htod"]
        out = ex.add(a, other, backend="gpu")
        assert emu_c_driver.calls(rt)["memcpy_htod"] == htod + 1   # the replay's staged upload was tried
        ev = ex.events[-1]
        assert (ev["backend"], ev["reason"]) == ("cpu", "cpu_fallback") and "INVALID_VALUE" in ev["fallback"]["error"]
        assert isinstance(out, np.ndarray if host_result else DeviceArray)
        np.testing.assert_array_equal(to_host(out), a + b)
        a2 = rng.standard_normal(64, dtype=np.float32)
        out = ex.add(a2, other, backend="gpu")
        assert ex.events[-1]["backend"] == "gpu" and glue["_run"] == 1
        np.testing.assert_array_equal(to_host(out), a2 + b)
    gpu.close()
    assert emu_c_driver.take_errors(rt) == []


def test_a_failure_midway_through_a_multi_launch_plan(rt, kernel_dir, tmp_path, monkeypatch):
    """top_k's plan is several launches writing scratch the next ones read: the second launch fails
    after the first ran. The call reruns on the CPU with the CPU's answer, the outputs and scratch the
    replay allocated are let go, and the next replay, from the first launch on, gives the right answer
    (no state of the broken run survives in the plan)."""
    gpu, ex = make_executor(rt, kernel_dir, tmp_path)
    glue = count_calls(monkeypatch, gpu, ["_run"])
    rng = np.random.default_rng(16)
    q, T = rng.standard_normal((2, 16), dtype=np.float32), rng.standard_normal((300, 16), dtype=np.float32)
    dq, dT = dev(rt, q), dev(rt, T)
    want_idx, want_scores = ex.top_k(q, T, 4, backend="cpu")
    with ex:
        ex.top_k(dq, dT, 4, backend="gpu")
        launches = emu_c_driver.calls(rt)["launch"]
        ex.top_k(dq, dT, 4, backend="gpu")   # a replay: how many launches its plan has
        assert ex._fast.plan_count == 1 and emu_c_driver.calls(rt)["launch"] - launches >= 2
        rt.synchronize()
        gc.collect()
        live = set(rt.live)
        launches = emu_c_driver.calls(rt)["launch"]
        emu_c_driver.fail_next(rt, "launch", code=701, after=1)   # the second: LAUNCH_OUT_OF_RESOURCES
        idx, scores = ex.top_k(dq, dT, 4, backend="gpu")
        assert emu_c_driver.calls(rt)["launch"] == launches + 2   # one ran, one failed, none after it
        ev = ex.events[-1]
        assert (ev["backend"], ev["reason"]) == ("cpu", "cpu_fallback")
        assert "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in ev["fallback"]["error"]
        np.testing.assert_array_equal(idx.get(), want_idx)
        np.testing.assert_allclose(scores.get(), want_scores, rtol=0, atol=5e-6)
        del idx, scores
        gc.collect()
        assert set(rt.live) <= live, "the failed replay left device memory allocated"
        idx, scores = ex.top_k(dq, dT, 4, backend="gpu")
        assert ex.events[-1]["backend"] == "gpu" and ex.events[-1]["fallback"] is None and glue["_run"] == 1
        np.testing.assert_array_equal(idx.get(), want_idx)
        np.testing.assert_allclose(scores.get(), want_scores, rtol=0, atol=5e-6)
    gpu.close()
    assert emu_c_driver.take_errors(rt) == []


# ------------------------------------------------------------------------------ a second device, HIP

@pytest.fixture(scope="module", params=[("cuda", 32), ("hip", 64)], ids=["cuda-warp32", "hip-warp64"])
def rt2(request):
    """Two emulated devices behind the C driver double, CUDA's table at warp 32 or HIP's (hipSetDevice,
    _driver.pyx's HIP branch) at warp 64: it refuses a launch of one device's kernel, stream or memory
    while the other is current."""
    vendor, warp = request.param
    mp = pytest.MonkeyPatch()
    mp.setenv("HIPSCHED_BLAS", "none")
    runtime = gpu_emulator.EmuRuntime(warp, devices=2)
    emu_c_driver.attach(runtime, vendor=vendor)
    yield runtime, vendor
    runtime.close()
    mp.undo()


def two_backends(runtime, kernel_dir):
    first = GpuBackend({"kernel_cache_dir": str(kernel_dir)}, runtime=runtime)   # asks driver_for first
    second = first.for_device(1)
    assert first.available and second.available, (first.unavailable_reason, second.unavailable_reason)
    assert first.callpath is not None and second.callpath is not None
    return first, second


def test_the_compiled_path_replays_on_the_second_device(rt2, kernel_dir, tmp_path, monkeypatch):
    """An executor whose GPU is device 1 (its backend made from device 0's, which asked for the driver
    first), beside one on device 0, calls interleaved on one thread: each replay makes its own device
    current, allocates there and launches the kernels its own context loaded; the double refuses
    anything else, and fallback is off, so a replay in the wrong context fails the test."""
    runtime, vendor = rt2
    first, second = two_backends(runtime, kernel_dir)
    glue = count_calls(monkeypatch, second, ["_run"])
    rt1 = second._ctx.rt
    rng = np.random.default_rng(17)
    a, b = rng.standard_normal((2, 4, 64), dtype=np.float32)
    q, T = rng.standard_normal(16, dtype=np.float32), rng.standard_normal((300, 16), dtype=np.float32)
    h = rng.standard_normal(64, dtype=np.float32)
    x1, y1, q1, T1 = (to_device(v, runtime=rt1) for v in (a, b, q, T))
    x0 = to_device(a, runtime=runtime)
    assert x1.device[1] == 1 and runtime.device_of(x1.ptr) == 1 and runtime.device_of(x0.ptr) == 0
    cpu = Executor(gpu_backend=None, persist_model=False, cache_dir=str(tmp_path))
    want_idx, want_scores = cpu.top_k(q, T, 5)
    ex1 = Executor(gpu_backend=second, persist_model=False, cache_dir=str(tmp_path), allow_fallback=False)
    ex0 = Executor(gpu_backend=first, persist_model=False, cache_dir=str(tmp_path), allow_fallback=False)
    with ex1, ex0:
        for _ in range(3):   # recorded, then replayed twice
            launches = emu_c_driver.calls(runtime)["launch"]
            s = ex1.add(x1, y1, backend="gpu")
            m = ex1.softmax(s, backend="gpu")
            idx, scores = ex1.top_k(q1, T1, 5, backend="gpu")
            staged = ex1.add(x1, h, backend="gpu")   # a host bias staged up beside a device-1 array
            zero = ex0.add(x0, x0, backend="gpu")
            for out in (s, m, idx, scores, staged):
                assert out.device[1] == 1 and runtime.device_of(out.ptr) == 1, out.device
            assert zero.device[1] == 0 and runtime.device_of(zero.ptr) == 0
            assert_same_bits(s.get(), a + b)
            np.testing.assert_allclose(m.get(), cpu.softmax(a + b), rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(idx.get(), want_idx)
            np.testing.assert_allclose(scores.get(), want_scores, rtol=0, atol=5e-6)
            assert_same_bits(staged.get(), a + h)
            assert_same_bits(zero.get(), a + a)
        assert ex1._fast.plan_count == 4 and glue["_run"] == 4, "device 1's calls were not replayed"
        assert ex0._fast.plan_count == 1
        assert emu_c_driver.calls(runtime)["launch"] > launches   # the last round's replays launched from C
        assert all(e["backend"] == "gpu" and e["fallback"] is None for e in ex1.events), ex1.events
    cpu.close()
    first.close()
    second.close()
    assert emu_c_driver.take_errors(runtime) == [] and runtime.take_memcheck_errors() == []


@pytest.mark.parametrize("op,dtype,form", rotated_subset())
def test_second_call_replays_the_first_on_the_second_device(rt2, kernel_dir, tmp_path, launches2, monkeypatch,
                                                            op, dtype, form):
    """The op matrix's cases (one per op, dtypes and forms in turn) replayed on device 1, under CUDA's
    table at warp 32 and HIP's at warp 64, checked as on device 0 above."""
    runtime, _ = rt2
    _, second = two_backends(runtime, kernel_dir)
    ex = Executor(gpu_backend=second, persist_model=False, cache_dir=str(tmp_path), allow_fallback=False)
    with ex:
        second_call_replays_the_first((ex, second), second._ctx.rt, launches2, monkeypatch, op, dtype, form)
    second.close()
    assert emu_c_driver.take_errors(runtime) == []


@pytest.fixture
def launches2(rt2, monkeypatch):
    """`launches` on the two-device runtime."""
    runtime, _ = rt2
    seen = []
    real = runtime.launch

    def launch(function, grid, block, args, shared_bytes=0, stream=0):
        seen.append((int(function), tuple(grid), tuple(block), int(shared_bytes), int(stream or 0), tuple(args)))
        return real(function, grid, block, args, shared_bytes, stream)
    monkeypatch.setattr(runtime, "launch", launch)
    return seen


def test_the_driver_double_refuses_what_a_driver_refuses(rt2, kernel_dir, tmp_path):
    """The rules the second-device tests rely on, asked of the double's C table directly: with device 1
    current, device 0's kernel, stream and memory are refused, as is a destroyed stream; a CUDA thread
    with no context current is refused everything but the context calls; device 1's own are taken."""
    import threading
    runtime, vendor = rt2
    first, second = two_backends(runtime, kernel_dir)
    with Executor(gpu_backend=first, persist_model=False, cache_dir=str(tmp_path)) as ex0:
        ex0.scale(to_device(np.ones(64, np.float32), runtime=runtime), 2.0, backend="gpu")   # loads device 0's kernel
    table, got_vendor, context, device = second._ctx.rt.c_entry_points()
    assert (got_vendor, device) == (vendor, 1)
    fn = {name: emu_c_driver.SIGNATURES[name] if vendor == "cuda" else emu_c_driver.HIP_SIGNATURES[name]
          for name in table}
    call = {name: fn[name](address) for name, address in table.items()}
    kernel0 = next(f for f, d in runtime._fn_device.items() if d == 0)
    stream0, stream1 = runtime.stream_create(), second._ctx.rt.stream_create()
    dead = second._ctx.rt.stream_create()
    runtime.stream_destroy(dead)
    mem0 = runtime.malloc(256)
    out = ctypes.c_void_p()

    def refusals():
        got = {"launch device 0's kernel": call["launch"](kernel0, 1, 1, 1, runtime.warp, 1, 1, 0, None, None, None),
               "alloc on device 0's stream": call["malloc_async"](ctypes.byref(out), 256, stream0),
               "alloc on a destroyed stream": call["malloc_async"](ctypes.byref(out), 256, dead),
               "free device 0's memory": call["free_async"](mem0, None)}
        assert call["malloc_async"](ctypes.byref(out), 256, stream1) == 0 and runtime.device_of(out.value) == 1
        assert call["free_async"](out, stream1) == 0
        return got

    status, made = [None], ctypes.c_void_p()

    def no_context():   # a new thread: no CUDA context current, HIP's device 0
        status[0] = call["malloc_async"](ctypes.byref(made), 256, None)
    t = threading.Thread(target=no_context)
    t.start()
    t.join()
    assert status[0] == (emu_c_driver.INVALID_CONTEXT if vendor == "cuda" else 0)
    if made.value:
        assert runtime.device_of(made.value) == 0
        runtime.free(made.value)
    assert call["set_current"](context if vendor == "cuda" else 1) == 0
    assert refusals() == {"launch device 0's kernel": emu_c_driver.INVALID_HANDLE,
                          "alloc on device 0's stream": emu_c_driver.INVALID_HANDLE,
                          "alloc on a destroyed stream": emu_c_driver.INVALID_HANDLE,
                          "free device 0's memory": emu_c_driver.INVALID_VALUE}
    runtime.free(mem0)
    first.close()
    second.close()
    runtime.synchronize()
    assert runtime.take_memcheck_errors() == []
