"""LLM decode, op by op: tokens per second of a Llama-architecture model (examples/llama_model.py) decoded
token by token with a KV cache from hipsched's public ops, for backend auto, CPU-only and GPU-only, against
torch CPU eager on the same weights (dequantized to float32 by the `gguf` package), per weight type; what
the scheduler did per op (calls and time per side, from the telemetry); and, on a GPU, the decode with a
resident budget of a half and a quarter of the weights against all-CPU and all-resident (issue 34).

    python bench/decode.py                              # small preset, float32 / q8_0 / q4_0
    python bench/decode.py --preset 1b --layers 4 --vocab 32000 --weights float32,q8_0

Each row times `--tokens` decode steps after `--warmup` steps (the scheduler's learning happens in the
warm-up; the cache is reset before each block), hipsched and torch alternately, `--repeat` times, the
median block reported. The table is printed and written to bench/results/decode.md. Both sides use as many
threads as hipsched's kernels do (HIPSCHED_NUM_THREADS, default every core; torch.set_num_threads to the
same); on a loaded machine, one thread each (HIPSCHED_NUM_THREADS=1 OMP_NUM_THREADS=1
OPENBLAS_NUM_THREADS=1, the last for NumPy's BLAS, which hipsched's float matmul calls) keeps a side from
waiting on a descheduled thread of its own.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import CPU_SETTLE_S  # noqa: E402  (bench/ on the path above; harness puts a built checkout first)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "examples"))
import llama_model as lm  # noqa: E402  (the example's model: the benchmark decodes what a user would)

TARGETS = {"float32": 1.0, "q8_0": 1.5}   # issue 34: tokens/s against torch CPU eager on float32 weights


def _time_block(step, reset, warm, tokens, prompt, warmed=None):
    """Seconds per token over `tokens` steps after `warm` steps, from a fresh cache; `warmed()` runs between
    the two (the telemetry cleared, so what is counted is the timed steps')."""
    reset()
    tok = prompt
    for _ in range(warm):
        tok = step(tok)
    if warmed is not None:
        warmed()
    t = time.perf_counter()
    for _ in range(tokens):
        tok = step(tok)
    return (time.perf_counter() - t) / tokens


def _hs_stepper(dec):
    def step(tok):
        return int(np.argmax(dec.step(tok)))
    return step


def _torch_stepper(ref):
    def step(tok):
        return int(ref.step(tok).argmax())
    return step


def _per_op(events):
    """{op: {side: [calls, total us]}} from telemetry events."""
    out = {}
    for e in events:
        d = out.setdefault(e["op"], {}).setdefault(e["backend"], [0, 0.0])
        d[0] += 1
        d[1] += e.get("duration_us") or 0.0
    return out


def _gpu_info():
    """(whether a GPU backend is there, its name)."""
    import hipsched
    with hipsched.Executor(persist_model=False, telemetry_enabled=False) as probe:
        caps = probe.capabilities()
    return caps.gpu_available, caps.gpu_device_name


def _executor(mode, gpu, **cfg):
    import hipsched
    if mode == "cpu":
        cfg.update(strategy="backend_only", backend="cpu")
    elif mode == "gpu":
        cfg.update(strategy="backend_only", backend="gpu", allow_fallback=False)
    return hipsched.Executor(persist_model=False, telemetry_ring_size=1 << 20, **cfg)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(lm.PRESETS), default="small")
    ap.add_argument("--layers", type=int, help="n_layers instead of the preset's")
    ap.add_argument("--vocab", type=int, help="vocab instead of the preset's (memory: the table says so)")
    ap.add_argument("--max-seq", type=int, help="KV cache length instead of the preset's")
    ap.add_argument("--weights", default="float32,q8_0,q4_0")
    ap.add_argument("--modes", default="auto,cpu,gpu")
    ap.add_argument("--budgets", default="0.5,0.25", help="resident budgets as shares of the weights (GPU only)")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps timed per block")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--prompt-pos", type=int, default=0, help="cache positions filled before timing (context)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the GGUF files are written (default: a temp dir)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "decode.md"))
    args = ap.parse_args(argv)

    import torch
    import hipsched
    torch.set_num_threads(hipsched.HybridConfig(config_file=False).num_threads)

    base = lm.PRESETS[args.preset]
    cfg = base.replace(n_layers=args.layers, vocab=args.vocab, max_seq=args.max_seq)
    need_seq = args.prompt_pos + args.warmup + args.tokens
    if need_seq > cfg.max_seq:
        cfg = cfg.replace(max_seq=need_seq)
    changed = [f"{k} {getattr(cfg, k)} (preset {getattr(base, k)})" for k in ("n_layers", "vocab", "max_seq")
               if getattr(cfg, k) != getattr(base, k)]
    weights = [w for w in args.weights.split(",") if w]
    modes = [m for m in args.modes.split(",") if m]
    has_gpu, gpu_name = _gpu_info()

    lines = [f"## LLM decode (bench/decode.py): preset `{args.preset}`" + (f", {', '.join(changed)}" if changed else ""),
             "",
             f"{cfg.n_layers} layers, dim {cfg.dim}, {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads of {cfg.head_dim}, "
             f"ffn {cfg.ffn_dim}, vocab {cfg.vocab}{' (tied head)' if cfg.tie_embeddings else ''}: "
             f"{cfg.n_params() / 1e6:.0f} M parameters; q/k/v and gate/up weights stacked at load (fuse=True). Batch 1; {args.tokens} timed steps after {args.warmup} "
             f"warm-up steps from cache position {args.prompt_pos}, median of {args.repeat} blocks, hipsched and "
             f"torch alternately. Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, "
             f"{'GPU ' + str(gpu_name) if has_gpu else 'no GPU'}; hipsched and torch {torch.__version__} with "
             f"{torch.get_num_threads()} threads (OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}); "
             f"load average at start {os.getloadavg()[0]:.1f}; one OpenMP runtime for both (torch imported first: its "
             f"libgomp), threads waiting {hipsched.cpu_features()['omp_wait'].split(':')[0]}.", ""]
    head = ("| weights | hipsched backend | hipsched tok/s | torch CPU eager tok/s (float32 weights) | ratio | target "
            "| max rel. err vs torch (64 steps) |")
    table = [head, "|---|---|---|---|---|---|---|"]
    op_tables = []
    budget_rows = []
    tmpdir = args.dir or tempfile.mkdtemp(prefix="hipsched-decode-")
    print("\n".join(lines + table), flush=True)
    for wd in weights:
        path = lm.model_path(tmpdir, cfg, wd)
        if not os.path.exists(path):
            t = time.perf_counter()
            lm.write_gguf(path, cfg, wd)
            print(f"wrote {path} in {time.perf_counter() - t:.1f} s", flush=True)
        model = lm.load_gguf(path)
        ref = lm.TorchLlama(model)
        torch_step = _torch_stepper(ref)
        wbytes = sum(getattr(v, "nbytes", 0) for v in model.tensors.values())
        # accuracy: 64 greedy steps (fewer if the cache is shorter) against the reference's whole-sequence pass
        n_chk = min(64, cfg.max_seq - 1)
        with _executor("cpu", has_gpu) as ex:
            out, logits = lm.HipschedLlama(model, ex).generate([1], n_chk)
        rel, differ = lm.compare_logits(logits, ref.forward([1] + out[:-1]))
        acc = f"{rel:.1e}, top-1 differs at {len(differ)} of {n_chk}"
        for mode in modes:
            if mode == "gpu" and not has_gpu:
                table.append(f"| {wd} | gpu | no GPU | | | | |")
                continue
            with _executor(mode, has_gpu) as ex:
                # with a GPU the KV caches are resident: its attention calls read their device copies
                dec = lm.HipschedLlama(model, ex, resident_cache=has_gpu and mode != "cpu")
                hs_step = _hs_stepper(dec)

                def reset():
                    dec.reset()
                    for _ in range(args.prompt_pos):
                        dec.step(1)

                def treset():
                    ref.reset()
                    for _ in range(args.prompt_pos):
                        ref.step(1)

                th, tt, block_events = [], [], []
                for _ in range(args.repeat):
                    time.sleep(CPU_SETTLE_S)
                    th.append(_time_block(hs_step, reset, args.warmup, args.tokens, 1, ex.clear_telemetry))
                    block_events.append(list(ex.events))
                    time.sleep(CPU_SETTLE_S)
                    tt.append(_time_block(torch_step, treset, args.warmup, args.tokens, 1))
                dec.close()
            # the per-op table is the median block's own telemetry, so its times add up to that block's
            median = int(np.argsort(th)[len(th) // 2])
            th, tt, events = th[median], float(np.median(tt)), block_events[median]
            ratio = tt / th
            goal = TARGETS.get(wd) if mode in ("auto", "cpu") else None
            verdict = "" if goal is None else f">= {goal:g}x {'ok' if ratio >= goal else 'MISSED'}"
            row = (f"| {wd} | {mode} | {1 / th:.1f} | {1 / tt:.1f} | {ratio:.2f}x | {verdict} | "
                   f"{acc if mode == modes[0] else ''} |")
            print(row, flush=True)
            table.append(row)
            # what the scheduler did in the last timed block (the warm-up's events were cleared)
            per = _per_op([e for e in events])
            step_us = th * 1e6
            op_tables.append(f"\n**{wd}, backend {mode}** ({step_us / 1e3:.2f} ms a token, the median block; calls "
                             f"and time per token from that block's telemetry):\n")
            op_tables.append("| op | CPU calls/token | GPU calls/token | time/token | share of the step |")
            op_tables.append("|---|---|---|---|---|")
            for op, sides in sorted(per.items(), key=lambda kv: -sum(v[1] for v in kv[1].values())):
                tot = sum(v[1] for v in sides.values()) / args.tokens
                op_tables.append(f"| {op} | {sides.get('cpu', [0])[0] / args.tokens:g} | "
                                 f"{sides.get('gpu', [0])[0] / args.tokens:g} | {tot / 1e3:.3f} ms | "
                                 f"{tot / step_us:.0%} |")
            covered = sum(v[1] for s in per.values() for v in s.values()) / args.tokens
            op_tables.append(f"| (outside the ops: cache writes, reshapes, argmax, Python) | | | "
                             f"{(step_us - covered) / 1e3:.3f} ms | {(step_us - covered) / step_us:.0%} |")
        # weights that do not fit: a resident budget below the weights' bytes. Each run but all-CPU starts
        # with one step forced onto the GPU, which uploads every weight and leaves the cache holding what its
        # budget allows (least recently used out: the last layers' weights stay); from then on `auto` decides
        # each call, a kept weight charged no upload. All-resident keeps the default budget (half the free
        # device memory) and pins the float weights with Executor.resident.
        for share in [float(s) for s in args.budgets.split(",") if s] if has_gpu else []:
            res = {}
            for label, mode, kw, pin in (("all-CPU", "cpu", {}, False), ("all-resident", "auto", {}, True),
                                         ("budget", "auto", {"resident_bytes": int(share * wbytes)}, False)):
                with _executor(mode, has_gpu, **kw) as ex:
                    dec = lm.HipschedLlama(model, ex, resident=pin, resident_cache=mode != "cpu")
                    if mode != "cpu":
                        dec.backend = "gpu"
                        dec.step(1)
                        dec.backend = "auto"
                    t = _time_block(_hs_stepper(dec), dec.reset, args.warmup, args.tokens, 1, ex.clear_telemetry)
                    per = _per_op(ex.events)
                    dec.close()
                gpu_ops = ", ".join(f"{op} {v.get('gpu', [0])[0] / args.tokens:g}/"
                                    f"{sum(x[0] for x in v.values()) / args.tokens:g}" for op, v in sorted(per.items())
                                    if v.get("gpu"))
                res[label] = (1 / t, gpu_ops or "none")
            b = res["budget"]
            budget_rows.append(f"| {wd} | {share:g} x {wbytes / 2**20:.0f} MiB | {b[0]:.1f} | {b[1]} | "
                               f"{res['all-CPU'][0]:.1f} | {res['all-resident'][0]:.1f} ({res['all-resident'][1]}) | "
                               f"{b[0] / res['all-CPU'][0]:.2f}x | {b[0] / res['all-resident'][0]:.2f}x |")
            print(budget_rows[-1], flush=True)
    out = lines + table + [""] + op_tables + [""]
    out.append("**Weights that do not fit** (resident budget a share of the weights' bytes; auto):\n")
    if budget_rows:
        out += ["| weights | budget | tok/s | GPU calls/token per op (GPU/all) | all-CPU tok/s | all-resident tok/s "
                "(GPU calls) | vs all-CPU | vs all-resident |", "|---|---|---|---|---|---|---|---|"] + budget_rows
    else:
        out.append("no GPU: the resident-budget runs need one (skipped).")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out[len(lines):]))
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
