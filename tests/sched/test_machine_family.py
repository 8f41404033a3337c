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


def test_a_runs_draws_spread_from_its_choice_regret_as_the_bench_reports(routing):
    """bench/routing_family.py --expected-oracle reports observed - choice regret (the run's own draws)
    beside the spread one run's draws have (routing.draw_spread): on h100-measured, calibrated, seed 2 of
    the full workload, 15.5 of 19.4 points of observed regret were one exploring CPU run in the 8x mode,
    and without the spread a reader could not tell a draw from a defect. Here: the moments of a run's
    noise are those of its draws, and over many runs the draws of a fixed schedule spread as reported."""
    import numpy as np
    from sim_machine import RunNoise
    m = Machine(sigma=0.3, tail_share=0.03, tail_factor=3.0, cpu_slow_share=0.1, cpu_slow_factor=8.0,
                cpu_slow_ops=("top_k",))
    sampled, exact = RunNoise(m, 11), RunNoise(m, 11, expected=True)
    for side, op in (("cpu", "top_k"), ("cpu", "add"), ("gpu", "top_k")):
        draws = np.array([sampled.factor(side, op) for _ in range(400_000)])
        assert draws.var() / draws.mean() ** 2 == pytest.approx(exact.relative_variance(side, op), rel=0.05)
    assert RunNoise(Machine(sigma=0.0), 0).relative_variance("cpu", "top_k") == pytest.approx(0.0, abs=1e-12)

    # a schedule: (side chosen, op, expected CPU us, expected GPU us, the GPU's resident time when its
    # price holds a shared upload); the oracle's best side is the faster
    calls = [("cpu", "top_k", 900.0, 1200.0, None), ("gpu", "top_k", 15000.0, 3600.0, 950.0),
             ("cpu", "add", 300.0, 500.0, None), ("gpu", "cosine_similarity", 9000.0, 2000.0, None)] * 5
    per_call, best, chosen = [], 0.0, 0.0
    for side, op, tc, tg, resident in calls:
        g = {"backend": "gpu", "duration_us": tg}
        if resident is not None:
            g["oracle_shared"] = {"input": 1, "upload_us": tg - resident, "resident_us": resident}
        per_call.append(({"backend": side, "op": op}, {"backend": "cpu", "duration_us": tc}, g))
        best += min(tc, tg)
        chosen += tc if side == "cpu" else tg
    rng = np.random.default_rng(5)
    observed = []
    for _ in range(4000):
        noise = RunNoise(m, int(rng.integers(1 << 30)))
        total = 0.0
        for side, op, tc, tg, resident in calls:
            # a GPU run's copies are not noisy: only its resident part is drawn
            fixed = 0.0 if side == "cpu" or resident is None else tg - resident
            t = tc if side == "cpu" else (resident if resident is not None else tg)
            total += fixed + t * noise.factor(side, op) / noise.expectation(side, op)
        observed.append((total - best) / best)
    judgement = {"per_op": [{"per_call": per_call}],
                 "overall": {"best_us": best, "choice_regret": (chosen - best) / best, "regret": observed[0]}}
    draws, sd = routing.draw_spread(judgement, m)
    assert draws == pytest.approx(observed[0] - (chosen - best) / best)
    assert np.mean(observed) == pytest.approx((chosen - best) / best, abs=3 * sd / np.sqrt(len(observed)))
    assert np.std(observed) == pytest.approx(sd, rel=0.08)


def test_the_routing_bench_measures_the_checkout_it_sits_in(tmp_path):
    """`python bench/routing_family.py` puts bench/ on the path, not the checkout: an installed hipsched
    (on the development machine an editable install of another worktree) answered instead, so a
    before/after run in a worktree measured the other tree's scheduler twice."""
    import subprocess
    import sys
    root = os.path.dirname(BENCH)
    code = f"import sys; sys.path[0] = {BENCH!r}; import routing; print(routing.hs.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert os.path.realpath(out.stdout.strip()).startswith(os.path.realpath(root) + os.sep)
