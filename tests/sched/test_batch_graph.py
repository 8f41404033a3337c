"""A batch whose calls take each other's results is planned as a graph (HEFT: the longest remaining path
first, each call to the side where it finishes earliest) and run by that plan, each side waiting for
the inputs its next call takes from the other. On the virtual machine (tests/support/virtual_machine.py):
each side a timeline, the executor's real decisions, the schedule exact, so the plan and the makespan
are checked as numbers; on the sleeping machine (tests/support/loaded_machine.py), the same with real
threads. Results are the calls that wait, bit for bit."""
import json

import numpy as np
import pytest

from hipsched import Executor
from hipsched.batch_plan import fluid_sides, heft, plan_graph
from hipsched.ops import OPS
from hipsched.submission import SubmittedCallError

from loaded_machine import SleepingCpu, SleepingGpu
from virtual_machine import virtual_batch, virtual_machine

# the GPU 2x on softmax, the same on the rest (copies are in these times: the virtual link is free)
CPU_US = {"scale": 100.0, "softmax": 400.0, "gelu": 300.0, "add": 100.0}
GPU_US = {"scale": 100.0, "softmax": 200.0, "gelu": 300.0, "add": 100.0}


@pytest.fixture
def x():
    return np.random.default_rng(1).standard_normal((8, 64), dtype=np.float32)


def _machine(tmp_path=None, cpu_us=CPU_US, gpu_us=GPU_US):
    cfg = {"telemetry_path": str(tmp_path / "events.jsonl")} if tmp_path is not None else {}
    return virtual_machine(lambda call: cpu_us[call.op], lambda call: gpu_us[call.op], reprobe_interval=0, **cfg)


def _learn(vt, ex, x):
    """Each op measured on both sides at the batch's sizes (so its predictions are the scripted times)."""
    def calls():
        for _ in range(8):
            for be in ("cpu", "gpu"):
                a = ex.scale(x, 2.0, backend=be)
                ex.add(ex.softmax(a, backend=be), ex.gelu(a, backend=be), backend=be)
    vt.run([calls])


def _diamond_calls(ex, x):
    a = ex.submit("scale", x, 2.0)
    b = ex.submit("softmax", a)
    c = ex.gelu(a, wait=False)
    d = ex.submit("add", b, c)
    return a, b, c, d


def _diamond_sync(ex, x):
    a = ex.scale(x, 2.0, backend="cpu")
    b, c = ex.softmax(a, backend="cpu"), ex.gelu(a, backend="cpu")
    return a, b, c, ex.add(b, c, backend="cpu")


def test_a_diamond_is_planned_by_rank_and_earliest_finish(x, tmp_path):
    """scale -> (softmax, gelu) -> add. Ranks (mean time + the longest path after): scale 500, softmax
    400, gelu 400, add 100. scale ties at 100 on both sides (the CPU); softmax ends first on the GPU
    (300 against 500); gelu on the CPU (400 against the GPU's 600, after softmax); add ties at 500
    (the CPU). The run follows the plan: 500 us of virtual time, each call where it was planned."""
    vt, ex, cpu, gpu = _machine(tmp_path)
    with ex, vt.executor_clock(ex):
        _learn(vt, ex, x)
        t0 = vt.ns
        with virtual_batch(vt, ex) as b:
            futs = _diamond_calls(ex, x)
        got = b.results()
        ns = vt.ns - t0
    assert b.plan == [(0, "scale", "cpu", 0.0, 100.0), (1, "softmax", "gpu", 100.0, 300.0),
                      (2, "gelu", "cpu", 100.0, 400.0), (3, "add", "cpu", 400.0, 500.0)]
    assert ns == 500_000
    events = [json.loads(line) for line in open(tmp_path / "events.jsonl")]
    planned = [e for e in events if e.get("phase") == "batch"]
    assert [(e["op"], e["backend"], e["tags"]["planned"]) for e in planned] == \
        [("scale", "cpu", "cpu"), ("softmax", "gpu", "gpu"), ("gelu", "cpu", "cpu"), ("add", "cpu", "cpu")]
    by_op = {e["op"]: e["tags"] for e in planned}
    assert "after" not in by_op["scale"]
    assert by_op["softmax"]["after"] == [0] and by_op["gelu"]["after"] == [0] and by_op["add"]["after"] == [1, 2]
    # gelu (CPU, from 100) ends at 400; the GPU's softmax at 300: add waited for gelu, not softmax
    assert all(t["batch"] == b.id and t["input_wait_us"] >= 0 for t in (by_op["softmax"], by_op["gelu"], by_op["add"]))
    assert futs[3].result() is got[3]


