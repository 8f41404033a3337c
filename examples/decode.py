"""Decode a Llama-architecture GGUF model with hipsched, token by token with a KV cache.

    python examples/decode.py                       # tiny random model, q8_0, 32 tokens, checked with torch
    python examples/decode.py --weights q4_0 --tokens 64 --backend cpu
    python examples/decode.py --gguf model.gguf     # a file you have (F32 / Q8_0 / Q4_0 tensors, llama arch)

Without --gguf it writes a model of random weights (seeded) to a GGUF file first, as a converter would,
then reads it back as any GGUF file is read. The model code is examples/llama_model.py; the user guide
is docs/guide/decode.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_model as lm  # noqa: E402  (the example's own module, beside this file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(lm.PRESETS), default="tiny")
    ap.add_argument("--weights", choices=lm.WEIGHT_DTYPES, default="q8_0")
    ap.add_argument("--gguf", help="a GGUF Llama file to decode instead of a random one")
    ap.add_argument("--tokens", type=int, default=32, help="tokens to generate")
    ap.add_argument("--prompt", default="1,2,3", help="prompt token ids, comma-separated")
    ap.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the torch reference")
    args = ap.parse_args(argv)

    import numpy as np
    import hipsched

    with tempfile.TemporaryDirectory() as tmp:
        path = args.gguf or lm.write_gguf(os.path.join(tmp, "model.gguf"), lm.PRESETS[args.preset], args.weights)
        model = lm.load_gguf(path)
        cfg = model.cfg
        prompt = [int(t) for t in args.prompt.split(",")]
        if len(prompt) + args.tokens > cfg.max_seq:
            sys.exit(f"prompt + tokens = {len(prompt) + args.tokens} exceeds the cache ({cfg.max_seq} positions)")
        print(f"model: {cfg.n_layers} layers, dim {cfg.dim}, {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads of "
              f"{cfg.head_dim}, ffn {cfg.ffn_dim}, vocab {cfg.vocab}; weights {model.weight_dtype} "
              f"({cfg.n_params() / 1e6:.1f} M parameters)")
        with hipsched.Executor(persist_model=False) as ex:
            dec = lm.HipschedLlama(model, ex, backend=args.backend)
            t0 = time.perf_counter()
            out, logits = dec.generate(prompt, args.tokens)
            dt = time.perf_counter() - t0
            steps = len(prompt) + args.tokens - 1
            print(f"generated: {out}")
            print(f"{steps} steps in {dt:.3f} s: {steps / dt:.1f} tokens/s (backend {args.backend}, first steps "
                  f"include the scheduler's learning)")
            sides = {}
            for e in ex.events:
                sides.setdefault(e["op"], {}).setdefault(e["backend"], 0)
                sides[e["op"]][e["backend"]] += 1
            print("calls per op and side: " + ", ".join(f"{op} {d}" for op, d in sorted(sides.items())))
        if not args.no_check:
            ref = lm.TorchLlama(model).forward(prompt + out[:-1])
            rel, differ = lm.compare_logits(logits, ref)
            print(f"against torch (dequantized weights, whole sequence, explicit causal mask): max relative "
                  f"error {rel:.2e}, top-1 differs at {len(differ)} of {steps} steps")
            return 0 if rel < 1e-4 and not differ else 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
