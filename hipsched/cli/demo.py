"""python -m hipsched demo: a realistic mixed workload on whatever hardware is present, with telemetry.

Three phases, each tagged in the telemetry: embedding search (768-d corpus, cosine top-k over
sub-corpora of varied size so the scheduler sees a spread of sizes), a small transformer block
(quantized projections, causal attention, softmax over logits, residual add and scale), and spreading
activation over a random graph. At the end: the numeric self-checks (the exit status is 1 when one
fails), the in-memory summary, the analyzer's report of the JSONL log, and where that log is.

`--oracle` also measures routing against an oracle: after the workload ran in `auto`, each of its calls
is run again forced on the CPU and forced on the GPU (by a second executor that does not persist its
model, so the forced runs teach the first one nothing; its events go to the same log, where they give
the analyzer both sides of every size bucket). A call's faster side is the one whose forced run took
less (both are right within TIE_BAND); accuracy is the share of auto calls on their faster side, and
regret is (auto time - oracle-best time) / oracle-best time over all calls (see docs/design/scheduling.md,
"Routing accuracy")."""
from __future__ import annotations

import argparse
import io
import os
import sys
import time

import numpy as np

from ..ops.base import host_arrays
from .logs import demo_log_dirs


# The self-checks' bounds. float32 results: the cosine of 768-d vectors is within ~1e-6 of a float64
# evaluation, a softmax row sums to 1 within ~1e-6, spreading activation (3 steps, activations in [0, 1])
# within ~1e-6 per step (hipsched/ops/graph.py). The bounds are 100x those, so a failure means a wrong
# result, not rounding.
CHECK_LIMITS = {"cosine": 1e-4, "softmax": 1e-4, "graph": 1e-4}
# Oracle: forced times within this relative band of each other are a tie (either side is right).
TIE_BAND = 0.05