def test_results_of_a_planned_graph_equal_the_calls_that_wait(x):
    vt, ex, cpu, gpu = _machine()
    with ex, vt.executor_clock(ex):
        _learn(vt, ex, x)
        with virtual_batch(vt, ex) as b:
            _diamond_calls(ex, x)
        got = b.results()
        want = []
        vt.run([lambda: want.extend(_diamond_sync(ex, x))])
    assert len(b.plan) == 4
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8))


def test_chains_are_planned_as_a_graph_within_the_bound(x):
    """20 chains scale -> softmax -> gelu: every call in the plan, each after its predecessor and each
    side's calls one at a time; the run ends within 1.15x the larger of the work shared by the two
    sides as a fluid and the longest chain on its best sides."""
    vt, ex, cpu, gpu = _machine()
    with ex, vt.executor_clock(ex):
        _learn(vt, ex, x)
        t0 = vt.ns
        with virtual_batch(vt, ex) as b:
            for _ in range(20):
                ex.submit("gelu", ex.submit("softmax", ex.submit("scale", x, 2.0)))
        b.results()
        us = (vt.ns - t0) * 1e-3
    assert len(b.plan) == 60
    ends = {n: (side, start, end) for n, op, side, start, end in b.plan}
    for k in range(20):
        a, s, g = 3 * k, 3 * k + 1, 3 * k + 2
        assert ends[s][1] >= ends[a][2] and ends[g][1] >= ends[s][2]
    for side in ("cpu", "gpu"):
        spans = sorted((start, end) for side_, start, end in ends.values() if side_ == side)
        assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))
    # the fluid split: the GPU takes the softmaxes (4 ms there), the two sides share the rest (8 ms on
    # either) so that both end at 6 ms; the longest chain, 0.6 ms, is shorter
    bound = max((20 * 200 + 20 * (100 + 300)) / 2, 100 + 200 + 300)
    assert us <= 1.15 * bound, (us, bound)


def test_a_side_that_runs_late_has_its_ready_calls_taken(x, tmp_path):
    """12 chains scale -> softmax, planned with the GPU 2x on softmax; then the GPU runs 4x slower than it
    was measured (800 us a softmax). The CPU, done with its own calls, takes the GPU's queued softmaxes
    whose inputs are done and that end sooner on the CPU: the batch ends well before the planned GPU
    work takes at the speed it has now."""
    slow = {"on": False}
    gpu_us = lambda call: GPU_US[call.op] * (4 if slow["on"] else 1)  # noqa: E731
    vt, ex, cpu, gpu = virtual_machine(lambda call: CPU_US[call.op], gpu_us, reprobe_interval=0,
                                       telemetry_path=str(tmp_path / "events.jsonl"))
    with ex, vt.executor_clock(ex):
        _learn(vt, ex, x)
        slow["on"] = True
        t0 = vt.ns
        with virtual_batch(vt, ex) as b:
            for _ in range(12):
                ex.submit("softmax", ex.submit("scale", x, 2.0))
        got = b.results()
        us = (vt.ns - t0) * 1e-3
        want = []
        vt.run([lambda: want.append(ex.softmax(ex.scale(x, 2.0, backend="cpu"), backend="cpu"))])
    planned_gpu = [p for p in b.plan if p[2] == "gpu"]
    pinned = sum(4 * (end - start) for _, _, _, start, end in planned_gpu)
    events = [json.loads(line) for line in open(tmp_path / "events.jsonl")]
    taken = [e for e in events if e.get("phase") == "batch" and e["tags"].get("taken_from") == "gpu"]
    assert taken and all(e["backend"] == "cpu" for e in taken)
    assert us < 0.8 * pinned, (us, pinned)
    assert all(np.array_equal(g, want[0]) for g in got[1::2])


