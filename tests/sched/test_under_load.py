"""Decisions under load: each side's work in flight (SchedCore's Load) moves a call to the side where it
finishes first, one caller alone is decided as before, and a run that shared its side is learned as
what it would have taken alone. The core is driven with scripted times and holds made on purpose, so
the schedule is exact; the Executor's threads are checked with a fake GPU in tests/sched/test_submit.py."""
import threading
import time

import numpy as np
import pytest

import hipsched as hs
from hipsched import _sched
from hipsched.scheduling import REASONS, SelectionReason as R

ALL = _sched.F_GPU_PRESENT | _sched.F_GPU_SUPPORTS | _sched.F_FITS
CPU, GPU = _sched.BACKEND_CPU, _sched.BACKEND_GPU
N = 1 << 20


def measured(cpu_us=5600.0, gpu_us=3700.0, samples=8):
    """A core whose top_k at size N is measured on both sides, the issue's machine: the GPU faster."""
    c = _sched.SchedCore(reprobe_interval=0)
    c.set_transfer(0.0, 1e6, 0.0, 1e6)
    # time stands still: a hold drains as the clock runs, and between a hold made on another thread and
    # the decision after it a loaded machine let milliseconds pass (the 3.7 ms GPU queue below was
    # seen drained past the CPU's time once, with two other processes on two cores)
    c.set_clock(10**12)
    s = c.slot("top_k", "float32")
    for _ in range(samples):
        c.record(s, CPU, N, cpu_us)
        c.record(s, GPU, N, gpu_us)
    return c, s


def side(c, s, flags=ALL):
    be, r, pc, pg = c.decide(s, N, 0, 0, flags, False)
    return ("cpu", "gpu")[be], REASONS[r]


def held_elsewhere(c, holds):
    """Commits `holds` [(side, predicted us)] from another thread, as its calls in flight would."""
    done = threading.Event()

    def hold():
        for be, us in holds:
            c.hold(be, us)
        done.set()
    t = threading.Thread(target=hold)
    t.start()
    t.join()
    assert done.is_set()


def test_alone_the_faster_side_takes_the_call():
    c, s = measured()
    assert side(c, s) == ("gpu", R.COST_MODEL)
    assert c.backlog() == (0.0, 0.0)


def test_a_busy_gpu_sends_the_next_call_to_the_idle_cpu():
    c, s = measured()
    held_elsewhere(c, [(GPU, 3700.0)])          # another thread's call runs on the GPU
    # GPU: 3.7 ms queued + 3.7 ms; CPU: 5.6 ms
    assert side(c, s) == ("cpu", R.COST_MODEL)
    cpu_bl, gpu_bl = c.backlog()
    assert cpu_bl == 0.0 and 3000.0 < gpu_bl <= 3700.0


def test_work_on_both_sides_is_compared_as_finishing_times():
    c, s = measured()
    held_elsewhere(c, [(GPU, 3700.0), (CPU, 5600.0)])
    # GPU finishes at 7.4 ms, the CPU at 11.2 ms (and the CPU's call running there 5.6 ms later): the
    # GPU, although it has work too
    assert side(c, s) == ("gpu", R.COST_MODEL)
    held_elsewhere(c, [(GPU, 3700.0)] * 4)
    # GPU at 22.2 ms against the CPU's 11.2 + 5.6
    assert side(c, s) == ("cpu", R.COST_MODEL)


def test_a_call_on_the_shared_cpu_counts_the_time_it_costs_the_calls_there():
    """The CPU's calls share its cores: a call sent there ends when its own time says, but the call
    already running there ends later by as much as the two overlap. Finishing times alone choose the
    CPU here (7.6 ms against 8.7); with the 2 ms the running CPU call loses, the GPU's queue wins."""
    c, s = measured()
    held_elsewhere(c, [(CPU, 2000.0), (GPU, 5000.0)])
    assert side(c, s) == ("gpu", R.COST_MODEL)   # CPU 2.0 + 5.6 + 2.0 against GPU 5.0 + 3.7
    c2, s2 = measured()
    held_elsewhere(c2, [(CPU, 500.0), (GPU, 5000.0)])
    assert side(c2, s2) == ("cpu", R.COST_MODEL)   # 0.5 + 5.6 + 0.5 against 8.7: still the CPU


