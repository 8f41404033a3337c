"""Distributed top_k: hipsched.dask.top_k over 1,000,000 x 768 float32, k=10, on a 2-worker LocalCluster
(1 thread each) against (a) one Executor with 2 threads on the same data in this process and (b) plain
Dask on the same cluster (da.argtopk of T @ q: a bare dot, no norms). Targets: within 1.3x of (a) (the
cost of Dask itself, on a 2-core machine) and >= 2x faster than (b).

The corpus is generated on the workers (da.random with a fixed seed, persisted there) and the same graph
is computed here with the threaded scheduler for (a): the same chunks with the same seeds give the same
bits, which the script checks (a sample of rows, and top_k results equal bit for bit). Other chunk sizes
are rechunks of that persisted corpus, so every row of the table scans identical data.

hipsched.dask.top_k groups the chunks: one task per worker thread over the chunks that worker holds
(the corpus is persisted; where they are is read once and cached), then one merge per output; so the
tasks per query do not grow with the chunks, and each group task depends on one chunk and reads the
others from its worker's memory, so no key per chunk goes through Dask per query either.

hipsched.dask.search is the same query computed now without a task graph: one request per worker to a
handler that scans the chunks it holds, the client merging the candidate lists (docs/guide/distributed.md,
"Queries served directly"). Both paths are measured, interleaved with the peers, and both checked
equal to the one-machine result bit for bit.

Overhead: for each chunk size one more run with the workers' telemetry cleared first; overhead per query
= workers x wall - the sum of the chunk kernels' own durations (each top_k event's duration_us): the
worker time not spent in a kernel (the client building and sending the graph, the scheduler, the query
and the candidates moving, the executor's own per-call work, a worker idle while the other finishes);
per chunk = that / chunks. The table also gives the client's graph-building time (hd.top_k's call; the
placement is cached, so no who_has round trip) and the tasks per query (keys of the optimized graph
that run), and the run prints the cluster's round trip for one no-op task (client.submit(...).result(),
median of 21, at the start and at the end): the floor of any Dask call on this machine at that load.

Where a direct query's time goes: hd.search's replies carry each worker's handler and scan durations
(hipsched.dask.direct.last_timing); the table gives, per chunk size, the client's round trip, the part
of it outside the slowest worker's handler (request and reply in transit and queued), the fastest and
slowest handler, and their difference: the imbalance between the workers' scans, which one process's
threads would share out between them and workers that hold their own chunks cannot.

Each timed call starts after a short idle pause (HIPSCHED_BENCH_SETTLE_S, 0.15 s), the same for every
path and peer.

Usage: python bench/distributed.py [--n 1000000] [--chunks 4000,15625,62500,250000] [--repeat 5]
                                  [--direct-to-workers]
Tables printed and written to bench/results/distributed.md, with the machine's load average."""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time

import numpy as np

# one Executor "with 2 threads": the kernels' OpenMP team in this process (set before hipsched loads).
# The workers get OMP_NUM_THREADS=1 from the nanny (distributed's pre-spawn environment): 1 thread each.
os.environ.setdefault("HIPSCHED_NUM_THREADS", "2")
# Run as a script, this file's folder is sys.path[0], where its own name would hide the `distributed`
# package: drop the folder and load the harness by path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
_spec = importlib.util.spec_from_file_location("harness", os.path.join(_HERE, "harness.py"))
harness = sys.modules["harness"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)   # also puts an in-place build first on sys.path
fmt_time = harness.fmt_time

D, K, SEED = 768, 10, 20261122


def _load():
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def _kernel_us(dask_worker):
    """(chunks, summed duration_us) of the top_k events this worker's executor recorded."""
    import hipsched.dask as hd
    ex = dask_worker.plugins[hd.PLUGIN_NAME].executor
    ev = [e for e in ex.events if e["op"] == "top_k"]
    return len(ev), sum(e["duration_us"] or 0.0 for e in ev)