def test_a_cancelled_predecessor_fails_its_dependants_in_the_plan(x):
    vt, ex, cpu, gpu = _machine()
    with ex, vt.executor_clock(ex):
        _learn(vt, ex, x)
        with virtual_batch(vt, ex) as b:
            a, bb, c, d = _diamond_calls(ex, x)
            assert a.cancel()
        runs = cpu.runs + gpu.runs
        for f in (bb, c, d):
            assert f.exception() is not None
        assert cpu.runs + gpu.runs == runs
    assert len(b.plan) == 4   # planned as a graph, then not run
    with pytest.raises(SubmittedCallError, match=r"softmax: its input argument 0 was cancelled"):
        bb.result()
    with pytest.raises(SubmittedCallError, match=r"gelu: its input argument 0 was cancelled"):
        c.result()
    with pytest.raises(SubmittedCallError, match=r"add: its input argument 0 failed: SubmittedCallError: softmax"):
        d.result()


def test_a_failed_predecessor_fails_its_dependants_in_the_plan(x):
    """A call that fails as it runs (the CPU side raises for it) fails its dependants, naming the op and
    the argument; the rest of the graph runs."""
    boom = {"n": 0}

    def cpu_us(call):
        if call.op == "gelu" and boom["n"]:
            raise RuntimeError("the CPU side failed")
        return CPU_US[call.op]
    vt, ex, cpu, gpu = _machine(cpu_us={k: v for k, v in CPU_US.items()})
    cpu.side.us = cpu_us
    with ex, vt.executor_clock(ex):
        _learn(vt, ex, x)
        boom["n"] = 1
        with virtual_batch(vt, ex) as b:
            a, s, g, d = _diamond_calls(ex, x)
            other = ex.submit("scale", s, 3.0)
        assert [p[2] for p in b.plan if p[1] == "gelu"] == ["cpu"]
        with pytest.raises(RuntimeError, match="the CPU side failed"):
            g.result()
        with pytest.raises(SubmittedCallError, match=r"add: its input argument 1 failed: RuntimeError: the CPU side"):
            d.result()
        assert other.exception() is None and a.exception() is None and s.exception() is None


def _sleeping(scale=5):
    cpu = SleepingCpu(lambda call: CPU_US[call.op] * scale)
    gpu = SleepingGpu(lambda call: GPU_US[call.op] * scale)
    ex = Executor(gpu_backend=gpu, cpu_backend=cpu, persist_model=False, reprobe_interval=0, split=False,
                  telemetry_path=None)
    return ex, cpu, gpu


def _learn_sleeping(ex, x):
    for _ in range(8):
        for be in ("cpu", "gpu"):
            a = ex.scale(x, 2.0, backend=be)
            ex.add(ex.softmax(a, backend=be), ex.gelu(a, backend=be), backend=be)


def test_the_dependants_of_an_op_that_declares_no_result_are_decided_when_it_is_done(x, monkeypatch):
    """(On the sleeping machine: a call decided by the backlog rule runs on a submission thread, which
    the virtual machine does not conduct.)"""
    monkeypatch.setattr(OPS["softmax"], "result", None)
    ex, cpu, gpu = _sleeping(scale=1)
    with ex:
        _learn_sleeping(ex, x)
        with ex.batch() as b:
            _diamond_calls(ex, x)
        got = b.results(timeout=60)
        want = _diamond_sync(ex, x)
    # add takes softmax's result: not planned ahead (the backlog rule decides it when softmax is done)
    assert sorted(p[1] for p in b.plan) == ["gelu", "scale", "softmax"]
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_a_graph_on_real_threads_waits_for_its_inputs(x):
    """The sleeping machine: each side's thread runs its planned calls, waiting (on the batch's
    condition) for the inputs the other side makes; the results are the calls that wait."""
    ex, cpu, gpu = _sleeping()
    with ex:
        _learn_sleeping(ex, x)
        with ex.batch() as b:
            for _ in range(4):
                _diamond_calls(ex, x)
        got = b.results(timeout=60)
        want = _diamond_sync(ex, x)
    assert len(b.plan) == 16 and {p[2] for p in b.plan} == {"cpu", "gpu"}
    for k, g in enumerate(got):
        assert np.array_equal(g, want[k % 4])


