"""Calls in flight (docs/design/scheduling.md, "Under load"): several threads calling one Executor.

Two views. By default, machines in virtual time (tests/support/virtual_machine.py): each side a timeline
that runs one call at a time for its modelled time, the executor's real decision code deciding, the
schedule the same on any machine under any load. A family of machines: the GPU 0.5x, 1x and 2x the
CPU's speed on every op, and one whose GPU is 2x on top_k, 1x on qmatmul and 0.5x on softmax; each with
no noise and with heavy noise (every call's time times exp(0.3 N(0, 1))); the callers 1, 2, 4, 8 and
16 threads; top_k, qmatmul and softmax alone and mixed. Forced CPU, forced GPU and auto run the same
calls; the ideal is both sides busy at their own speeds. Then batches (Executor.batch) on the same
machines: 1,000 independent mixed calls, and graphs of dependent calls (250 chains of rms_norm or
softmax -> qmatmul -> softmax; 125 pairs of chains joined by an add), each against its lower bound (the
fluid split of the work between the sides, or the longest call or path on its faster sides).

With --wall, the wall-clock view on the machine that runs it: the real CPU engine beside a GPU that
runs one call at a time (tests/support/loaded_machine.py's SleepingGpu: it sleeps for its scripted
time, holding its one stream; its results are the CPU's, computed once per op and arguments:
loaded_machine.Results). The GPU's time per call is 0.5x, 1x or 2x the speed of the CPU's measured time
for that call (so 2x the CPU's time, the same, or half).

For each op (top_k, qmatmul, softmax, and a mix of the three), each GPU speed and each number of
threads, the same calls run three times: forced on the CPU, forced on the GPU, and automatic (the model
learned first by one caller). Throughput is calls per second; "of sum" is auto against the sum of the
two forced throughputs (both sides busy at their own speed, the ideal), "of best" against the better
one. Then a batch of 1,000 independent mixed calls (Executor.batch) against its lower bound: the work
divided between the sides by their rates (the GPU as fast as the CPU here: half the work), or the longest
call, whichever is larger (each call's time as measured on the CPU, alone).

Its CPU times change with the load beside it (two calls on two cores share them), and a GPU call's own
dispatch takes CPU time the ideal does not count.
Usage: python bench/concurrency.py [--wall] [--quick] [--calls N]
Writes bench/results/concurrency.md (concurrency-wall.md with --wall; -quick before .md with --quick)."""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))

import checkout  # noqa: E402,F401  (a checkout built in place is what is measured)
import hipsched as hs  # noqa: E402

from loaded_machine import Results, SleepingGpu  # noqa: E402
from virtual_machine import noisy, virtual_batch, virtual_machine  # noqa: E402

# the virtual machines' CPU times (us) per call, of the order of the H100 host's for these ops
SIM_CPU_US = {"top_k": 5600.0, "qmatmul": 1800.0, "softmax": 900.0}
SIM_MACHINES = [("gpu 0.5x", {"top_k": 0.5, "qmatmul": 0.5, "softmax": 0.5}),
                ("gpu 1x", {"top_k": 1.0, "qmatmul": 1.0, "softmax": 1.0}),
                ("gpu 2x", {"top_k": 2.0, "qmatmul": 2.0, "softmax": 2.0}),
                ("gpu 2x/1x/0.5x", {"top_k": 2.0, "qmatmul": 1.0, "softmax": 0.5})]

LINES = []


def out(line=""):
    print(line, flush=True)
    LINES.append(line)


def make_ops(rng):
    """{name: (args, kwargs)}: calls of a few milliseconds on a small CPU (a sleep's overshoot, tens of
    microseconds, and the dispatch's own time stay small beside them)."""
    T = rng.standard_normal((65536, 128), dtype=np.float32)
    q = rng.standard_normal(128, dtype=np.float32)
    w = hs.quantize(rng.standard_normal((8192, 4096), dtype=np.float32), "q8_0")
    x = rng.standard_normal(4096, dtype=np.float32)
    s = rng.standard_normal((2048, 4096), dtype=np.float32)
    return {"top_k": ((q, T, 10), {}), "qmatmul": ((w, x), {}), "softmax": ((s,), {})}


