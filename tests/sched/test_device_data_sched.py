"""Device data in the scheduler (issue 19, item 3): the decision core charges the copies of device data
to the CPU, keeps device data on the GPU while the model is cold, and learns a device-data GPU run's
time after the fact (SchedCore.learn); then the Executor end to end on a fake GPU that queues its work
and completes it later, with an H100's latencies (tests/support/fake_gpu.py)."""
import collections

import numpy as np
import pytest

import gpu_emulator
from fake_gpu import H100_ADD_1M_KERNEL_US, H100_LAUNCH_US, H100_TRANSFER, FakeGpuBackend
from hipsched import Executor, _sched
from hipsched.scheduling import REASONS, SelectionReason as R

ALL = _sched.F_GPU_PRESENT | _sched.F_GPU_SUPPORTS | _sched.F_FITS
DEV = ALL | _sched.F_ON_DEVICE
N = 1 << 20
UP, DOWN = 4 * N, 8 * N          # a 1M-element add on device data: two inputs down, one result up


def decide(c, slot, size, flags, h2d=0, d2h=0):
    be, r, pc, pg = c.decide(slot, size, h2d, d2h, flags, True)
    return ("cpu", "gpu")[be], REASONS[r], pc, pg


def h100_core(**kw):
    c = _sched.SchedCore(**kw)
    c.set_transfer(**H100_TRANSFER)
    return c


def copies_us(up=UP, down=DOWN):
    t = H100_TRANSFER
    return (t["h2d_latency_us"] + up / (t["h2d_gbps"] * 1e3)) + (t["d2h_latency_us"] + down / (t["d2h_gbps"] * 1e3))


def test_device_data_charges_the_copies_to_the_cpu():
    c = h100_core()
    s = c.slot("add", "float32")
    for _ in range(3):
        c.record(s, 0, N, 300.0)
        c.record(s, 1, N, 180.0)
    # host data: the GPU pays the upload and the download
    _, _, pc, pg = decide(c, s, N, ALL, h2d=DOWN, d2h=UP)
    assert pc == pytest.approx(300.0) and pg == pytest.approx(180.0 + copies_us(up=DOWN, down=UP))
    # device data: the CPU pays them (inputs down, result up), the GPU nothing
    be, r, pc, pg = decide(c, s, N, DEV, h2d=UP, d2h=DOWN)
    assert pc == pytest.approx(300.0 + copies_us()) and pg == pytest.approx(180.0)
    assert (be, r) == ("gpu", R.COST_MODEL)


def test_a_cpu_run_of_device_data_is_learned_without_its_copies():
    c = h100_core()
    s = c.slot("add", "float32")
    c.record(s, 0, N, 300.0 + copies_us(), UP, DOWN)
    assert c.predict(s, 0, N) == pytest.approx(300.0)


@pytest.mark.parametrize("have", ["nothing", "cpu only"])
def test_a_cold_model_keeps_device_data_on_the_gpu(have):
    c = h100_core(exploration_share=0.0)
    s = c.slot("add", "float32")
    if have == "cpu only":
        for _ in range(3):
            c.record(s, 0, N, 300.0)
    assert decide(c, s, N, DEV, h2d=UP, d2h=DOWN)[:2] == ("gpu", R.COST_MODEL)
    # host data keeps the rule it had: a side without an estimate loses, with neither the CPU runs
    assert decide(c, s, N, ALL)[:2] == ("cpu", R.COST_MODEL)


def test_the_cpu_is_not_explored_for_device_data_the_gpu_beats_even_by_the_copies():
    """A CPU run of 1M-element device data costs at least its copies (~1.07 ms on the H100's link), more
    than the GPU takes whole: learning the CPU's time could not change a decision."""
    c = h100_core()
    s = c.slot("add", "float32")
    for _ in range(3):
        c.record(s, 1, N, 180.0)
    picks = collections.Counter(decide(c, s, N, DEV, h2d=UP, d2h=DOWN)[:2] for _ in range(50))
    assert picks == {("gpu", R.COST_MODEL): 50}
    # small device data, whose copies are cheap: the CPU is explored as before (1 call in 5)
    for _ in range(3):
        c.record(s, 1, 4096, 180.0)
    picks = collections.Counter(decide(c, s, 4096, DEV, h2d=16384, d2h=32768)[:2] for _ in range(50))
    assert picks[("cpu", R.EXPLORING)] > 0


def test_a_first_slow_gpu_sample_does_not_send_device_data_to_the_cpu():
    """On the H100 a cold 40-call pipeline of torch adds (1M elements) sent its second call down to the
    CPU and back: the first GPU run, holding the first use's costs, was learned slower than the copies,
    and the rule that tries a never-measured side on a bucket's first calls took the CPU. Device data
    stays on the GPU until the CPU is known to be worth its copies."""
    c = h100_core()
    s = c.slot("add", "float32")
    c.learn(s, 1, N, 5 * copies_us())                     # the first run: slower than the copies
    picks = collections.Counter(decide(c, s, N, DEV, h2d=UP, d2h=DOWN)[:2] for _ in range(3))
    assert picks == {("gpu", R.COST_MODEL): 3}
    # host data still tries the side it never measured on a bucket's first calls
    h = h100_core()
    hs_ = h.slot("add", "float32")
    h.record(hs_, 1, N, 400.0)
    assert decide(h, hs_, N, ALL)[:2] == ("cpu", R.EXPLORING)