def test_a_call_queued_on_the_gpu_counts_the_wait_of_the_caller_ahead():
    """A GPU 2.15x the CPU's speed (2.6 ms against 5.6) running another caller's call: this one would
    end sooner queued there (5.2 ms) than on the idle CPU, but that caller calls again when its call
    ends, and its next call would then wait behind this one, 2.6 ms, or lose 3.0 ms going to the CPU.
    Counting the wait: the CPU (by the end alone, two callers took turns on the GPU while the CPU idled:
    bench/concurrency.py's two-caller softmax row, 0.70 of both sides' throughput). A what-if question
    learns nothing, so its answer is still the end alone."""
    c, s = measured(gpu_us=2600.0)
    held_elsewhere(c, [(GPU, 2600.0)])
    assert side(c, s) == ("gpu", R.COST_MODEL)                                # 2.6 + 2.6 < 5.6
    be, r, pc, pg = c.decide(s, N, 0, 0, ALL, True)
    assert (be, REASONS[r]) == (CPU, R.COST_MODEL)          # 5.6 < 2.6 + 2.6 + 2.6


def test_the_wait_counted_is_what_the_next_call_would_lose_by_moving():
    """Which op the caller ahead calls next is not known: what a call would lose by leaving the GPU is
    the mean over the calls decided while it was busy. After nine calls of an op as fast on either side
    (they lose nothing by moving), the same top_k as above loses 3.0 / 10 on average, and 2.6 + 2.6 +
    0.3 ms on the GPU beats the CPU's 5.6 (counting the top_k's own 3.0 instead sent it to the CPU while
    the other caller's next call, of an op either side runs as fast, had no need to wait)."""
    c, s = measured(gpu_us=2600.0)
    even = c.slot("softmax", "float32")
    for _ in range(8):
        c.record(even, CPU, N, 2600.0)
        c.record(even, GPU, N, 2600.0)
    held_elsewhere(c, [(GPU, 2600.0)])
    for _ in range(9):
        c.decide(even, N, 0, 0, ALL, True)
    be, r, pc, pg = c.decide(s, N, 0, 0, ALL, True)
    assert (be, REASONS[r]) == (GPU, R.COST_MODEL)


def test_the_backlog_drains_with_the_clock():
    c, s = measured(cpu_us=50_000.0, gpu_us=20_000.0)
    held_elsewhere(c, [(GPU, 40_000.0)])
    assert side(c, s) == ("cpu", R.COST_MODEL)   # 60 ms against 50 ms
    c.set_clock(10**12 + 30_000_000)             # 30 ms of the GPU's 40 spent: 10 left
    assert side(c, s) == ("gpu", R.COST_MODEL)
    assert c.backlog()[1] == pytest.approx(10_000.0)


def test_a_record_ends_the_threads_hold_and_learns_its_time_alone():
    c, s = measured()
    c.hold(GPU, 3700.0)
    assert c.backlog()[1] > 0
    c.record(s, GPU, N, 3700.0)
    assert c.backlog() == (0.0, 0.0)
    c.hold(CPU, 100.0)
    c.release()
    assert c.backlog() == (0.0, 0.0)


def test_the_next_call_in_a_queue_starts_when_the_one_before_it_ends():
    """Two 3 ms calls queued on the GPU; the first ends 0.5 ms late, at 3.5 ms: the second starts then,
    so 3 ms are left, not the 2.5 ms a count from when the GPU went busy gives (under steady load that
    count ate every call's prediction with the overruns before it, and the backlog fell to 0)."""
    c, s = measured()
    c.hold(GPU, 3000.0)
    c.hold(GPU, 3000.0)
    c.set_clock(10**12 + 3_500_000)
    c.record(s, GPU, N, 3500.0)
    assert c.backlog()[1] == pytest.approx(3000.0)
    c.release()


def test_device_inputs_wait_for_the_gpu_queue_on_either_side():
    c, s = measured(cpu_us=5600.0, gpu_us=3700.0)
    held_elsewhere(c, [(GPU, 50_000.0)])
    # a CPU run of device data copies them after the GPU's queue ends: no better than the GPU
    assert side(c, s, ALL | _sched.F_ON_DEVICE) == ("gpu", R.COST_MODEL)
    assert side(c, s) == ("cpu", R.COST_MODEL)