def _seed(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (numpy seeds are non-negative), got {v}")
    return v


def add_arguments(p):
    p.add_argument("--log", help="telemetry JSONL path (default: $HIPSCHED_TELEMETRY, else a new file under "
                                 "the cache dir)")
    p.add_argument("--quick", action="store_true", help="smaller sizes (a few seconds)")
    p.add_argument("--seed", type=_seed, default=0, help="random seed (a non-negative integer)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--oracle", action="store_true",
                   help="then rerun every call forced on the CPU and on the GPU, and report routing accuracy and "
                        "regret of the auto run against that oracle")
    p.add_argument("--oracle-repeats", type=int, default=3, metavar="N",
                   help="forced runs per call and side for --oracle; the median run counts (default 3)")


def _default_log():
    name = time.strftime("demo-%Y%m%dT%H%M%S.jsonl", time.gmtime())
    # the cache dir's logs/, or where it is not writable (read-only home, a file in the way) the temp dir's
    for d in demo_log_dirs():
        try:
            os.makedirs(d, exist_ok=True)
            if os.access(d, os.W_OK):
                return os.path.join(d, name)
        except OSError:
            pass
    raise OSError(f"hipsched demo: none of {', '.join(demo_log_dirs())} is writable: give --log PATH")


class _Workload:
    def __init__(self, ex, quick, seed):
        self.ex = ex
        self.rng = np.random.default_rng(seed)
        s = 8 if quick else 1
        self.corpus_n = 262144 // s
        self.queries = 32 // min(s, 4)
        self.d_model, self.heads, self.seq, self.layers, self.vocab = 1024, 16, 512 // s, 6, 32000 // s
        self.graph_n, self.graph_edges = 1_000_000 // s, 8_000_000 // s
        self.checks = []

    # ---------------------------------------------------------------- phases
    def search_steps(self):
        corpus = self.rng.standard_normal((self.corpus_n, 768), dtype=np.float32)
        queries = self.rng.standard_normal((64, 768), dtype=np.float32)
        # an index built once and then only searched, as a search service holds it: read-only, so the
        # GPU may keep it (a writable corpus is uploaded by every GPU call:
        # docs/guide/residency-and-device-data.md, "Resident cache")
        corpus.flags.writeable = False
        sizes = np.unique(np.geomspace(512, self.corpus_n, 16).astype(int))
        for i, n in enumerate(sizes):
            def step(n=n, i=i):
                part = corpus[:n]
                for q in queries[:self.queries]:
                    self.ex.top_k(q, part, 10)
                sims = self.ex.cosine_similarity(queries[:32], part)
                if i == len(sizes) - 1:
                    self._check_cosine(queries[:32], part, sims)
            yield f"search n={n}", step

    def transformer_steps(self):
        # deferred: __main__ imports every command, so this loads only when the command runs (compiled modules)
        import hipsched as hs
        d, h, seq = self.d_model, self.heads, self.seq
        rng = self.rng
        w_qkv = hs.quantize(rng.standard_normal((3 * d, d), dtype=np.float32) / np.sqrt(d), "q8_0")
        w_up = hs.quantize(rng.standard_normal((4 * d, d), dtype=np.float32) / np.sqrt(d), "q4_0")
        w_down = hs.quantize(rng.standard_normal((d, 4 * d), dtype=np.float32) / np.sqrt(4 * d), "q4_0")
        w_vocab = hs.quantize(rng.standard_normal((self.vocab, d), dtype=np.float32) / np.sqrt(d), "q8_0")
        x = rng.standard_normal((d, seq), dtype=np.float32)  # columns are tokens: qmatmul takes (k, m)
        for layer in range(self.layers):
            def step(layer=layer):
                nonlocal x
                qkv = self.ex.qmatmul(w_qkv, x)                                  # (3d, seq)
                q, k, v = (qkv[i * d:(i + 1) * d].T.reshape(seq, h, d // h).transpose(1, 0, 2)[None]
                           for i in range(3))
                att = self.ex.attention(q, k, v, causal=True)                   # (1, h, seq, d/h)
                att = att[0].transpose(1, 0, 2).reshape(seq, d).T
                x = self.ex.add(x, att)
                up = self.ex.qmatmul(w_up, x)
                x = self.ex.add(x, self.ex.scale(self.ex.qmatmul(w_down, np.maximum(up, 0)), 0.5))
                logits = self.ex.qmatmul(w_vocab, x[:, -8:]).T                  # last 8 tokens
                probs = self.ex.softmax(logits, axis=-1)
                if layer == self.layers - 1:
                    self.checks.append(("softmax rows sum to 1", float(np.abs(probs.sum(-1) - 1).max()),
                                        CHECK_LIMITS["softmax"]))
            yield f"transformer layer {layer}", step

    def graph_steps(self):
        n, e = self.graph_n, self.graph_edges
        src = self.rng.integers(0, n, e)
        order = np.argsort(src, kind="stable")
        indices = self.rng.integers(0, n, e).astype(np.int32)[order]
        weights = self.rng.uniform(0.05, 0.5, e).astype(np.float32)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
        for a in (indptr, indices, weights):
            a.flags.writeable = False   # the graph is fixed while it is queried: the GPU may keep it
        graph = (indptr, indices, weights)
        for i in range(6):
            def step(i=i):
                seeds = np.zeros(n, dtype=np.float32)
                seeds[self.rng.integers(0, n, 32)] = 1.0
                act = self.ex.spread_activation(graph, seeds, decay=0.6, steps=3, threshold=0.01)
                if i == 0:
                    self.checks.append(("graph: active nodes after 3 steps", float((act > 0).sum()), None))
                    self._check_graph(graph, seeds, act, decay=0.6, steps=3, threshold=0.01)
            yield f"graph query {i}", step

    def _check_cosine(self, Q, T, sims):
        Qn = Q / np.linalg.norm(Q, axis=1, keepdims=True)
        Tn = T / np.linalg.norm(T, axis=1, keepdims=True)
        err = float(np.abs(np.asarray(sims) - Qn @ Tn.T).max())
        self.checks.append(("cosine max |error| vs NumPy", err, CHECK_LIMITS["cosine"]))

    def _check_graph(self, graph, seeds, act, decay, steps, threshold):
        """Against a float64 NumPy evaluation of the documented recurrence (hipsched/ops/graph.py); nodes
        whose reference lies within 1e-4 of the threshold are left out (float32 sums may fall on
        either side of it)."""
        indptr, indices, weights = graph
        src = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        a = seeds.astype(np.float64)
        w = weights.astype(np.float64)
        for _ in range(steps):
            a = np.clip(a + decay * np.bincount(indices, weights=w * a[src], minlength=len(a)), 0, 1)
            a[a < threshold] = 0
        clear = np.abs(a - threshold) > 1e-4
        err = float(np.abs(np.asarray(act, np.float64) - a)[clear].max())
        self.checks.append(("graph max |error| vs NumPy", err, CHECK_LIMITS["graph"]))


class _Recording:
    """Stands for the executor in the workload: every op call goes to the executor and is kept as
    (op, args, kwargs), so the oracle can run the very same calls (the same argument objects: what is
    resident on the GPU stays so) forced on each side."""

    def __init__(self, ex):
        self._ex = ex
        self.calls = []

    def __getattr__(self, op):
        fn = getattr(self._ex, op)

        def call(*args, **kwargs):
            self.calls.append((op, args, kwargs))
            return fn(*args, **kwargs)
        return call


def _events_of_last(ex, calls):
    """The telemetry events of the last len(calls) calls of `ex`, one per call, in order."""
    events = ex.events[-len(calls):] if calls else []
    if len(events) != len(calls) or any(e["op"] != c[0] for e, c in zip(events, calls)):
        raise RuntimeError("hipsched demo --oracle: the telemetry ring does not hold one event per call "
                           f"({len(events)} events for {len(calls)} calls); raise telemetry_ring_size")
    return events


# Inputs at least this large are followed by the oracle: their upload is shared among the calls that
# pass them (the executor tracks the same ones, hipsched.upload_sharing.REUSE_MIN_BYTES).
_SHARED_INPUT_BYTES = 1 << 20


def _large_inputs(args):
    return [a for a, _ in host_arrays(args, _SHARED_INPUT_BYTES)]


def oracle_runs(oracle_ex, calls, bar=None, repeats=3, runs_out=None):
    """Each call run forced on the CPU and forced on the GPU, alternately, `repeats` times each, by
    `oracle_ex`, in the workload's order: [(cpu event, gpu event)], the GPU event's duration being the
    call's share of the best schedule's GPU time.

    The CPU side is its median run (one slow run on a busy machine must not decide which side is
    faster). On the GPU, the first run of a call uploads its new inputs and the later runs find them
    resident; the excess of the first run over the median of the later ones is the upload. An input of
    one call is charged to that call. An input several calls pass (a search corpus, weights) is
    uploaded once for all of them, so the oracle decides it per input, knowing the whole workload:
    the upload is worth paying when the calls that would then run faster on the GPU save more than it
    costs; it is then shared by those calls in proportion to what each saves (so each still gains, and
    its faster side is the one the best schedule gives it), and otherwise charged whole to each. An input too large to stay resident is uploaded on every run, and every run pays it.
    With repeats=1 the GPU side is the single run, upload included. `runs_out` (a list) receives the
    forced runs, for price_runs to price them another way."""
    runs = [] if runs_out is None else runs_out
    for op, args, kwargs in calls:
        fn = getattr(oracle_ex, op)
        sides = {"cpu": [], "gpu": []}
        for _ in range(repeats):
            for side in ("cpu", "gpu"):
                fn(*args, backend=side, **kwargs)
                sides[side].append(oracle_ex.events[-1])
        runs.append(sides)
        if bar is not None:
            bar.update(1)
    return price_runs(calls, runs, np.median)


def price_runs(calls, runs, center):
    """oracle_runs' pricing of the forced runs `runs` ([{"cpu": [events], "gpu": [events]}] per call), each
    side's time the `center` (np.median: one slow run on a busy machine does not decide; np.mean: the
    expected time, slow modes by their share, as a scheduler that predicts means pays them) of its runs."""
    uses, upload = {}, {}
    rows = []   # per call: [cpu us, gpu us with single-use uploads, key of its shared input or None]
    for (op, args, kwargs), sides in zip(calls, runs):
        for a in _large_inputs(args):
            uses[id(a)] = uses.get(id(a), 0) + 1
    for (op, args, kwargs), sides in zip(calls, runs):
        cpu = float(center([e["duration_us"] for e in sides["cpu"]]))
        g = sides["gpu"]
        if not all(e["backend"] == "gpu" for e in g):
            rows.append([cpu, None, None])
            continue
        if len(g) == 1:
            rows.append([cpu, g[0]["duration_us"], None])
            continue
        resident = float(center([e["duration_us"] for e in g[1:]]))
        extra = max(0.0, g[0]["duration_us"] - resident)
        big = _large_inputs(args)
        new = [a for a in big if id(a) not in upload]
        total = sum(a.nbytes for a in new)
        for a in new:
            upload[id(a)] = extra * a.nbytes / total
        shared = [a for a in big if uses[id(a)] > 1]
        own = sum(upload[id(a)] for a in big if uses[id(a)] == 1)
        key = id(max(shared, key=lambda a: a.nbytes)) if shared else None
        # a second shared input (rare) is spread evenly over its calls
        other = sum(upload[id(a)] / uses[id(a)] for a in shared if id(a) != key)
        rows.append([cpu, resident + own + other, key])
    alone = [gpu for _, gpu, _ in rows]   # each call's GPU price before its share of a shared upload
    groups = {}
    for i, (cpu, gpu, key) in enumerate(rows):
        if key is not None:
            groups.setdefault(key, []).append(i)
    for key, idx in groups.items():
        u = upload.get(key, 0.0)
        wins = [i for i in idx if rows[i][1] < rows[i][0]]
        saved = sum(rows[i][0] - rows[i][1] for i in wins)
        for i in idx:
            if saved > u:
                # in proportion to what each call saves: every one of them still gains, so the faster
                # side of each call is the side the best schedule gives it
                rows[i][1] += u * (rows[i][0] - rows[i][1]) / saved if i in wins else 0.0
            else:
                rows[i][1] += u
    out = []
    for (cpu, gpu, key), resident, sides in zip(rows, alone, runs):
        c = dict(sides["cpu"][0], duration_us=cpu)
        if gpu is None:
            g = sides["gpu"][0]
        else:
            g = dict(sides["gpu"][-1], duration_us=gpu)
            if key is not None:
                # what judge's choice regret needs to charge a schedule the shared upload once
                g["oracle_shared"] = {"input": key, "upload_us": upload.get(key, 0.0), "resident_us": resident}
        out.append((c, g))
    return out


def judge(auto_events, oracle_events, tie_band=TIE_BAND, keep_calls=False):
    """Routing of the auto run against the oracle. A call is judged when both forced runs ran on their
    side (a forced GPU run that fell back, or that the GPU could not take, leaves one side). Its faster
    side is the one whose forced run took less; within `tie_band` both are right. A call the auto run
    split across both sides is right when it took no longer than the faster side's forced run (within
    `tie_band`). Regret is observed:
    (auto time - best forced time) summed over calls, over the best times summed; `choice_regret`
    charges each call the forced time of the side auto chose instead of its own run, which takes the
    run-to-run noise of a single sample out. An input several calls share (price_runs) is uploaded
    once by a schedule, whichever of them it runs on the GPU: choice regret charges its upload to the
    first call auto ran on the GPU, and the others their resident time (the oracle's price for a call
    holds the upload's share the best schedule gives it, or all of it where that schedule does not pay
    it, which charged a schedule that did pay it once for every call)."""
    per_op = {}
    paid = set()   # shared inputs whose upload a call auto ran on the GPU has been charged
    for a, (c, g) in zip(auto_events, oracle_events):
        row = per_op.setdefault(a["op"], {"op": a["op"], "calls": 0, "judged": 0, "correct": 0, "auto_us": 0.0,
                                          "best_us": 0.0, "chosen_us": 0.0, "cpu_us": 0.0, "gpu_us": 0.0,
                                          "auto_gpu": 0, "best_gpu": 0, "misses": {}})
        row["calls"] += 1
        if keep_calls:
            row.setdefault("per_call", []).append((a, c, g))
        if c["backend"] != "cpu" or g["backend"] != "gpu" or g.get("fallback"):
            continue
        tc, tg, ta = c["duration_us"], g["duration_us"], a["duration_us"]
        best = min(tc, tg)
        faster = "gpu" if tg < tc else "cpu"
        tie = max(tc, tg) <= best * (1 + tie_band)
        row["judged"] += 1
        if a["backend"] == "split":
            # cut across both sides: right when it beat (or tied) the faster side alone, whose time the
            # oracle knows; its own run is the only measure of the choice
            right, chosen = ta <= best * (1 + tie_band), ta
        else:
            right, chosen = tie or a["backend"] == faster, tg if a["backend"] == "gpu" else tc
            shared = g.get("oracle_shared")
            if shared is not None and a["backend"] == "gpu":
                chosen = shared["resident_us"] + (shared["upload_us"] if shared["input"] not in paid else 0.0)
                paid.add(shared["input"])
        row["correct"] += right
        if not right:
            row["misses"][a["reason"]] = row["misses"].get(a["reason"], 0) + 1
        row["auto_us"] += ta
        row["best_us"] += best
        row["chosen_us"] += chosen
        row["cpu_us"] += tc
        row["gpu_us"] += tg
        row["auto_gpu"] += a["backend"] == "gpu"
        row["best_gpu"] += faster == "gpu"
    rows = [per_op[k] for k in sorted(per_op)]
    keys = ("calls", "judged", "correct", "auto_us", "best_us", "chosen_us", "cpu_us", "gpu_us", "auto_gpu", "best_gpu")
    total = {"op": "(all)", **{k: sum(r[k] for r in rows) for k in keys}, "misses": {}}
    for r in rows:
        for k, v in r["misses"].items():
            total["misses"][k] = total["misses"].get(k, 0) + v
    for r in rows + [total]:
        r["accuracy"] = r["correct"] / r["judged"] if r["judged"] else None
        r["regret"] = (r["auto_us"] - r["best_us"]) / r["best_us"] if r["best_us"] else None
        r["choice_regret"] = (r["chosen_us"] - r["best_us"]) / r["best_us"] if r["best_us"] else None
    return {"per_op": rows, "overall": total, "tie_band": tie_band}


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def render_judgement(res) -> str:
    lines = [f"Routing against the oracle (each call also run forced on each side; ties within "
             f"{100 * res['tie_band']:.0f}%)",
             "  op                 calls  judged  accuracy  regret  choice regret   auto ms   best ms  cpu-only ms"
             "  gpu-only ms  on gpu auto/best  misses by reason"]
    for r in res["per_op"] + [res["overall"]]:
        misses = ", ".join(f"{k} {v}" for k, v in sorted(r["misses"].items(), key=lambda kv: -kv[1])) or "-"
        lines.append(f"  {r['op']:<17}  {r['calls']:>5}  {r['judged']:>6}  {_pct(r['accuracy']):>8}  "
                     f"{_pct(r['regret']):>6}  {_pct(r['choice_regret']):>13}  {r['auto_us'] / 1e3:>8.2f}  "
                     f"{r['best_us'] / 1e3:>8.2f}  {r['cpu_us'] / 1e3:>11.2f}  {r['gpu_us'] / 1e3:>11.2f}  "
                     f"{r['auto_gpu']:>7}/{r['best_gpu']:<8}  {misses}")
    if not res["overall"]["judged"]:
        lines.append("  (no call judged: the GPU did not run the forced calls; see the report below)")
    return "\n".join(lines)


def run(args) -> int:
    return run_demo(args)[0]


def run_demo(args, machine=None, oracle_machine=None, tie_band=TIE_BAND, **executor_options):
    """The command: (exit status, the oracle's judgement or None). `machine` / `oracle_machine`
    (Executor keyword arguments: gpu_backend, cpu_backend, e.g. a simulated machine from tests/support),
    `tie_band` (the judge's: a machine noisier than 5% needs a wider one) and `executor_options` (config
    fields) are for benchmarks and tests; the oracle's executor needs backends of its own when they are
    given."""
    # deferred: __main__ imports every command, so this loads only when the command runs (compiled modules)
    import hipsched as hs
    from ..telemetry import analysis, path_from_env

    # the documented precedence: the argument, then the environment, then a fresh file (the demo always
    # logs, since its report is read from the log)
    log = args.log or path_from_env() or _default_log()
    oracle = getattr(args, "oracle", False)
    print(f"hipsched demo: telemetry -> {os.path.abspath(log)}")
    judgement = None
    with hs.Executor(telemetry_path=log, **(machine or {}), **executor_options) as ex:
        caps = ex.capabilities()
        if caps.gpu_available:
            print(f"GPU: {caps.gpu_device_name}")
        else:
            print("No GPU in use, so everything runs on the CPU. Why:")
            for reason in caps.reasons or ["(no reason recorded)"]:
                print(f"  - {reason}")
        print(f"CPU kernels: {hs.cpu_features()}")
        rec = _Recording(ex)
        w = _Workload(rec if oracle else ex, args.quick, args.seed)
        phases = [("search", list(w.search_steps())), ("transformer", list(w.transformer_steps())),
                  ("graph", list(w.graph_steps()))]
        total = sum(len(steps) for _, steps in phases)
        # deferred: __main__ imports every command, so this loads only when the command runs
        from ..progress import progress
        bar = progress(total, "demo", enabled=not args.no_progress)
        t0 = time.perf_counter()
        for phase, steps in phases:
            with ex.scope(phase=phase):
                for label, step in steps:
                    bar.set_postfix_str(label)
                    step()
                    bar.update(1)
        bar.close()
        wall = time.perf_counter() - t0
        print(f"\nworkload finished in {wall:.1f} s")
        failed_checks = []
        for name, value, limit in w.checks:
            bad = limit is not None and not value <= limit   # NaN fails too
            if bad:
                failed_checks.append(name)
            bound = "" if limit is None else f" (limit {limit:.0e}){': FAILED' if bad else ''}"
            shown = f"{int(value)}" if float(value).is_integer() and limit is None else f"{value:.3g}"  # a count
            print(f"  check: {name}: {shown}{bound}")
        if oracle and caps.gpu_available:
            auto_events = _events_of_last(ex, rec.calls)
            opts = {k: v for k, v in executor_options.items()
                    if k not in ("persist_model", "telemetry_path", "telemetry_enabled", "telemetry_ring_size")}
            # its events are how the forced runs are timed: telemetry on, whatever the configuration
            # says, and a ring of a few events (only the last one is read)
            with hs.Executor(telemetry_path=log, persist_model=False, telemetry_enabled=True, telemetry_ring_size=8,
                             **(oracle_machine or {}), **opts) as oex:
                bar = progress(len(rec.calls), "oracle", enabled=not args.no_progress)
                with oex.scope(phase="oracle"):
                    runs = []
                    pairs = oracle_runs(oex, rec.calls, bar, max(1, getattr(args, "oracle_repeats", 3)), runs)
                bar.close()
            judgement = judge(auto_events, pairs, tie_band=tie_band, keep_calls=True)
            # the same runs priced by their means: the expected time of each side, which a machine's slow
            # modes and tails raise (the medians leave them out, and the auto run pays them)
            judgement["by_mean"] = judge(auto_events, price_runs(rec.calls, runs, np.mean), tie_band=tie_band)
        elif oracle:
            print("\n--oracle: no GPU in use, so there is nothing to choose between: routing not judged")
        # the in-memory summary is printed only where the log's report below cannot be (its per-op table
        # is the report's first, and the demo printed both)
        summary = io.StringIO()
        ex.print_debug_summary(file=summary)
        failed = getattr(ex.telemetry, "writer_error", None)
    if judgement is not None:
        print()
        print(render_judgement(judgement))
    print()
    rc = 1 if failed_checks else 0
    if failed_checks:
        print(f"hipsched demo: self-check(s) FAILED: {', '.join(failed_checks)} (exit status 1)")
    if not os.path.isfile(log):
        print(summary.getvalue())
        print(f"telemetry log {log} could not be written ({failed or 'telemetry off'}); the summary above "
              "is from memory")
        return rc, judgement
    if failed is not None:
        print(f"note: writing {log} failed part way ({failed}); the report below covers what was written")
    print(analysis.report([log]))
    print(f"\ntelemetry log: {os.path.abspath(log)}")
    print(f"  follow it:   hipsched monitor {log} --summary")
    print(f"  analyse it:  hipsched analyze {log} --trace trace.json   (or tools/analyze.py from a checkout, "
          f"nothing built)")
    if failed_checks:
        print(f"\nhipsched demo: self-check(s) FAILED: {', '.join(failed_checks)}")
    return rc, judgement
