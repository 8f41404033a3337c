"""Routing accuracy and regret of the scheduler on the demo workload, against an oracle.

`hipsched demo --oracle` runs the demo's calls in auto, then each call again forced on the CPU and on
the GPU (a second executor, so the forced runs teach the first nothing); a call's faster side is the
faster forced run (ties within 5%). Accuracy: share of auto calls on their faster side. Regret: (auto
time - oracle-best time) / oracle-best time over all calls; choice regret charges each call the forced
time of the side auto chose (no single-sample noise). Two starting points: an empty model (what a new
user sees first) and a model calibrated by `Executor.calibrate()` just before, in a fresh cache dir.

With a GPU the real one is used; without one (or with --sim) the simulated machine of tests/support/sim_gpu.py:
by default the smooth H100 (the H100's measured latencies, residency, its link, 5% noise), or the one
`--machine FILE` describes (tests/support/sim_machine.py; a family in bench/machines/). On a simulated
machine the judge's tie band is the machine's noise band (Machine.tie_band, at least 5%): a call whose
sides lie within the noise of each other is right either way.
Usage: python bench/routing.py [--quick] [--sim] [--machine FILE] [--seed N] [--repeats N] [--dump DIR]
Writes bench/results/routing.md (routing-quick.md with --quick; with --machine, routing-<name>[-quick].md)."""
import argparse
import contextlib
import glob
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))
import checkout  # noqa: E402,F401  (a checkout built in place is what is measured)
import hipsched as hs  # noqa: E402
from hipsched.cli import demo  # noqa: E402

LINES = []


def out(line=""):
    print(line, flush=True)
    LINES.append(line)


def load_machine(path):
    from sim_machine import Machine
    return Machine.load(path)


def dump_run(directory, start, seed, cache, judgement):
    """Keep what a run leaves for reading later: the demo's telemetry and the model files of its cache
    dir, and one line per judged call holding its auto, forced-CPU and forced-GPU events."""
    os.makedirs(directory, exist_ok=True)
    tag = f"{start}-s{seed}"
    for path in glob.glob(os.path.join(cache, "**", "*.json*"), recursive=True):
        shutil.copy(path, os.path.join(directory, f"{tag}-{os.path.basename(path)}"))
    if judgement is not None:
        with open(os.path.join(directory, f"{tag}-calls.jsonl"), "w") as fh:
            for row in judgement["per_op"]:
                for a, c, g in row.get("per_call", ()):
                    fh.write(json.dumps({"auto": a, "cpu": c, "gpu": g}, default=str) + "\n")


def one_run(start, quick, seed, sim, repeats=3, machine=None, dump=None, expected_oracle=False):
    """(judgement, demo exit status, demo output) of one demo --oracle run from `start` ("cold" or
    "calibrated"), in a fresh cache dir; `machine`: a sim_machine.Machine (sim only); `dump`: a
    directory for dump_run; `expected_oracle` (sim only): the oracle's forced runs take their expected
    times, not sampled ones, so each call is priced exactly (choice regret is then the decisions'
    expected regret, free of the oracle's own draws)."""
    with tempfile.TemporaryDirectory(prefix="hipsched-routing-") as cache:
        clock = contextlib.nullcontext()
        machines = [{}, {}, {}]
        tie_band = demo.TIE_BAND
        if sim:
            from sim_gpu import SimClock, simulated_machine
            c = SimClock()
            clock = c.executor_clock()
            machines = [simulated_machine(c, seed=3 * seed + i, machine=machine, expected=expected_oracle and i == 1)
                        for i in range(3)]
            if machine is not None:
                tie_band = machine.tie_band()
        with clock:
            if start == "calibrated":
                with hs.Executor(cache_dir=cache, telemetry_enabled=False, **machines[2]) as ex:
                    # the H100 run's limit; on the simulated machine calibrate's own timing (wall
                    # clock, results computed by this machine's CPU) means nothing: the whole sweep
                    ex.calibrate(progress=False, max_seconds_per_op=None if sim else 0.5)
            args = argparse.Namespace(log=os.path.join(cache, "demo.jsonl"), quick=quick, seed=seed, no_progress=True,
                                      oracle=True, oracle_repeats=repeats)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc, judgement = demo.run_demo(args, machine=machines[0], oracle_machine=machines[1],
                                              tie_band=tie_band, cache_dir=cache)
            if dump:
                dump_run(dump, start, seed, cache, judgement)
        return judgement, rc, buf.getvalue()