def _clear(dask_worker):
    import hipsched.dask as hd
    dask_worker.plugins[hd.PLUGIN_NAME].executor.telemetry.clear()


def _round_trip(client, n=21):
    """Median seconds of one no-op task from this client: submit, run on a worker, result back."""
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        client.submit(int, 1, pure=False).result()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--chunks", default="4000,15625,62500,250000", help="rows per chunk, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dtypes", default="float32,float16", help="corpus dtypes, comma-separated (float32, float16)")
    p.add_argument("--direct-to-workers", action="store_true",
                   help="make the client with direct_to_workers=True (requests and gathers skip the scheduler's relay)")
    args = p.parse_args(argv)
    n, sizes = args.n, [int(s) for s in args.chunks.split(",")]
    dtypes = [np.dtype(t).type for t in args.dtypes.split(",")]

    import dask
    import dask.array as da
    from distributed import Client, LocalCluster, futures_of, wait

    import hipsched as hs
    import hipsched.dask as hd

    # The peer's kernels fix their thread count when first run, and libgomp reads OMP_NUM_THREADS when it
    # loads; starting a LocalCluster writes the nanny's OMP_NUM_THREADS=1 into this process's environment.
    # So load and run them here first, at 2 threads, and put the environment back after the start.
    ex = hs.Executor(persist_model=False, telemetry_enabled=False)
    ex.top_k(np.ones(D, np.float32), np.ones((64, D), np.float32), K, backend="cpu")
    feats = hs.cpu_features()
    env_before = dict(os.environ)
    load_start = _load()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           env={"HIPSCHED_NUM_THREADS": "1"})
    client = Client(cluster, direct_to_workers=args.direct_to_workers)
    os.environ.clear()
    os.environ.update(env_before)
    try:
        hd.setup(client, persist_model=False, job="bench-distributed")
        base_rows = sizes[len(sizes) // 2] if len(sizes) > 1 else sizes[0]
        graph = da.random.default_rng(SEED).standard_normal((n, D), chunks=(base_rows, D), dtype=np.float32)
        t0 = time.perf_counter()
        base = graph.persist()
        wait(base)
        t_gen = time.perf_counter() - t0
        T_local = graph.compute(scheduler="threads")   # the same graph: the same bits, here
        sample = np.random.default_rng(1).choice(n, 64, replace=False)
        assert np.array_equal(base.vindex[sample].compute(), T_local[sample]), "cluster and local corpora differ"
        q = np.random.default_rng(SEED + 1).standard_normal(D).astype(np.float32)
        ref_idx32, ref_val32 = ex.top_k(q, T_local, K, backend="cpu")
        print(f"corpus {n} x {D} float32 ({4 * n * D / 2**30:.2f} GiB) generated on the workers in {t_gen:.1f} s; "
              f"local copy checked; load average {load_start}", flush=True)
        rt_start = _round_trip(client)

        rows, over, fit, timeline = [], [], {}, []
        for dt in dtypes:
            dname = np.dtype(dt).name
            if dt == np.float32:
                base_dt, T_dt, (ref_idx, ref_val) = base, T_local, (ref_idx32, ref_val32)
            else:   # the same values rounded to the half type, on the workers and here
                base_dt = base.astype(dt).persist()
                wait(base_dt)
                T_dt = T_local.astype(dt)
                ref_idx, ref_val = ex.top_k(q, T_dt, K, backend="cpu")
            for rows_per_chunk in sizes:
                T = base_dt if rows_per_chunk == base_rows else base_dt.rechunk((rows_per_chunk, D)).persist()
                wait(T)
                chunks = T.numblocks[0]

                def ours():
                    return dask.compute(*hd.top_k(q, T, K))

                def direct():
                    return hd.search(q, T, K)

                def single():
                    return ex.top_k(q, T_dt, K, backend="cpu")

                def plain():
                    return da.argtopk(T @ q, K).compute()

                served = hd.direct.search_stats["direct"]
                for f in (ours, direct):
                    idx, val = f()
                    assert np.array_equal(idx, ref_idx) and np.array_equal(val, ref_val), f"{f.__name__} differs from one machine"
                assert hd.direct.search_stats["direct"] == served + 1, "search did not take its direct path"
                single()
                # the peer answers its own question (the largest dots, not cosines): check it against NumPy's
                assert set(plain().tolist()) == set(np.argpartition(-(T_dt @ q), K)[:K].tolist()), "plain Dask differs"
                graph_before = hd.direct.search_stats["graph"]
                times = {f: [] for f in (ours, direct, single, plain)}
                for _ in range(args.repeat):   # interleaved: drift on this shared machine hits all four alike
                    for f, acc in times.items():
                        # each from an idle cluster: the previous call's clean-up (released keys, its
                        # results' frees, telemetry) must not run on the workers inside the next one's time
                        time.sleep(harness.CPU_SETTLE_S)
                        t = time.perf_counter()
                        f()
                        acc.append(time.perf_counter() - t)
                assert hd.direct.search_stats["graph"] == graph_before, "a timed search fell back to the graph"
                med = {f: float(np.median(x)) for f, x in times.items()}
                ms, mp = med[single], med[plain]
                shape = f"k={K}, q({D}) x T({n},{D}) {dname}, {chunks} chunks of {rows_per_chunk} rows"
                for f, what in ((ours, "top_k (task graph)"), (direct, "search (direct)")):
                    mo = med[f]
                    gbs = np.dtype(dt).itemsize * n * D / mo / 1e9
                    rows.append(f"| {what} | {shape} | {fmt_time(mo)} | one Executor, 2 threads, same data | {fmt_time(ms)} | "
                                f"{ms / mo:.2f}x | >= {1 / 1.3:.2f}x (within 1.3x) {'ok' if ms / mo >= 1 / 1.3 else 'MISSED'} | "
                                f"{gbs:.2f} GB/s |")
                    rows.append(f"| {what} | {shape} | {fmt_time(mo)} | plain Dask da.argtopk(T @ q), same cluster | "
                                f"{fmt_time(mp)} | {mp / mo:.2f}x | >= 2x {'ok' if mp / mo >= 2 else 'MISSED'} | {gbs:.2f} GB/s |")
                print("\n".join(rows[-4:]), flush=True)
                # one more run of each with the kernels' own durations: what is left of the workers' time is overhead
                for f, what in ((ours, "top_k"), (direct, "search")):
                    client.run(_clear)
                    t = time.perf_counter()
                    if f is ours:
                        arrays = hd.top_k(q, T, K)
                        t_build = time.perf_counter() - t
                        dask.compute(*arrays)
                        graph = dict(dask.base.collections_to_expr(arrays, optimize_graph=True).__dask_graph__())
                        persisted = {fu.key for fu in futures_of(T)}
                        n_tasks = str(sum(1 for key, v in graph.items() if key not in persisted and type(v).__name__ != "Alias"))
                    else:
                        f()
                        t_build, n_tasks = float("nan"), "0 (one request per worker)"
                    wall = time.perf_counter() - t
                    per = client.run(_kernel_us)
                    n_ev = sum(c for c, _ in per.values())
                    kern = sum(us for _, us in per.values()) / 1e6
                    workers = len(per)
                    overhead = (workers * wall - kern) / chunks
                    fit.setdefault(f"{what} {dname}", []).append((chunks, workers * wall - kern))
                    over.append(f"| {what} {dname} | {rows_per_chunk} | {chunks} | {np.dtype(dt).itemsize * rows_per_chunk * D / 2**20:.0f} MiB | {n_tasks} | "
                                f"{fmt_time(wall)} | {fmt_time(t_build) if t_build == t_build else '-'} | "
                                f"{fmt_time(kern / max(n_ev, 1))} | "
                                f"{fmt_time(workers * wall - kern)} ({(workers * wall - kern) / (workers * wall):.0%}) | "
                                f"{fmt_time(overhead)} | {_load().split()[0]} |")
                    print(over[-1], flush=True)
                # where a direct query's time goes, from the handlers' own durations (no clock is compared
                # across processes): the request and reply in transit, each worker's scan, the imbalance
                samples = []
                for _ in range(args.repeat):
                    time.sleep(harness.CPU_SETTLE_S)
                    served = hd.direct.search_stats["direct"]
                    direct()
                    assert hd.direct.search_stats["direct"] == served + 1, "a timeline search fell back to the graph"
                    lt = hd.direct.last_timing
                    handlers = [wt["handler_s"] for wt in lt["workers"].values()]
                    samples.append((lt["wall_s"], lt["wall_s"] - max(handlers), min(handlers), max(handlers),
                                    max(handlers) - min(handlers)))
                wall_m, transit_m, fast_m, slow_m, spread_m = np.median(np.array(samples), axis=0)
                timeline.append(f"| {dname} | {rows_per_chunk} | {chunks} | {fmt_time(wall_m)} | {fmt_time(transit_m)} | "
                                f"{fmt_time(fast_m)} | {fmt_time(slow_m)} | {fmt_time(spread_m)} | {_load().split()[0]} |")
                print(timeline[-1], flush=True)
                if T is not base_dt:
                    del T
            base_dt = T_dt = None   # the half copy leaves the workers before the next dtype
        rt_end = _round_trip(client)
        load_end = _load()
    finally:
        client.close()
        cluster.close()

    title = (f"Distributed top_k ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"simd={feats['simd']}; the one Executor: {feats['threads']} threads; 2-worker LocalCluster, 1 thread each; "
             f"client direct_to_workers={args.direct_to_workers}; load average {load_start} at start, "
             f"{load_end} at end)")
    header = "| hipsched.dask | shape | time | peer | peer time | ratio (peer/ours) | target | hipsched rate |"
    text = f"## {title}\n\n{header}\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    text += ("\n### Overhead\n\nworkers x wall - summed kernel time, per query and per chunk, from one run with "
             "the workers' telemetry\n\n| path | rows per chunk | chunks | chunk size | tasks per query | wall | graph built "
             "(client) | kernel per chunk | overhead per query (share of worker time) | overhead per chunk | "
             "load (1 min) |\n|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(over) + "\n")
    text += ("\n### Where a direct query's time goes\n\nhd.search's requests, medians over the repeats: the round trip "
             "on the client (requests sent to replies in), of it the part outside the slowest worker's handler (the "
             "request and reply in transit and queued), and the fastest and slowest worker's handler (its scans of "
             "its chunks); imbalance: each query's slowest minus fastest handler, scan time that one process's "
             "threads would share out and workers holding their own chunks cannot\n\n| dtype | rows per chunk | chunks | round trip | "
             "outside the slowest handler | fastest handler | slowest handler | imbalance | load (1 min) |\n"
             "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(timeline) + "\n")
    text += (f"\nOne no-op task's round trip from the client (submit, run, result; median of 21): "
             f"{fmt_time(rt_start)} at the start, {fmt_time(rt_end)} at the end\n")
    for what, pts in fit.items():
        if len(pts) < 2:
            continue
        # total overhead = fixed + per_chunk x chunks: the slope is what one more chunk costs
        # (a line only where the points lie near one: the largest residual says how near)
        xs, ys = np.array([c for c, _ in pts], float), np.array([o for _, o in pts])
        per_chunk, fixed = np.polyfit(xs, ys, 1)
        resid = float(np.max(np.abs(ys - (fixed + per_chunk * xs))))
        text += (f"\nLeast-squares fit over the chunk sizes, {what}: overhead = {fixed * 1e3:.0f} ms + "
                 f"{per_chunk * 1e3:.2f} ms x chunks (worker time per query; largest residual {resid * 1e3:.0f} ms)\n")
    print("\n" + text)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "distributed.md")
    with open(path, "w") as fh:
        fh.write(text)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