def test_learn_adds_a_sample_without_counting_a_run_or_health():
    c = h100_core()
    s = c.slot("add", "float32")
    c.record(s, 1, N, -1.0)                 # the run itself: counted, not learned
    assert c.buckets(s, 1) == [] and c.counters()["gpu_operations"] == 1
    c.learn(s, 1, N, 175.0)
    c.learn(s, 1, N, float("nan"))          # not a completion time: ignored
    assert [b[1] for b in c.buckets(s, 1)] == [1] and c.predict(s, 1, N) == pytest.approx(175.0)
    assert c.counters()["gpu_operations"] == 1 and c.health("add")["successes"] == 1
    with pytest.raises(IndexError):
        c.learn(99, 1, N, 1.0)


# ---------------------------------------------------------------- the Executor on a fake H100

needs_emulator = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


@pytest.fixture
def emu():
    rt = gpu_emulator.EmuRuntime(32, asynchronous=True, delay=0.0)   # a driver that queues
    yield rt
    rt.close()


# The fake device computes its results for real, on this machine's cores, beside the host thread it
# is timed against (and its streams are Python threads sharing the GIL): a 1M-element add there costs
# milliseconds, and the host time of a launch comes out at 0.3 to 1 ms instead of the H100's 0.17. So
# the pipeline runs 64K elements over a link 64 times slower than the H100's, which the decision sees
# as the H100's figures for a 4M-element add: copies ~4.2 ms, launch 168 us, kernel ~40 us.
ELEMENTS = 1 << 16
SCALE = 64
SLOW_LINK = {k: v / SCALE if k.endswith("gbps") else v for k, v in H100_TRANSFER.items()}


def fake_h100(rt, launch_us=H100_LAUNCH_US):
    return FakeGpuBackend(ops=("add",), runtime=rt, transfer=SLOW_LINK, cost_us=lambda call: launch_us,
                          device_us=lambda call: H100_ADD_1M_KERNEL_US * call.size * SCALE / N)


@needs_emulator
def test_a_device_pipeline_runs_on_the_gpu_from_a_cold_model(emu, tmp_path):
    """The H100 run that found the issue: 40 adds of two 1M-element device arrays, auto, cold model, ran
    32 of them on the CPU (download, add, upload: ~1.4 ms each where the GPU takes ~0.18 ms)."""
    from hipsched.gpu.memory.device_array import DeviceArray, to_device
    rng = np.random.default_rng(19)
    a, b = rng.standard_normal((2, ELEMENTS), dtype=np.float32)
    da, db = to_device(a, runtime=emu), to_device(b, runtime=emu)
    gpu = fake_h100(emu)
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path)) as ex:
        outs = [ex.add(da, db) for _ in range(40)]
        where = collections.Counter(e["backend"] for e in ex.events)
        assert where["gpu"] >= 0.99 * 40, collections.Counter((e["backend"], e["reason"]) for e in ex.events)
        assert all(isinstance(o, DeviceArray) for o in outs)
        np.testing.assert_array_equal(outs[-1].get(), a + b)
        # the GPU side was learned from the runs' events, not left unknown
        emu.synchronize()
        ex.add(da, db)
        learned = ex.performance_tracker.samples("add", "gpu")
        assert learned and learned[0][1] >= 30
        assert H100_LAUNCH_US <= learned[0][3] < copies_us(4 * N, 8 * N)   # the host launch time
        assert ex.select_backend("add", args=(da, db)).backend_id == "gpu"


@needs_emulator
def test_device_data_the_gpu_is_slow_for_moves_to_the_cpu(emu, tmp_path):
    """Device data does not stay on the GPU whatever it costs: with a launch path of 20 ms the GPU's
    learned time loses to the CPU's (copies included) and the calls move there."""
    from hipsched.gpu.memory.device_array import DeviceArray, to_device
    a = np.arange(4096, dtype=np.float32)
    da = to_device(a, runtime=emu)
    gpu = fake_h100(emu, launch_us=20_000.0)
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path)) as ex:
        outs = [ex.add(da, da) for _ in range(30)]
        last = [e["backend"] for e in ex.events[-10:]]
        assert last.count("cpu") >= 8, [(e["backend"], e["reason"]) for e in ex.events]
        assert ex.events[0]["backend"] == "gpu"   # cold: where the data is
        assert all(isinstance(o, DeviceArray) for o in outs)
        np.testing.assert_array_equal(outs[-1].get(), a + a)
