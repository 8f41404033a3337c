"""python -m hipsched demo: a realistic mixed workload on whatever hardware is present, with telemetry.

Three phases, each tagged in the telemetry: embedding search (768-d corpus, cosine top-k over
sub-corpora of varied size so the scheduler sees a spread of sizes), a small transformer block
(quantized projections, causal attention, softmax over logits, residual add and scale), and spreading
activation over a random graph. At the end: the in-memory summary, the analyzer's report of the JSONL
log, and where that log is."""
from __future__ import annotations

import os
import sys
import time

import numpy as np


def _seed(text):
    import argparse
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


def _default_log():
    import tempfile
    from ..config import HybridConfig
    name = time.strftime("demo-%Y%m%dT%H%M%S.jsonl", time.gmtime())
    d = os.path.join(HybridConfig().cache_dir, "logs")
    try:
        os.makedirs(d, exist_ok=True)
        if os.access(d, os.W_OK):
            return os.path.join(d, name)
    except OSError:
        pass
    # the cache dir is not writable (read-only home, a file in the way): the temp dir still is
    d = os.path.join(tempfile.gettempdir(), "hipsched-logs")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


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
                    self.checks.append(("softmax rows sum to 1", float(np.abs(probs.sum(-1) - 1).max())))
            yield f"transformer layer {layer}", step

    def graph_steps(self):
        n, e = self.graph_n, self.graph_edges
        src = self.rng.integers(0, n, e)
        order = np.argsort(src, kind="stable")
        indices = self.rng.integers(0, n, e).astype(np.int32)[order]
        weights = self.rng.uniform(0.05, 0.5, e).astype(np.float32)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
        graph = (indptr, indices, weights)
        for i in range(6):
            def step(i=i):
                seeds = np.zeros(n, dtype=np.float32)
                seeds[self.rng.integers(0, n, 32)] = 1.0
                act = self.ex.spread_activation(graph, seeds, decay=0.6, steps=3, threshold=0.01)
                if i == 0:
                    self.checks.append(("graph: active nodes after 3 steps", float((act > 0).sum())))
            yield f"graph query {i}", step

    def _check_cosine(self, Q, T, sims):
        Qn = Q / np.linalg.norm(Q, axis=1, keepdims=True)
        Tn = T / np.linalg.norm(T, axis=1, keepdims=True)
        err = float(np.abs(np.asarray(sims) - Qn @ Tn.T).max())
        self.checks.append(("cosine max |error| vs NumPy", err))


def run(args) -> int:
    import hipsched as hs
    from ..telemetry import analysis, path_from_env

    # the documented precedence: the argument, then the environment, then a fresh file (the demo always
    # logs, since its report is read from the log)
    log = args.log or path_from_env() or _default_log()
    print(f"hipsched demo: telemetry -> {os.path.abspath(log)}")
    with hs.Executor(telemetry_path=log) as ex:
        caps = ex.capabilities()
        if caps.gpu_available:
            print(f"GPU: {caps.gpu_device_name}")
        else:
            print("No GPU in use, so everything runs on the CPU. Why:")
            for reason in caps.reasons or ["(no reason recorded)"]:
                print(f"  - {reason}")
        print(f"CPU kernels: {hs.cpu_features()}")
        w = _Workload(ex, args.quick, args.seed)
        phases = [("search", list(w.search_steps())), ("transformer", list(w.transformer_steps())),
                  ("graph", list(w.graph_steps()))]
        total = sum(len(steps) for _, steps in phases)
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
        for name, value in w.checks:
            print(f"  check: {name}: {value:.3g}")
        print()
        ex.print_debug_summary(file=sys.stdout)
        failed = getattr(ex.telemetry, "writer_error", None)
    print()
    if not os.path.isfile(log):
        print(f"telemetry log {log} could not be written ({failed or 'telemetry off'}); the summary above "
              "is from memory")
        return 0
    if failed is not None:
        print(f"note: writing {log} failed part way ({failed}); the report below covers what was written")
    print(analysis.report([log]))
    print(f"\ntelemetry log: {os.path.abspath(log)}")
    print(f"  follow it:   hipsched monitor {log} --summary")
    print(f"  analyse it:  hipsched analyze {log} --trace trace.json   (or tools/analyze.py from a checkout, "
          f"nothing built)")
    return 0