def cpu_time_us(ex, op, args, kwargs, reps=15):
    getattr(ex, op)(*args, backend="cpu", **kwargs)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        getattr(ex, op)(*args, backend="cpu", **kwargs)
        ts.append((time.perf_counter_ns() - t0) * 1e-3)
    return statistics.median(ts)


def executor(gpu_us_of):
    gpu = SleepingGpu(lambda call: gpu_us_of[call.op], result=Results())
    return hs.Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None, split=False), gpu


def run_threads(ex, calls, threads, backend):
    """Runs `calls` [(op, args, kwargs)] over `threads` threads (round robin); returns seconds."""
    share = [calls[i::threads] for i in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def caller(mine):
        barrier.wait()
        for op, args, kwargs in mine:
            getattr(ex, op)(*args, backend=backend, **kwargs)
    ts = [threading.Thread(target=caller, args=(m,)) for m in share]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def sim_ops(rng):
    """Small real arguments for each op (a virtual machine's times do not depend on them)."""
    w = hs.quantize(rng.standard_normal((64, 64), dtype=np.float32), "q8_0")
    return {"top_k": ((rng.standard_normal(16, dtype=np.float32), rng.standard_normal((256, 16), dtype=np.float32),
                       5), {}),
            "qmatmul": ((w, rng.standard_normal(64, dtype=np.float32)), {}),
            "softmax": ((rng.standard_normal((8, 64), dtype=np.float32),), {})}


def sim_run(speeds, sigma, seed, mix, threads, ncalls, ops, backend):
    """Virtual seconds for `ncalls` calls of `mix` over `threads` callers on one virtual machine, after one
    caller has run each op 8 times; and the calls the CPU took."""
    cpu_of = lambda call: SIM_CPU_US[call.op]  # noqa: E731
    gpu_of = lambda call: SIM_CPU_US[call.op] / speeds[call.op]  # noqa: E731
    if sigma:
        cpu_of, gpu_of = noisy(cpu_of, sigma, 2 * seed), noisy(gpu_of, sigma, 2 * seed + 1)
    vt, ex, cpu, gpu = virtual_machine(cpu_of, gpu_of)
    with ex, vt.executor_clock(ex):
        vt.run([lambda: [getattr(ex, op)(*ops[op][0], **ops[op][1]) for op in mix for _ in range(8)]])
        calls = [(op, *ops[op]) for op in (mix * ncalls)[:ncalls]]
        c0 = cpu.side.runs
        share = [calls[i::threads] for i in range(threads)]
        ns = vt.run([lambda mine=mine: [getattr(ex, op)(*a, backend=backend, **k) for op, a, k in mine]
                     for mine in share])
        return ns * 1e-9, cpu.side.runs - c0


def sim_batch(speeds, sigma, seed, ncalls, ops):
    """A batch of `ncalls` independent mixed calls on a virtual machine: (makespan s, bound s, on cpu)."""
    cpu_of = lambda call: SIM_CPU_US[call.op]  # noqa: E731
    gpu_of = lambda call: SIM_CPU_US[call.op] / speeds[call.op]  # noqa: E731
    if sigma:
        cpu_of, gpu_of = noisy(cpu_of, sigma, 2 * seed), noisy(gpu_of, sigma, 2 * seed + 1)
    vt, ex, cpu, gpu = virtual_machine(cpu_of, gpu_of)
    names = list(ops)
    with ex, vt.executor_clock(ex):
        vt.run([lambda: [getattr(ex, op)(*ops[op][0], **ops[op][1]) for op in names for _ in range(8)]])
        t0, c0 = vt.ns, cpu.side.runs
        b = ex.batch()
        b.run_sides = lambda workers: vt.run(list(workers.values()))
        with b:
            for i in range(ncalls):
                op = names[i % len(names)]
                ex.submit(op, *ops[op][0], **ops[op][1])
        b.results()
        makespan = (vt.ns - t0) * 1e-9
        on_cpu = cpu.side.runs - c0
    calls = [names[i % len(names)] for i in range(ncalls)]
    bound = lower_bound([(SIM_CPU_US[op], SIM_CPU_US[op] / speeds[op]) for op in calls])
    return makespan, bound * 1e-6, on_cpu


# the graph batch's calls: rms_norm the speed of softmax (both a pass over memory) on every machine
GRAPH_CPU_US = {"rms_norm": 600.0, "qmatmul": 1800.0, "softmax": 900.0, "add": 300.0}


def graph_speed(speeds, op):
    return speeds[op] if op in speeds else speeds["softmax"]


def graph_ops(rng):
    """Small real arguments for the graph batch's chains (the virtual machine's times do not depend on
    them): x (64,) -> rms_norm or softmax -> qmatmul with w (64, 64) -> softmax."""
    return {"x": rng.standard_normal(64, dtype=np.float32), "w": rng.standard_normal(64, dtype=np.float32),
            "W": hs.quantize(rng.standard_normal((64, 64), dtype=np.float32), "q8_0")}


def graph_calls(kind, groups):
    """[(op, [indices of the calls it takes])] in submission order: `groups` chains, rms_norm or softmax
    (alternately) -> qmatmul -> softmax ("chains"), or pairs of them whose ends an add joins ("fan-in")."""
    calls = []

    def chain(k):
        calls.append(("rms_norm" if k % 2 == 0 else "softmax", []))
        calls.append(("qmatmul", [len(calls) - 1]))
        calls.append(("softmax", [len(calls) - 1]))
        return len(calls) - 1
    for k in range(groups):
        if kind == "chains":
            chain(k)
        else:
            a, b = chain(2 * k), chain(2 * k + 1)
            calls.append(("add", [a, b]))
    return calls


def graph_bound(calls, speeds):
    """us no schedule beats: the fluid split of all the work between the sides (lower_bound), or the
    longest path, each call on its faster side, whichever is larger."""
    costs = [(GRAPH_CPU_US[op], GRAPH_CPU_US[op] / graph_speed(speeds, op)) for op, _ in calls]
    path = []
    for (op, deps), (c, g) in zip(calls, costs):
        path.append(min(c, g) + max((path[d] for d in deps), default=0.0))
    return max(lower_bound(costs), max(path))


def sim_graph_batch(speeds, sigma, seed, kind, groups, g):
    """A batch of dependent calls (graph_calls) on a virtual machine: (makespan s, bound s, calls, on cpu,
    planned makespan s)."""
    cpu_of = lambda call: GRAPH_CPU_US[call.op]  # noqa: E731
    gpu_of = lambda call: GRAPH_CPU_US[call.op] / graph_speed(speeds, call.op)  # noqa: E731
    if sigma:
        cpu_of, gpu_of = noisy(cpu_of, sigma, 2 * seed), noisy(gpu_of, sigma, 2 * seed + 1)
    vt, ex, cpu, gpu = virtual_machine(cpu_of, gpu_of)
    calls = graph_calls(kind, groups)

    def learn():
        for be in ("cpu", "gpu"):
            for _ in range(8):
                h = ex.rms_norm(g["x"], g["w"], backend=be)
                s = ex.softmax(ex.qmatmul(g["W"], ex.softmax(g["x"], backend=be), backend=be), backend=be)
                ex.add(s, ex.softmax(ex.qmatmul(g["W"], h, backend=be), backend=be), backend=be)
    with ex, vt.executor_clock(ex):
        vt.run([learn])
        t0, c0 = vt.ns, cpu.side.runs
        b = virtual_batch(vt, ex)
        with b:
            futs = []
            for op, deps in calls:
                ins = [futs[d] for d in deps]
                if op == "rms_norm":
                    futs.append(ex.submit(op, g["x"], g["w"]))
                elif op == "qmatmul":
                    futs.append(ex.submit(op, g["W"], ins[0]))
                elif op == "softmax":
                    futs.append(ex.submit(op, ins[0] if ins else g["x"]))
                else:
                    futs.append(ex.submit(op, *ins))
        b.results()
        makespan = (vt.ns - t0) * 1e-9
        on_cpu = cpu.side.runs - c0
    planned = max(p[4] for p in b.plan) * 1e-6
    return makespan, graph_bound(calls, speeds) * 1e-6, len(calls), on_cpu, planned, len(b.plan)


def graph_table(quick):
    """The graph batches' rows: each virtual machine, without and with noise, chains and fan-in."""
    g = graph_ops(np.random.default_rng(1))
    groups = {"chains": 60 if quick else 250, "fan-in": 30 if quick else 125}
    out("| graph batch | machine | noise | calls | planned | on cpu | planned makespan | makespan | lower bound "
        "| makespan / bound |")
    out("|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for kind in ("chains", "fan-in"):
        for mname, speeds in SIM_MACHINES:
            for sigma in (0.0, 0.3):
                ms, bound, n, on_cpu, planned, in_plan = sim_graph_batch(speeds, sigma, 11, kind, groups[kind], g)
                ratios.append(ms / bound)
                out(f"| {kind} | {mname} | {sigma} | {n} | {in_plan} | {on_cpu} | {planned * 1e3:.0f} ms | "
                    f"{ms * 1e3:.0f} ms | {bound * 1e3:.0f} ms | {ms / bound:.3f} |")
    out()
    out(f"Graph batches ({len(ratios)} rows): makespan / bound, max {max(ratios):.3f}, median "
        f"{statistics.median(ratios):.3f}. Chains: rms_norm or softmax -> qmatmul -> softmax (CPU "
        + ", ".join(f"{op} {t:.0f} us" for op, t in GRAPH_CPU_US.items()) + "; rms_norm at softmax's GPU "
        "speed); fan-in: two chains whose ends an add joins. The bound: the fluid split of the work, or the "
        "longest path on its faster sides.")


def lower_bound(costs):
    """The makespan no schedule beats, us: the work divided between the two sides as a fluid (each call's
    work on the side where it is relatively cheapest first: the fluid optimum of two machines), or the
    longest call's time on its faster side, whichever is larger."""
    longest = max(min(c, g) for c, g in costs)
    order = sorted(costs, key=lambda cg: cg[0] / cg[1])   # the CPU's relative best first
    # the fluid split: the CPU takes a prefix (and part of one call) until both sides end together
    lo, hi = 0.0, sum(c for c, _ in costs)
    for _ in range(60):
        mid = (lo + hi) / 2      # a makespan: can the CPU take its prefix within mid, the GPU the rest?
        cpu_left, gpu_need = mid, 0.0
        for c, g in order:
            take = min(1.0, cpu_left / c) if cpu_left > 0 else 0.0
            cpu_left -= take * c
            gpu_need += (1 - take) * g
        lo, hi = (lo, mid) if gpu_need <= mid else (mid, hi)
    return max(hi, longest)


def main_sim(a):
    rng = np.random.default_rng(0)
    ops = sim_ops(rng)
    threads_list = (1, 2, 4, 8) if a.quick else (1, 2, 4, 8, 16)
    sigmas = (0.0, 0.3)
    ncalls = a.calls or (80 if a.quick else 160)
    out(f"# Calls in flight, machines in virtual time ({time.strftime('%Y-%m-%d %H:%M')})")
    out()
    out("CPU time per call: " + ", ".join(f"{op} {t:.0f} us" for op, t in SIM_CPU_US.items()) +
        f"; the GPU's, the CPU's over its speed. {ncalls} calls a row (after 8 of each op by one caller).")
    out()
    out("| machine | noise | mix | threads | cpu calls/s | gpu calls/s | auto calls/s | of sum | of best "
        "| auto on cpu |")
    out("|---|---|---|---|---|---|---|---|---|---|")
    of_sums, of_bests, alone = [], [], []
    mixes = [[op] for op in ops] + [list(ops)]
    for mname, speeds in SIM_MACHINES:
        for sigma in sigmas:
            for mix in mixes:
                for threads in threads_list:
                    seed = len(of_sums) + len(alone)
                    t_cpu, _ = sim_run(speeds, sigma, seed, mix, threads, ncalls, ops, "cpu")
                    t_gpu, _ = sim_run(speeds, sigma, seed, mix, threads, ncalls, ops, "gpu")
                    t_auto, on_cpu = sim_run(speeds, sigma, seed, mix, threads, ncalls, ops, "auto")
                    r_cpu, r_gpu, r_auto = ncalls / t_cpu, ncalls / t_gpu, ncalls / t_auto
                    of_sum, of_best = r_auto / (r_cpu + r_gpu), r_auto / max(r_cpu, r_gpu)
                    (alone if threads == 1 else of_sums).append(of_sum if threads > 1 else of_best)
                    if threads > 1:
                        of_bests.append(of_best)
                    out(f"| {mname} | {sigma} | {'+'.join(mix)} | {threads} | {r_cpu:.0f} | {r_gpu:.0f} | "
                        f"{r_auto:.0f} | {of_sum:.2f} | {of_best:.2f} | {on_cpu}/{ncalls} |")
    out()
    out(f"Two threads or more ({len(of_sums)} rows): auto's throughput of the sum of the sides', min "
        f"{min(of_sums):.2f}, median {statistics.median(of_sums):.2f}, rows below 0.85: "
        f"{sum(1 for x in of_sums if x < 0.85)}; of the best side, min {min(of_bests):.2f}, rows below 0.95: "
        f"{sum(1 for x in of_bests if x < 0.95)}. One thread ({len(alone)} rows): of the best side, min "
        f"{min(alone):.2f}, median {statistics.median(alone):.2f}.")
    out()
    nb = 200 if a.quick else 1000
    out("| batch | machine | noise | calls | on cpu | makespan | lower bound | makespan / bound |")
    out("|---|---|---|---|---|---|---|---|")
    for mname, speeds in SIM_MACHINES:
        for sigma in sigmas:
            ms, bound, on_cpu = sim_batch(speeds, sigma, 7, nb, ops)
            out(f"| top_k+qmatmul+softmax | {mname} | {sigma} | {nb} | {on_cpu} | {ms * 1e3:.0f} ms | "
                f"{bound * 1e3:.0f} ms | {ms / bound:.3f} |")
    out()
    graph_table(a.quick)
    write("concurrency-quick.md" if a.quick else "concurrency.md")


def write(name):
    path = os.path.join(HERE, "results", name)
    with open(path, "w") as f:
        f.write("\n".join(LINES) + "\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wall", action="store_true", help="the wall-clock view: the real CPU engine")
    ap.add_argument("--quick", action="store_true", help="fewer configurations and calls")
    ap.add_argument("--calls", type=int, default=None, help="calls per configuration")
    a = ap.parse_args()
    if not a.wall:
        main_sim(a)
        return
    rng = np.random.default_rng(0)
    ops = make_ops(rng)
    threads_list = (2, 4, 8) if a.quick else (1, 2, 4, 8, 16)
    speeds = (0.5, 1.0, 2.0)
    ncalls = a.calls or (48 if a.quick else 96)
    probe = hs.Executor(persist_model=False, telemetry_path=None)
    cpu_us = {op: cpu_time_us(probe, op, *ops[op]) for op in ops}
    probe.close()
    out(f"# Calls in flight: {platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    out()
    out("CPU time per call alone (median of 15): " + ", ".join(f"{op} {t:.0f} us" for op, t in cpu_us.items()))
    out()
    out("| mix | GPU speed | threads | cpu calls/s | gpu calls/s | auto calls/s | of sum | of best | auto on cpu |")
    out("|---|---|---|---|---|---|---|---|---|")
    worst_sum, worst_best = [], []
    mixes = [[op] for op in ops] + [list(ops)]
    for mix in mixes:
        calls = [(op, *ops[op]) for op in (mix * ncalls)[:ncalls]]
        for speed in speeds:
            gpu_us = {op: cpu_us[op] / speed for op in ops}
            for threads in threads_list:
                ex, gpu = executor(gpu_us)
                with ex:
                    for op in mix:   # one caller learns both sides (as a service's first requests would)
                        for _ in range(8):
                            getattr(ex, op)(*ops[op][0], **ops[op][1])
                    t_cpu = run_threads(ex, calls, threads, "cpu")
                    t_gpu = run_threads(ex, calls, threads, "gpu")
                    g0 = gpu.runs
                    t_auto = run_threads(ex, calls, threads, "auto")
                    on_cpu = len(calls) - (gpu.runs - g0)
                r_cpu, r_gpu, r_auto = len(calls) / t_cpu, len(calls) / t_gpu, len(calls) / t_auto
                of_sum, of_best = r_auto / (r_cpu + r_gpu), r_auto / max(r_cpu, r_gpu)
                if threads > 1:
                    worst_sum.append(of_sum)
                    worst_best.append(of_best)
                out(f"| {'+'.join(mix)} | {speed}x | {threads} | {r_cpu:.0f} | {r_gpu:.0f} | {r_auto:.0f} | "
                    f"{of_sum:.2f} | {of_best:.2f} | {on_cpu}/{len(calls)} |")
    out()
    out(f"Over every configuration of two threads or more: auto's throughput of the sum, min {min(worst_sum):.2f}, "
        f"median {statistics.median(worst_sum):.2f}; of the best side, min {min(worst_best):.2f}, "
        f"median {statistics.median(worst_best):.2f}.")
    out()
    # a batch of independent mixed calls, planned together
    nb = 200 if a.quick else 1000
    gpu_us = {op: cpu_us[op] for op in ops}
    ex, gpu = executor(gpu_us)
    with ex:
        for op in ops:
            for _ in range(8):
                getattr(ex, op)(*ops[op][0], **ops[op][1])
        names = list(ops)
        calls = [names[i % len(names)] for i in range(nb)]
        t0 = time.perf_counter()
        with ex.batch() as b:
            for op in calls:
                ex.submit(op, *ops[op][0], **ops[op][1])
        b.results()
        makespan = (time.perf_counter() - t0) * 1e6
    # the bound, from each call's time alone: with the GPU as fast as the CPU on every call, the work
    # split evenly between the two sides, or the longest call
    bound = max(sum(cpu_us[op] for op in calls) / 2, max(cpu_us[op] for op in calls))
    planned = max(p[4] for p in b.plan)
    on_cpu = sum(1 for p in b.plan if p[2] == "cpu")
    out("| batch | calls | on cpu | planned makespan | measured makespan | lower bound | measured / bound |")
    out("|---|---|---|---|---|---|---|")
    out(f"| top_k+qmatmul+softmax, GPU 1x | {nb} | {on_cpu} | {planned / 1e3:.0f} ms | {makespan / 1e3:.0f} ms | "
        f"{bound / 1e3:.0f} ms | {makespan / bound:.2f} |")
    write("concurrency-wall-quick.md" if a.quick else "concurrency-wall.md")


if __name__ == "__main__":
    main()
