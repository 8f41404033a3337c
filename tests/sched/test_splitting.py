"""Splitting one call across the CPU and the GPUs (hipsched/splitting.py): each op's partition merges to
exactly the unsplit result, the executor runs forced shares exactly and at once, a failed GPU part
reruns on the CPU, the plan balances the sides by their models (a further device by its own, or the
executor's GPU's until it has one; not at all while its breaker is open), the controls turn it off,
and the event says what happened."""
import json
import math
import time

import numpy as np
import pytest

import hipsched as hs
from hipsched import _sched
from hipsched.backends.cpu import CpuBackend
from hipsched.ops import OPS
from hipsched.ops.base import Call
from hipsched.splitting import Splitter

from fake_gpu import FakeGpuBackend
from half_formats import TYPE_IDS, TYPES
from forced_split import force_split
from planted_ties import exact_query, expected_head, plant
from requires import need

CPU = CpuBackend()


# the query's own row planted four times (score 1: ranks 1-4) and a 0.75 pair (ranks 5-6) in a corpus of
# 999 rows: row 0 and row 998 are on different sides of every cut the tests make, rows 4 and 500 of most
# (tests/support/planted_ties.py: scores exact on every engine)
BEST, SECOND = (0, 4, 500, 998), (3, 997)
# the matrix query's other two rows, each with planted rows of its own
OTHERS = (((1, 333, 996), (5, 666)), ((2, 499, 995), (6, 994)))


def _inputs(rng, dtype="float32"):
    """(op, args, kwargs) of every op that declares a partition, in the forms a split must handle, with
    float inputs of `dtype` (qmatmul's x; dequantize has none)."""
    t = TYPES[dtype]
    f = lambda *s: rng.standard_normal(s).astype(np.float32).astype(t)  # noqa: E731
    T = f(999, 24)
    q1 = exact_query(rng, 24)
    q3 = np.stack([q1, exact_query(rng, 24), exact_query(rng, 24)])
    plant(rng, T, q1, BEST, SECOND)              # ties inside the top k: the lower index must win across a cut
    for q, (best, second) in zip(q3[1:], OTHERS):
        plant(rng, T, q, best, second)
    T[7, 3] = np.nan          # a NaN score ranks after every number
    q1, q3 = q1.astype(t), q3.astype(t)
    return [
        ("top_k", (q1, T, 7), {}),
        ("top_k", (q3, T, 20), {}),
        ("top_k", (q1, T[:5], 9), {}),               # k > rows: every row, merged (ties at rows 0 and 4)
        ("cosine_similarity", (q1, T), {}),
        ("cosine_similarity", (f(4, 24), T), {}),
        ("add", (f(300, 17), f(300, 17)), {}),
        ("add", (f(300, 17), f(17)), {}),             # a bias row: cut a only
        ("add", (f(4099), f(4099)), {}),              # 1-d: cut on elements
        ("scale", (f(257, 9), -1.5), {}),
        ("softmax", (f(129, 33),), {"axis": -1}),
        ("rms_norm", (f(130, 16), f(16)), {"eps": 1e-5}),
        ("qmatmul", (hs.quantize(rng.standard_normal((70, 96)).astype(np.float32), "q8_0"), f(96)), {}),
        ("qmatmul", (hs.quantize(rng.standard_normal((33, 64)).astype(np.float32), "q4_0"), f(64, 5)), {}),
        ("dequantize", (hs.quantize(rng.standard_normal((41, 64)).astype(np.float32), "q4_0"),), {}),
    ]


def _assert_ties_first(op, args, got):
    """The planted ties head the top k, in ascending index (an outside check: not the merge's own order)."""
    if op != "top_k" or args[1].shape[0] != 999:
        return
    idx = np.atleast_2d(got[0])
    assert idx.shape[0] in (1, 3)
    for row, (best, second) in zip(idx, [(BEST, SECOND), *OTHERS]):
        want = expected_head(best, second)
        assert list(row[:len(want)]) == want, (row[:len(want)], want)


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


def test_every_split_op_declares_a_partition():
    declared = {name for name, spec in OPS.items() if spec.partition is not None}
    assert declared == {"top_k", "cosine_similarity", "add", "scale", "softmax", "rms_norm", "qmatmul", "dequantize",
                        "silu_mul", "gelu", "rope"}