def test_a_run_that_shared_its_side_is_learned_as_its_time_alone():
    # four calls share the CPU for 4 x 1 ms: each took 4 ms of wall time, and is learned as 1 ms
    c = _sched.SchedCore(reprobe_interval=0)
    s = c.slot("top_k", "float32")
    barrier = threading.Barrier(4)
    held = threading.Barrier(4)

    def call():
        barrier.wait()
        c.hold(CPU, 1000.0)
        held.wait()             # all four in flight before any ends
        time.sleep(0.02)
        c.record(s, CPU, N, 20_000.0)
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    learned = c.predict(s, CPU, N)
    # the four overlapped for nearly all of their 20 ms: each is learned near 5 ms, far below 20
    assert 3000.0 < learned < 10_000.0, learned
    assert c.backlog() == (0.0, 0.0)


@pytest.mark.parametrize("threads", [2, 4])
def test_concurrent_deciders_spread_over_both_sides(threads):
    """Callers that decide at once (each holding its call until all have decided) do not all take the
    faster side: the schedule is the earliest-finish one."""
    c, s = measured()
    barrier = threading.Barrier(threads)
    picks = []
    lock = threading.Lock()

    def caller(i):
        barrier.wait()
        with lock:              # one at a time, in a fixed order, so the expected schedule is exact
            be, r, pc, pg = c.decide(s, N, 0, 0, ALL, True)
            c.hold(be, pc if be == CPU else pg)
            picks.append(be)
        barrier.wait()          # every call in flight at once
        c.release()
    ts = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # GPU (finishes at 3.7 ms), CPU (5.6 < 7.4), GPU (7.4 < 11.2), GPU (11.1 < 11.2)
    assert picks == [GPU, CPU, GPU, GPU][:threads], picks


# ---------------------------------------------------------------------------- the Executor, in virtual time
# tests/support/virtual_machine.py: each side a timeline running one call at a time, the executor's real
# decision code on the virtual clock, one caller running at a time: the schedule is exact.

def _vm_args():
    import numpy as np
    rng = np.random.default_rng(5)
    return rng.standard_normal(16, dtype=np.float32), rng.standard_normal((256, 16), dtype=np.float32)


def _callers(vt, ex, q, T, threads, calls, backend="auto"):
    return vt.run([lambda: [ex.top_k(q, T, 5, backend=backend) for _ in range(calls)] for _ in range(threads)])