def test_heft_counts_the_copy_between_sides():
    """a -> b: b is 10 on the CPU and 8 on the GPU, a 10 on the CPU only. Without copies b goes to the
    GPU (ends at 18); with a copy of 5 across, staying on the CPU (20) beats the GPU (23)."""
    costs = {0: (10.0, None), 1: (10.0, 8.0)}
    preds, succs = {0: [], 1: [0]}, {0: [1], 1: []}
    plan, free = heft(costs, preds, succs)
    assert plan == [(0, "cpu", 0.0, 10.0), (1, "gpu", 10.0, 18.0)]
    plan, free = heft(costs, preds, succs, copy_us=lambda p, ps, n, s: 5.0)
    assert plan == [(0, "cpu", 0.0, 10.0), (1, "cpu", 10.0, 20.0)]
    assert free == {"cpu": 20.0, "gpu": 0.0}


def test_heft_takes_the_longest_remaining_path_first():
    """Two chains submitted short one first, 0 -> 1 (1 each) and 2 -> 3 -> 4 (4 each), on a CPU alone:
    the long chain's calls have the higher ranks (12, 8, 4 against 2, 1), so they run first."""
    costs = {0: (1.0, None), 1: (1.0, None), 2: (4.0, None), 3: (4.0, None), 4: (4.0, None)}
    preds = {0: [], 1: [0], 2: [], 3: [2], 4: [3]}
    succs = {0: [1], 1: [], 2: [3], 3: [4], 4: []}
    plan, free = heft(costs, preds, succs)
    assert [n for n, *_ in plan] == [2, 3, 4, 0, 1]
    assert free == {"cpu": 14.0, "gpu": 0.0}


def test_heft_fills_a_sides_idle_time():
    """HEFT's insertion: 0 (CPU only, 4) -> 1 (GPU only, 1); 2 (GPU only, 0.5) has the lowest rank, so
    it is placed after 1, but it fits in the GPU's idle time before 1 starts at 4."""
    costs = {0: (4.0, None), 1: (None, 1.0), 2: (None, 0.5)}
    preds, succs = {0: [], 1: [0], 2: []}, {0: [1], 1: [], 2: []}
    plan, free = heft(costs, preds, succs)
    assert plan == [(2, "gpu", 0.0, 0.5), (0, "cpu", 0.0, 4.0), (1, "gpu", 4.0, 5.0)]


def test_many_chains_are_held_to_their_fluid_sides():
    """60 chains a -> b -> c on a GPU 0.5x on a and c and 1x on b: earliest finish alone lets the GPU take
    a's and c's whenever it is idle first (over 1.1x the fluid bound); holding them to the CPU, where
    the fluid split puts them, with only the b's free (the split cuts one of them), ends within 2%."""
    costs, preds, succs = {}, {}, {}
    for k in range(60):
        a, b, c = 3 * k, 3 * k + 1, 3 * k + 2
        costs.update({a: (800.0, 1600.0), b: (1800.0, 1800.0), c: (800.0, 1600.0)})
        preds.update({a: [], b: [a], c: [b]})
        succs.update({a: [b], b: [c], c: []})
    bound = (60 * 1600 + 60 * 1800) / 2    # the CPU takes the a's and c's (96 ms) and 6 ms of b's
    free_plan = heft(costs, preds, succs)
    assert max(free_plan[1].values()) > 1.1 * bound
    held = fluid_sides(costs)
    assert {held[3 * k] for k in range(60)} == {"cpu"} and not any(3 * k + 1 in held for k in range(60))
    plan, free = plan_graph(costs, preds, succs)
    assert max(free.values()) <= 1.02 * bound


