"""Routing against the oracle over a family of simulated machines (bench/machines/*.json): for each machine,
each starting point (an empty model, "cold"; a model Executor.calibrate() just filled, "calibrated") and
each seed, one bench/routing.py run (`hipsched demo --oracle` on that machine). Regret first: it is what a
wrong choice costs; accuracy counts calls within the machine's noise band as right either way. With
--expected-oracle, choice regret is the choices' expected cost and observed regret adds one draw of the
run's noise; the draws columns give that term and how far it spreads (routing.draw_spread).

Usage: python bench/routing_family.py [--quick] [--seeds N] [--first-seed S] [--label NAME] [--expected-oracle]
       [MACHINE.json ...]
Writes bench/results/routing-family-<label>[-quick].md and .json (the rows, for before/after tables)."""
import argparse
import glob
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))

import routing  # noqa: E402


def run_family(paths, quick, seeds, starts=("cold", "calibrated"), log=print, first_seed=0, expected_oracle=False):
    """[{machine, start, seed, regret, choice_regret, accuracy, judged, seconds}]"""
    rows = []
    for path in paths:
        m = routing.load_machine(path)
        for start in starts:
            for seed in range(first_seed, first_seed + seeds):
                t0 = time.perf_counter()
                res, rc, text = routing.one_run(start, quick, seed, True, machine=m, expected_oracle=expected_oracle)
                o = res["overall"]
                om = res["by_mean"]["overall"]
                row = {"machine": m.name, "start": start, "seed": seed, "regret": o["regret"],
                       "regret_mean": om["regret"], "choice_regret_mean": om["choice_regret"],
                       "choice_regret": o["choice_regret"], "accuracy": o["accuracy"], "judged": o["judged"],
                       "rc": rc, "seconds": time.perf_counter() - t0,
                       "per_op": {r["op"]: r["regret"] for r in res["per_op"] if r["judged"]}}
                draws = ""
                if expected_oracle:
                    # against expected prices the choice regret is the choices' expected cost, and the rest
                    # of the observed regret is this run's draws (routing.draw_spread)
                    row["draws"], row["draws_sd"] = routing.draw_spread(res, m)
                    draws = f"  draws {100 * row['draws']:+6.1f}% (one run's sd {100 * row['draws_sd']:.1f}%)"
                rows.append(row)
                log(f"{m.name:<24} {start:<10} seed {seed}: regret {100 * o['regret']:6.1f}%  choice "
                    f"{100 * o['choice_regret']:6.1f}%  accuracy {100 * o['accuracy']:5.1f}%  mean-oracle regret "
                    f"{100 * om['regret']:6.1f}% choice {100 * om['choice_regret']:6.1f}%{draws}  "
                    f"({row['seconds']:.0f} s)")
    return rows


def draws_cell(rs):
    """The seeds' mean of observed - choice regret, +- the sd that mean has from the runs' noise draws alone
    (sqrt of the summed per-run variances over the seeds): a mean observed regret further from the mean
    choice regret than two of these is more than the draws."""
    if not rs or any(r.get("draws") is None for r in rs):
        return "-"
    n = len(rs)
    sd = sum(r["draws_sd"] ** 2 for r in rs) ** 0.5 / n
    return f"{100 * sum(r['draws'] for r in rs) / n:+.1f}% +- {100 * sd:.1f}%"


def table(rows):
    """Markdown: one line per machine, regret (worst of the seeds, then the mean) per starting point; with
    the expected oracle, the draws (observed - choice regret) and their spread."""
    by = {}
    for r in rows:
        by.setdefault(r["machine"], {}).setdefault(r["start"], []).append(r)
    lines = ["| machine | cold regret: worst (mean) | calibrated regret: worst (mean) | cold regret, mean oracle | "
             "calibrated regret, mean oracle | cold choice regret | calibrated choice regret | cold choice regret, "
             "mean oracle | calibrated choice regret, mean oracle | cold accuracy | calibrated accuracy | seeds |"
             " cold draws: mean +- sd | calibrated draws: mean +- sd |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(rs, k, worst=True):
        if not rs:
            return "-"
        v = [r[k] for r in rs]
        return f"{100 * max(v):.1f}% ({100 * sum(v) / len(v):.1f}%)" if worst else f"{100 * sum(v) / len(v):.1f}%"
    for name, st in by.items():
        c, k = st.get("cold", []), st.get("calibrated", [])
        lines.append(f"| {name} | {cell(c, 'regret')} | {cell(k, 'regret')} | {cell(c, 'regret_mean')} | "
                     f"{cell(k, 'regret_mean')} | {cell(c, 'choice_regret')} | {cell(k, 'choice_regret')} | "
                     f"{cell(c, 'choice_regret_mean')} | {cell(k, 'choice_regret_mean')} | "
                     f"{cell(c, 'accuracy', False)} | {cell(k, 'accuracy', False)} | "
                     f"{max(len(c), len(k))} | {draws_cell(c)} | {draws_cell(k)} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("machines", nargs="*", help="machine files (default: bench/machines/*.json)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--label", default="now")
    ap.add_argument("--expected-oracle", action="store_true",
                    help="price each call at its expected time on the machine (the oracle's runs without noise), "
                         "not at three sampled runs per side")
    args = ap.parse_args(argv)
    paths = args.machines or sorted(glob.glob(os.path.join(HERE, "machines", "*.json")))
    t0 = time.perf_counter()
    rows = run_family(paths, args.quick, args.seeds, first_seed=args.first_seed, expected_oracle=args.expected_oracle)
    flag = " --expected-oracle" if args.expected_oracle else ""
    text = (f"## routing over the machine family: demo{' --quick' if args.quick else ''}, {args.seeds} seed(s), "
            f"label {args.label}\n\ncommand: `python bench/routing_family.py{' --quick' if args.quick else ''} "
            f"--seeds {args.seeds} --label {args.label}{flag}` ({time.perf_counter() - t0:.0f} s; hipsched from "
            f"{os.path.dirname(os.path.dirname(routing.hs.__file__))})\n\n{table(rows)}\n")
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    base = os.path.join(HERE, "results", f"routing-family-{args.label}{'-quick' if args.quick else ''}")
    with open(base + ".md", "w") as fh:
        fh.write(text)
    with open(base + ".json", "w") as fh:
        json.dump(rows, fh, indent=1)
    print(f"written: {base}.md, {base}.json")


if __name__ == "__main__":
    main()