@pytest.mark.parametrize("threads", [2, 4, 8, 16])
def test_callers_in_virtual_time_finish_near_both_sides_together(threads):
    from virtual_machine import virtual_machine
    q, T = _vm_args()
    vt, ex, cpu, gpu = virtual_machine(lambda call: 5600.0, lambda call: 3700.0, reprobe_interval=0)
    with ex, vt.executor_clock(ex):
        _callers(vt, ex, q, T, 1, 12)             # one caller learns both sides
        c0, g0 = cpu.side.runs, gpu.side.runs
        ns = _callers(vt, ex, q, T, threads, 160 // threads)
    on_cpu, on_gpu = cpu.side.runs - c0, gpu.side.runs - g0
    assert on_cpu + on_gpu == 160
    both = 160 / (1 / 5600 + 1 / 3700) * 1e3     # both sides busy at their own speed, ns
    # before the backlog counted (the same machine, the same code otherwise): 0.62 to 0.72 of `both`
    assert both / ns >= 0.88, (threads, on_cpu, ns)
    assert 0.25 <= on_cpu / 160 <= 0.45


def test_one_caller_in_virtual_time_is_the_faster_side_alone():
    from virtual_machine import virtual_machine
    q, T = _vm_args()
    vt, ex, cpu, gpu = virtual_machine(lambda call: 5600.0, lambda call: 3700.0, reprobe_interval=0)
    with ex, vt.executor_clock(ex):
        _callers(vt, ex, q, T, 1, 12)
        c0 = cpu.side.runs
        ns = _callers(vt, ex, q, T, 1, 100)
    assert cpu.side.runs == c0 and ns == 100 * 3_700_000


def test_a_tie_goes_to_the_idle_side():
    """Two callers, a GPU exactly twice as fast: a second GPU call would end with a CPU run (2 x 2.8 =
    5.6 ms); the tie goes to the idle CPU, and while both call, one keeps the GPU and the other the
    CPU. The first caller's 30 calls end at 84 ms, the second's 15 CPU calls with them; its other 15
    run alone, on the GPU (a decision that sent ties to the GPU kept the CPU idle: 168 ms)."""
    from virtual_machine import virtual_machine
    q, T = _vm_args()
    vt, ex, cpu, gpu = virtual_machine(lambda call: 5600.0, lambda call: 2800.0, reprobe_interval=0)
    with ex, vt.executor_clock(ex):
        _callers(vt, ex, q, T, 1, 12)
        c0, g0 = cpu.side.runs, gpu.side.runs
        ns = _callers(vt, ex, q, T, 2, 30)
    assert (cpu.side.runs - c0, gpu.side.runs - g0) == (15, 45)
    assert ns == 30 * 2_800_000 + 15 * 2_800_000


def test_two_callers_share_the_sides_when_the_gpu_is_over_twice_as_fast():
    """Two callers, a GPU 2.15x the CPU's speed: each call ends sooner queued behind the other's on the
    GPU (at most 2 x 2.6 ms) than on the idle CPU (5.6 ms), so by each call's end alone both callers
    took turns on the GPU, 0.70 of what both sides running deliver (the CPU never used). Counting the
    wait each call makes for the caller ahead, the CPU takes 25 of the 80 calls: 0.99."""
    from virtual_machine import virtual_machine
    q, T = _vm_args()
    vt, ex, cpu, gpu = virtual_machine(lambda call: 5600.0, lambda call: 2600.0, reprobe_interval=0)
    with ex, vt.executor_clock(ex):
        _callers(vt, ex, q, T, 1, 12)
        c0 = cpu.side.runs
        ns = _callers(vt, ex, q, T, 2, 40)
    both = 80 / (1 / 5600 + 1 / 2600) * 1e3
    assert both / ns >= 0.85, (cpu.side.runs - c0, ns)
    assert cpu.side.runs - c0 >= 15


def test_the_common_paths_hold_ends_with_its_record(rng):
    """The compiled common path keeps its call's hold on its own stack: its record ends it, so with the
    clock stopped no work is left on either side after any number of calls (a hold that outlived its
    call would stay as backlog, and send the next calls away from a side that is idle)."""
    a = rng.standard_normal(8).astype(np.float32)
    with hs.Executor(persist_model=False) as ex:
        ex._core.set_clock(10**12)
        for _ in range(20):
            ex.add(a, a)
            assert ex._core.backlog() == (0.0, 0.0) and ex._core.in_flight() == (0, 0)
        assert [e["backend"] for e in ex.events[-20:]] == ["cpu"] * 20


def test_a_backlog_is_as_uncertain_as_the_runs_in_it():
    """The GPU's runs spread 30% about their mean: a call queued there ends anywhere in a wide band, so a
    finish 0.3 ms sooner than the idle CPU's is a tie (which goes to the side with less work waiting),
    where the standard error of 32 runs' means alone (about 0.2 ms) would have called it for the GPU.
    Runs that do not spread leave the same gap a win."""
    for gpu_runs, want in (((2590.0, 4810.0), "cpu"), ((3700.0, 3700.0), "gpu")):
        c = _sched.SchedCore(reprobe_interval=0)
        c.set_transfer(0.0, 1e6, 0.0, 1e6)
        c.set_clock(10**12)   # the held 3 ms must not drain before the decision (measured())
        s = c.slot("top_k", "float32")
        for i in range(32):
            c.record(s, CPU, N, 7000.0)
            c.record(s, GPU, N, gpu_runs[i % 2])
        held_elsewhere(c, [(GPU, 3000.0)])
        # GPU: 3.0 ms queued + 3.7 ms = 6.7 ms; CPU: 7.0 ms
        assert side(c, s) == (want, R.COST_MODEL), gpu_runs
