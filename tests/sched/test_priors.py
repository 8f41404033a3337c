"""The roofline prior (hipsched/priors.py): what each op should cost on each side before anything of it
was measured, from the op's declared bytes and flops per unit of work and each side's figures."""
import numpy as np
import pytest

import hipsched as hs
from hipsched import Executor, priors
from hipsched.ops import OPS
from sim_gpu import SimClock, simulated_machine


def test_priors_follow_the_roofline_of_each_sides_figures():
    cpu = {"launch_us": 3.0, "gbps": 100.0, "gflops": 500.0}
    gpu = {"launch_us": 150.0, "gbps": 3000.0, "gflops": 50000.0}
    p = priors.op_priors(cpu, gpu)
    nbytes, flops = OPS["add"].cost
    assert p["add"]["cpu"] == pytest.approx((3.0, nbytes / 100e3 + flops / 500e3))
    assert p["add"]["gpu"] == pytest.approx((150.0, nbytes / 3000e3 + flops / 50000e3))
    assert set(p) == {name for name, spec in OPS.items() if spec.cost is not None}
    assert priors.op_priors(cpu, None) == {op: {"cpu": v["cpu"]} for op, v in p.items()}
    assert priors.op_priors(cpu, {"launch_us": 1.0, "gbps": None, "gflops": 1.0}) == \
        {op: {"cpu": v["cpu"]} for op, v in p.items()}


def test_the_cpu_is_measured_in_a_few_milliseconds():
    m = priors.measure_cpu()
    assert m["launch_us"] > 0 and m["gbps"] > 0 and m["gflops"] > 0


def test_qmatmul_first_calls_are_not_sent_to_the_cpu_blind(tmp_path):
    """The quick cold demo on the H100 ran qmatmul's first calls on the CPU with nothing measured on
    either side (3.1 ms of its 6.9 ms regret). With the prior, the first call of a large q8_0 matmul
    goes where the roofline says it is faster: the GPU (the simulated H100: 2.1 ms on the CPU, 0.33 ms
    on the GPU at this size)."""
    clock = SimClock()
    rng = np.random.default_rng(0)
    w = hs.quantize(rng.standard_normal((4096, 1024), dtype=np.float32), "q8_0")
    x = rng.standard_normal((1024, 64), dtype=np.float32)
    with clock.executor_clock(), Executor(cache_dir=str(tmp_path), persist_model=False, telemetry_ring_size=8,
                                          **simulated_machine(clock, sigma=0)) as ex:
        ex.qmatmul(w, x)
        assert ex.events[-1]["backend"] == "gpu", ex.events[-1]
        # the prior gave both sides an estimate: a cost-model decision, not an exploration of the unknown
        assert ex.events[-1]["predicted_us"]["cpu"] > ex.events[-1]["predicted_us"]["gpu"] > 0
    # a small one stays on the CPU: a GPU call's fixed cost is more than the whole CPU run
    xs = rng.standard_normal((1024, 1), dtype=np.float32)
    ws = hs.quantize(rng.standard_normal((64, 1024), dtype=np.float32), "q8_0")
    with clock.executor_clock(), Executor(cache_dir=str(tmp_path), persist_model=False, telemetry_ring_size=8,
                                          **simulated_machine(clock, sigma=0)) as ex:
        ex.qmatmul(ws, xs)
        assert ex.events[-1]["backend"] == "cpu", ex.events[-1]