@pytest.mark.parametrize("dtype", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("case", range(14))
def test_partition_merges_to_the_unsplit_result(rng, case, dtype):
    op, args, kwargs = _inputs(rng, dtype)[case]
    call = OPS[op].prepare(*args, **kwargs)
    whole = CPU.run(call)
    _assert_ties_first(op, args, whole)
    part = OPS[op].partition(call)
    assert part is not None
    for cuts in ([0, part.rows // 3, part.rows], [0, 1, part.rows - 1, part.rows], [0, part.rows // 2, part.rows]):
        bounds = list(zip(cuts[:-1], cuts[1:]))
        # a part is a call of its own: the part's arguments, the whole call's params
        results = [CPU.run(Call(op, part.args(lo, hi), call.params, 1, 1, call.dtype)) for lo, hi in bounds]
        assert _same(part.merge(results, bounds), whole), (op, cuts)


# ------------------------------------------------------------------ the executor with forced shares

def _forced(gpu, share, **cfg):
    """An executor whose every call reaches the cost model (no exploration) and is cut at `share`."""
    return force_split(hs.Executor(gpu_backend=gpu, persist_model=False, exploration_share=0.0, **cfg), share)


@pytest.mark.parametrize("dtype", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("share", [0.3, 0.75])
def test_forced_split_is_exactly_the_unsplit_cpu_result(rng, share, dtype):
    gpu = FakeGpuBackend(ops=("add", "scale", "softmax", "cosine_similarity", "top_k", "rms_norm", "qmatmul",
                              "dequantize"),
                         dtypes=(dtype, "q8_0", "q4_0", f"q8_0/{dtype}", f"q4_0/{dtype}"))
    with _forced(gpu, share) as ex:
        for op, args, kwargs in _inputs(rng, dtype):
            before = len(ex.events)
            got = getattr(ex, op)(*args, **kwargs)
            assert _same(got, getattr(ex, op)(*args, **kwargs, backend="cpu")), op
            _assert_ties_first(op, args, got)
            ev = ex.events[before]
            assert ev["backend"] == "split" and ev["reason"] == "split", ev
            parts = ev["split"]["parts"]
            rows = OPS[op].partition(OPS[op].prepare(*args, **kwargs)).rows
            # cut where the plan asked: the GPU takes `share` of the rows (rounded), the CPU the rest
            assert parts[0]["rows"] == [0, int(round((1 - share) * rows))], (op, rows, parts)
            assert parts[0]["rows"][1] == parts[1]["rows"][0]
            assert parts[1]["rows"][1] == rows and [p["backend"] for p in parts] == ["cpu", "gpu"]
            assert ev["split"]["shares"]["gpu"] == pytest.approx((rows - parts[0]["rows"][1]) / rows, abs=1e-6)
        assert gpu.ok_runs == 14                      # one GPU part per split call
        st = ex.stats()
        assert st.split_operations == 14 and ex._core.counters()["split_operations"] == 14


def test_each_part_is_learned_as_its_sides_sample(rng):
    gpu = FakeGpuBackend()
    with _forced(gpu, 0.5) as ex:
        q, T = rng.standard_normal(32).astype(np.float32), rng.standard_normal((4000, 32)).astype(np.float32)
        ex.top_k(q, T, 5)
        slot = ex._core.slot("top_k", "float32")
        for backend in (_sched.BACKEND_CPU, _sched.BACKEND_GPU):
            assert math.isfinite(ex._core.predict(slot, backend, 2000 * 32)), backend
        # the GPU part's success counts for the breaker like any GPU run
        assert ex.gpu_health("top_k")["successes"] == 1


def test_a_failed_gpu_part_reruns_on_the_cpu(rng):
    gpu = FakeGpuBackend(fail=lambda call: "launch")
    with _forced(gpu, 0.6) as ex:
        q, T = rng.standard_normal(16).astype(np.float32), rng.standard_normal((3000, 16)).astype(np.float32)
        got = ex.top_k(q, T, 12)
        assert _same(got, ex.top_k(q, T, 12, backend="cpu"))
        ev = [e for e in ex.events if e["backend"] == "split"][-1]
        assert ev["fallback"]["backend"] == "gpu" and "launch" in ev["fallback"]["error"]
        assert [p["backend"] for p in ev["split"]["parts"]] == ["cpu", "cpu"]
        h = ex.gpu_health("top_k")
        assert h["failures"] == 1 and h["successes"] == 0
        assert ex.stats().fallback_operations == 1


@pytest.mark.parametrize("kind", ["launch", "oom"])
def test_a_failed_gpu_part_of_every_split_op_reruns_on_the_cpu(rng, kind):
    """Each op that splits, not only top_k: its GPU part fails, the rows rerun on the CPU, and the call is
    exactly the CPU's whole answer; the failure is the event's and that op's health's."""
    gpu = FakeGpuBackend(ops=("add", "scale", "softmax", "cosine_similarity", "top_k", "rms_norm", "qmatmul",
                              "dequantize"), dtypes=("float32", "q8_0", "q4_0"), fail=lambda call: kind)
    with _forced(gpu, 0.5) as ex:
        cases = _inputs(rng)
        for op, args, kwargs in cases:
            got = getattr(ex, op)(*args, **kwargs)
            ev = ex.events[-1]
            assert ev["backend"] == "split" and ev["fallback"]["backend"] == "gpu", (op, ev)
            assert kind in ev["fallback"]["error"], (op, ev["fallback"])
            assert [p["backend"] for p in ev["split"]["parts"]] == ["cpu", "cpu"], op
            assert _same(got, getattr(ex, op)(*args, **kwargs, backend="cpu")), op
            assert ex.gpu_health(op)["successes"] == 0, op
        assert gpu.runs == len(cases) and gpu.ok_runs == 0
        assert ex.stats().fallback_operations == len(cases)


class SleepyCpu:
    """A CPU backend whose runs take `us` of wall time without holding the GIL (a kernel's threads)."""

    def __init__(self, us):
        self.us = us

    def run(self, call):
        time.sleep(self.us * 1e-6)
        return CPU.run(call)

    def run_device_data(self, call):  # pragma: no cover - host data only here
        raise AssertionError


def test_the_parts_run_at_once(rng):
    gpu = FakeGpuBackend(cost_us=None)
    gpu_run = gpu.run

    def slow_run(call, stream=None):
        time.sleep(0.05)
        return gpu_run(call, stream)
    gpu.run = slow_run
    ex = hs.Executor(gpu_backend=gpu, cpu_backend=SleepyCpu(50000), persist_model=False, exploration_share=0.0)
    with force_split(ex, 0.4):
        q, T = rng.standard_normal(8).astype(np.float32), rng.standard_normal((1000, 8)).astype(np.float32)
        ex.cosine_similarity(q, T)
        ev = [e for e in ex.events if e["backend"] == "split"][-1]
        parts = ev["split"]["parts"]
        assert min(p["duration_us"] for p in parts) >= 45000
        # one after the other would take the sum; at once, the longer part and little more
        assert ev["duration_us"] < 0.8 * sum(p["duration_us"] for p in parts), ev
        assert ev["split"]["balance"] > 0.8


# ------------------------------------------------------------------ planning from the model

def _core_with(cpu_us_per_item, gpu_us_per_item, gpu_fixed_us=50.0, sizes=(1e5, 1e6, 1e7, 1e8)):
    core = _sched.SchedCore(window=100, min_batch=64, min_samples=1, exploration_share=0.0)
    slot = core.slot("top_k", "float32")
    for size in sizes:
        for _ in range(3):
            core.record(slot, _sched.BACKEND_CPU, size, size * cpu_us_per_item)
            core.record(slot, _sched.BACKEND_GPU, size, gpu_fixed_us + size * gpu_us_per_item)
    return core, slot


def _call(n=200000, d=64):
    rng = np.random.default_rng(0)
    return OPS["top_k"].prepare(rng.standard_normal(d).astype(np.float32),
                                rng.standard_normal((n, d)).astype(np.float32), 10)


def _plan(core, slot, call, h2d=0.0, min_us=0.0):
    s = Splitter(core, CPU, None, min_us, lambda *a: None)
    _, _, pc, pg = core.decide(slot, call.size, h2d, 0.0, 0, False)
    return s.plan(call, slot, pc, pg, h2d, 0.0), pc, pg


@pytest.mark.parametrize("ratio", [1.0, 3.0, 0.5])
def test_the_plan_balances_the_two_sides(ratio):
    """The GPU ratio times faster per item: its share is ratio / (1 + ratio), and both sides are
    predicted to finish together, sooner than either alone."""
    core, slot = _core_with(1e-3, 1e-3 / ratio)
    call = _call()
    plan, pc, pg = _plan(core, slot, call)
    assert plan is not None
    assert plan.gpu_share == pytest.approx(ratio / (1 + ratio), abs=0.03)
    assert plan.predicted["cpu"] == pytest.approx(plan.predicted["gpu"], rel=0.06)
    assert plan.predicted_us < 0.9 * min(pc, pg)


def test_copies_move_rows_to_the_cpu():
    core, slot = _core_with(1e-3, 1e-3)
    call = _call()
    free, _, _ = _plan(core, slot, call)
    paying, _, _ = _plan(core, slot, call, h2d=call.nbytes)   # the corpus uploaded on every call
    assert paying.gpu_share < free.gpu_share


def test_no_split_for_short_calls_or_an_unknown_side_or_a_lopsided_pair():
    core, slot = _core_with(1e-3, 1e-3)
    call = _call()
    plan, pc, pg = _plan(core, slot, call)
    assert plan is not None
    assert _plan(core, slot, call, min_us=1.01 * min(pc, pg))[0] is None   # predicted shorter than split_min_us
    lone = _sched.SchedCore(min_samples=1, exploration_share=0.0)
    s = lone.slot("top_k", "float32")
    lone.record(s, _sched.BACKEND_CPU, 1e7, 1e4)
    assert _plan(lone, s, call)[0] is None                 # the GPU never measured
    core, slot = _core_with(1e-3, 1e-5)                    # a GPU 100x faster: the CPU would only slow it
    assert _plan(core, slot, call)[0] is None


def _device_core():
    return _sched.SchedCore(min_batch=0, min_samples=1, exploration_share=0.0, reprobe_interval=0,
                            strategy="gpu_preferred", breaker_failures=1, cooldown_s=3600.0)


class _ResidentFake(FakeGpuBackend):
    """A further device holding the corpus: nothing to copy, as for the executor's GPU in _plan."""

    def transfer_bytes(self, call):
        return 0, 0


def _three_sides(second_us_per_item=None, failed=False):
    core, slot = _core_with(1e-3, 0.5e-3)      # the executor's GPU twice the CPU's throughput
    other = _ResidentFake()
    other.device_index = 1
    first = FakeGpuBackend()
    first.device_index = 0
    s = Splitter(core, CPU, first, 0.0, lambda *a: None, [other], _device_core)
    own = s.others[0].core
    oslot = own.slot("top_k", "float32")
    if second_us_per_item is not None:
        for size in (1e5, 1e6, 1e7, 1e8):
            for _ in range(3):
                own.record(oslot, _sched.BACKEND_GPU, size, 50.0 + size * second_us_per_item)
    if failed:
        own.record(oslot, _sched.BACKEND_GPU, 1e6, 10.0, 0.0, 0.0, False)   # opens its breaker (1 failure)
    call = _call()
    _, _, pc, pg = core.decide(slot, call.size, 0.0, 0.0, 0, False)
    return s, s.plan(call, slot, pc, pg, 0.0, 0.0), (pc, pg)


def test_the_plan_balances_the_cpu_and_two_devices_each_by_its_own_model():
    """A second device measured as fast as the CPU: shares 1 : 2 : 1 (CPU, executor's GPU, second)."""
    s, plan, (pc, pg) = _three_sides(second_us_per_item=1e-3)
    assert [side.name for side in plan.sides] == ["cpu", "gpu:0", "gpu:1"]
    shares = list(plan.shares.values())
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.03)
    times = list(plan.predicted.values())
    assert max(times) == pytest.approx(min(times), rel=0.06)         # every side finishes together
    assert plan.predicted_us < 0.9 * min(pc, pg)


def test_a_device_not_yet_measured_is_predicted_as_the_executors_gpu():
    s, plan, _ = _three_sides(second_us_per_item=None)
    assert list(plan.shares.values()) == pytest.approx([0.2, 0.4, 0.4], abs=0.03)


def test_a_device_whose_breaker_is_open_takes_no_part():
    s, plan, _ = _three_sides(second_us_per_item=1e-3, failed=True)
    assert [side.name for side in plan.sides] == ["cpu", "gpu:0"]
    assert s.others[0].core.health("top_k")["state"] == "open"


def test_the_executor_cuts_where_the_models_plan_says(rng):
    """No forced shares: the executor's model (the GPU 3x the CPU's throughput) plans the split, and the
    call is cut at that plan's bounds, each side's share the one the plan gave it (about 3/4 to the GPU
    less what the corpus's upload costs it)."""
    gpu = FakeGpuBackend()
    with hs.Executor(gpu_backend=gpu, persist_model=False, exploration_share=0.0, split_min_us=0.0) as ex:
        slot = ex._core.slot("top_k", "float32")
        for size in (1e5, 1e6, 1e7, 1e8):
            for _ in range(3):
                ex._core.record(slot, _sched.BACKEND_CPU, size, size * 1e-3)
                ex._core.record(slot, _sched.BACKEND_GPU, size, 50.0 + size * 1e-3 / 3)
        plans = []
        splitter = ex._fast.splitter
        plan = splitter.plan
        splitter.plan = lambda *a: plans.append(plan(*a)) or plans[-1]
        q, T = rng.standard_normal(64).astype(np.float32), rng.standard_normal((20000, 64)).astype(np.float32)
        got = ex.top_k(q, T, 10)
        assert len(plans) == 1 and plans[0] is not None
        ev = ex.events[-1]
        assert ev["backend"] == "split", ev
        asked = plans[0]
        assert [p["rows"] for p in ev["split"]["parts"]] == [list(b) for b in zip(asked.bounds, asked.bounds[1:])]
        assert ev["split"]["shares"] == pytest.approx(asked.shares, abs=1e-6)
        assert 0.5 < asked.shares["gpu"] < 0.8, asked.shares
        assert _same(got, ex.top_k(q, T, 10, backend="cpu"))


def test_controls_turn_splitting_off(rng):
    q, T = rng.standard_normal(16).astype(np.float32), rng.standard_normal((2000, 16)).astype(np.float32)
    with hs.Executor(gpu_backend=FakeGpuBackend(), persist_model=False, split=False) as ex:
        assert ex._fast.splitter is None
    with hs.Executor(gpu_backend=FakeGpuBackend(available=False), persist_model=False) as ex:
        assert ex._fast.splitter is None                   # nothing to split across
    with _forced(FakeGpuBackend(), 0.5) as ex:
        ex.top_k(q, T, 3, split=False)
        ex.top_k(q, T, 3, backend="gpu")
        ex.top_k(q, T, 3, backend="cpu")
        assert [e["backend"] for e in ex.events] == ["cpu", "gpu", "cpu"]
        ex.top_k(q, T, 3)
        assert ex.events[-1]["backend"] == "split"


def test_the_split_event_is_schema_valid_and_its_line_the_same(rng, tmp_path):
    jsonschema = need("jsonschema")
    from hipsched.telemetry.events import schema_path
    schema = json.load(open(schema_path()))
    log = tmp_path / "t.jsonl"
    with _forced(FakeGpuBackend(), 0.5, telemetry_path=str(log)) as ex:
        ex.cosine_similarity(rng.standard_normal(8).astype(np.float32), rng.standard_normal((100, 8)).astype(np.float32))
        mem = ex.events[-1]
    line = json.loads(log.read_text().splitlines()[-1])
    for ev in (mem, line):
        jsonschema.validate(ev, schema)
    assert {k: v for k, v in line.items() if k != "ts"} == {k: v for k, v in mem.items() if k != "ts"}
    assert line["split"]["parts"][1]["rows"] == [50, 100]


def test_a_forked_child_splits_without_the_parents_worker_thread(rng):
    """The child of a fork has the parent's pool object but not its thread: its split calls must start
    their own, not wait forever for a thread that is not there."""
    import os
    import signal
    q, T = rng.standard_normal(16).astype(np.float32), rng.standard_normal((3000, 16)).astype(np.float32)
    with _forced(FakeGpuBackend(), 0.5) as ex:
        ex.top_k(q, T, 4)                           # the parent's worker thread exists now
        want = ex.top_k(q, T, 4, backend="cpu")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            signal.alarm(30)                        # a hang ends the child (and fails the test)
            got = ex.top_k(q, T, 4)
            ok = ex.events[-1]["backend"] == "split" and _same(got, want)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


@pytest.mark.parametrize("dtype", TYPES, ids=TYPE_IDS)
def test_a_split_call_given_out_writes_it_whole(rng, dtype):
    """out= on a split call (each part makes its own result): the rejoined result lands in out, the
    unsplit CPU result bit for bit, and in place (out= the input) reads every part's rows before any is
    written."""
    t = TYPES[dtype]
    f = lambda *s: rng.standard_normal(s).astype(np.float32).astype(t)  # noqa: E731
    gpu = FakeGpuBackend(ops=("silu_mul", "gelu", "rope"), dtypes=(dtype,))
    cases = [("silu_mul", (f(300, 17), f(300, 17)), {}), ("gelu", (f(257, 9),), {"approximate": "tanh"}),
             ("rope", (f(6, 4, 5, 8), np.arange(5)), {"style": "gptj"})]
    with _forced(gpu, 0.5) as ex:
        for op, args, kwargs in cases:
            want = getattr(ex, op)(*args, **kwargs, backend="cpu")
            out = np.zeros_like(want)
            before = len(ex.events)
            assert getattr(ex, op)(*args, **kwargs, out=out) is out
            assert ex.events[before]["backend"] == "split", ex.events[before]
            assert _same(out, want), op
            first = args[0].copy()
            assert getattr(ex, op)(first, *args[1:], **kwargs, out=first) is first
            assert _same(first, want), op