def draw_spread(judgement, machine):
    """(draws, sd) of a run judged against the expected oracle (`one_run(..., expected_oracle=True)`) on
    simulated `machine`: draws = observed regret - choice regret, what the auto run's own noise draws
    added to the expected cost of its choices, and sd = how far that term spreads from run to run (0 in
    expectation: a run's draw does not depend on the choice that sent it to its side). Observed regret is
    the choice regret plus one draw of that term; on the quick workload a single call can be a tenth of
    the run (h100-measured, calibrated, seed 2 of the full workload: one exploring top_k CPU run in the
    8x mode, 95.7 ms against 14.9 expected, was 13.5 of the 15.5 points between 19.4% observed and 3.9%
    choice regret). Each call's variance is its chosen side's noise (RunNoise.relative_variance) times
    its expected time squared; a GPU call's copies are not noisy, so its time is the oracle's resident
    run where the oracle gives one (a shared input), else its whole price (an upper bound)."""
    from sim_machine import RunNoise
    noise = RunNoise(machine, 0, expected=True)
    o = judgement["overall"]
    var = 0.0
    for row in judgement["per_op"]:
        for a, c, g in row.get("per_call", ()):
            if c["backend"] != "cpu" or g["backend"] != "gpu" or g.get("fallback") or a["backend"] == "split":
                continue
            if a["backend"] == "cpu":
                t = c["duration_us"]
            else:
                shared = g.get("oracle_shared")
                t = min(g["duration_us"], shared["resident_us"]) if shared else g["duration_us"]
            var += noise.relative_variance(a["backend"], a["op"]) * t * t
    if not o["best_us"]:
        return None, None
    return o["regret"] - o["choice_regret"], var ** 0.5 / o["best_us"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the demo's --quick sizes")
    ap.add_argument("--sim", action="store_true", help="the simulated H100 even where a GPU is present")
    ap.add_argument("--machine", metavar="FILE", help="a simulated machine's description (bench/machines/*.json); "
                    "implies --sim")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="runs per starting point (seeds seed, seed+1, ...)")
    ap.add_argument("--dump", metavar="DIR", help="keep each run's telemetry, model and per-call events there")
    args = ap.parse_args(argv)
    with hs.Executor(persist_model=False, telemetry_enabled=False) as probe:
        caps = probe.capabilities()
    machine = load_machine(args.machine) if args.machine else None
    sim = args.sim or machine is not None or not caps.gpu_available
    device = "simulated H100 (tests/support/sim_gpu.py)" if sim else caps.gpu_device_name
    if machine is not None:
        device = f"simulated machine {machine.name} ({args.machine}: {machine.description}; tie band " \
                 f"{100 * machine.tie_band():.0f}%)"
    feats = hs.cpu_features()
    out(f"## routing against the oracle: demo{' --quick' if args.quick else ''} workload, GPU: {device}; CPU: "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, simd={feats['simd']}, "
        f"threads={feats['threads']}\n")
    out(f"command: `python bench/routing.py{' --quick' if args.quick else ''}{' --sim' if args.sim else ''}"
        f"{' --machine ' + args.machine if args.machine else ''} --seed {args.seed} --repeats {args.repeats}`\n")
    out("| start | seed | regret | choice regret | accuracy (ties either way) | calls judged | auto ms | oracle-best ms | "
        "cpu-only ms | gpu-only ms | misses by reason | self-checks |")
    out("|---|---|---|---|---|---|---|---|---|---|---|---|")
    per_op = {}
    for start in ("cold", "calibrated"):
        for r in range(args.repeats):
            seed = args.seed + r
            t0 = time.perf_counter()
            res, rc, text = one_run(start, args.quick, seed, sim, machine=machine, dump=args.dump)
            if res is None:
                out(f"| {start} | {seed} | - | - | - | - | - | - | - | - | (no GPU: nothing judged) | "
                    f"{'ok' if rc == 0 else 'FAILED'} |")
                continue
            o = res["overall"]
            misses = ", ".join(f"{k} {v}" for k, v in sorted(o["misses"].items(), key=lambda kv: -kv[1])) or "-"
            out(f"| {start} | {seed} | {100 * o['regret']:.1f}% | {100 * o['choice_regret']:.1f}% | "
                f"{100 * o['accuracy']:.1f}% | {o['judged']} | {o['auto_us'] / 1e3:.1f} | {o['best_us'] / 1e3:.1f} | "
                f"{o['cpu_us'] / 1e3:.1f} | {o['gpu_us'] / 1e3:.1f} | {misses} | {'ok' if rc == 0 else 'FAILED'} |")
            print(f"  ({start}, seed {seed}: {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            for row in res["per_op"]:
                per_op.setdefault((start, row["op"]), []).append(row)
    out("\nper op (all runs of a starting point together):\n")
    out("| start | op | regret | choice regret | accuracy | calls judged | on GPU auto / best |")
    out("|---|---|---|---|---|---|---|")
    for (start, op), rows in per_op.items():
        j = sum(r["judged"] for r in rows)
        if not j:
            continue
        best = sum(r["best_us"] for r in rows)
        out(f"| {start} | {op} | {100 * (sum(r['auto_us'] for r in rows) - best) / best:.1f}% | "
            f"{100 * (sum(r['chosen_us'] for r in rows) - best) / best:.1f}% | "
            f"{100 * sum(r['correct'] for r in rows) / j:.1f}% | {j} | "
            f"{sum(r['auto_gpu'] for r in rows)} / {sum(r['best_gpu'] for r in rows)} |")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    name = "routing" + (f"-{machine.name}" if machine is not None else "")
    path = os.path.join(HERE, "results", f"{name}-quick.md" if args.quick else f"{name}.md")
    with open(path, "w") as fh:
        fh.write("\n".join(LINES) + "\n")
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