def test_a_call_asked_for_a_side_that_refuses_it_raises_as_the_call_that_waits():
    """backend="gpu" on a machine without one: the call that waits raises GpuError (no fallback asked
    for). The batch does not plan it on the CPU instead (it did): it runs as asked and raises the same,
    and its dependant fails naming it."""
    from hipsched.errors import GpuError
    x = np.ones((4, 8), np.float32)
    with Executor(persist_model=False, telemetry_path=None, allow_fallback=False) as ex:
        if ex._gpu_present:
            pytest.skip("needs a machine without a GPU")
        with pytest.raises(GpuError):
            ex.scale(x, 2.0, backend="gpu")
        with ex.batch() as b:
            f = ex.submit("scale", x, 2.0, backend="gpu")
            g = ex.submit("scale", f, 2.0, backend="gpu")
        assert b.plan == []
        assert isinstance(f.exception(timeout=30), GpuError)
        assert isinstance(g.exception(timeout=30), SubmittedCallError)


def test_a_batch_call_has_no_result_inside_its_block_and_a_batch_is_entered_once(x):
    """Inside the block nothing has started: waiting for a call there would wait forever, so it raises;
    after the block the same call gives its result. A second block would plan the calls again."""
    from hipsched.errors import HipschedError
    with Executor(persist_model=False, telemetry_path=None) as ex:
        b = ex.batch()
        with b:
            f = ex.submit("scale", x, 2.0)
            with pytest.raises(HipschedError, match="inside its"):
                f.result(timeout=1)
            with pytest.raises(HipschedError, match="inside its"):
                f.exception(timeout=1)
        np.testing.assert_array_equal(f.result(timeout=30), ex.scale(x, 2.0))
        with pytest.raises(HipschedError, match="entered once"):
            with b:
                pass


def test_a_side_whose_worker_fails_fails_the_calls_left_instead_of_leaving_them_waiting(x, monkeypatch):
    """The workers' own failure (not a call's: those go to the call's Future) fails every call still
    queued with its error: before, the worker died and b.results() waited forever."""
    import hipsched.batch as batch_mod
    picks = {"n": 0}
    real = batch_mod._PlanRun._pick

    def failing(self, side):
        picks["n"] += 1
        if picks["n"] == 3:
            raise MemoryError("injected")
        return real(self, side)
    monkeypatch.setattr(batch_mod._PlanRun, "_pick", failing)
    with Executor(persist_model=False, telemetry_path=None) as ex:
        with ex.batch() as b:
            f = x
            for _ in range(6):
                f = ex.submit("scale", f, 1.0)
        errors = [c.future.exception(timeout=30) for c in b.calls]
    assert any(isinstance(e, MemoryError) for e in errors)
    assert all(e is None or isinstance(e, (MemoryError, SubmittedCallError)) for e in errors)


def test_a_batch_held_across_an_await_takes_only_its_own_tasks_calls_and_b_submit_from_anywhere(x):
    """Two asyncio tasks on one thread: the first holds a batch open across an await, the second submits
    meanwhile and awaits its result. The second's call is its own (it used to join the open batch, and
    its await then waited for the block to end); a call b.submit makes on another thread joins the batch."""
    import asyncio
    import threading
    with Executor(persist_model=False, telemetry_path=None) as ex:
        box = {}

        async def holder(opened, other_done):
            with ex.batch() as b:
                box["mine"] = ex.submit("scale", x, 2.0)
                t = threading.Thread(target=lambda: box.__setitem__("theirs", b.submit("scale", x, 3.0)))
                t.start()
                t.join()
                opened.set()
                await other_done.wait()
            box["b"] = b

        async def other(opened, other_done):
            await opened.wait()
            box["other"] = await asyncio.wait_for(asyncio.wrap_future(ex.submit("scale", x, 4.0)), 30)
            other_done.set()

        async def main():
            opened, other_done = asyncio.Event(), asyncio.Event()
            await asyncio.gather(holder(opened, other_done), other(opened, other_done))
        asyncio.run(main())
        b = box["b"]
        assert [c.future for c in b.calls] == [box["mine"], box["theirs"]]
        np.testing.assert_array_equal(box["other"], x * np.float32(4.0))
        np.testing.assert_array_equal(box["theirs"].result(timeout=30), x * np.float32(3.0))
