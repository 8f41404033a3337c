"""GPU benchmark cases for dequantize, qmatmul and attention (bench/gpu_ops.py imports `cases(env)`;
run `python bench/gpu_ops.py`).

Inputs live on the device (quantized weights resident after the warm-up), and every timed call ends
with a device synchronize, so a row compares device work plus each side's launch overhead, same run.
Bandwidth targets are ratios against a device-to-device copy of the same number of bytes (env.copy_peer):
ratio >= 0.75 means >= 75% of the copy's bandwidth, the issue's measure of HBM bandwidth. Goals and
floors are issue 21's (the table in bench/gpu_ops.py).

Peers: qmatmul vs torch mat-vec / matmul on the dequantized float32 matrix (what a framework without
quantized kernels would run); attention vs torch.nn.functional.scaled_dot_product_attention (float32)."""
from __future__ import annotations

import numpy as np

from harness import Case  # bench/ is on sys.path (bench/gpu_ops.py puts it there)

GGML_BLOCK = {"q8_0": (np.dtype([("d", "<f2"), ("qs", "i1", 32)]), 34),
              "q4_0": (np.dtype([("d", "<f2"), ("qs", "u1", 16)]), 18)}


def random_quantized(rng, n, k, qtype):
    """A QuantizedTensor of random blocks (scales ~0.01, all quant values): no CPU quantize pass needed."""
    from hipsched.ops.quant import QuantizedTensor
    dt, _ = GGML_BLOCK[qtype]
    blocks = np.empty(n * (k // 32), dt)
    blocks["d"] = (rng.random(blocks.size) * 0.02).astype(np.float16)
    blocks["qs"] = rng.integers(-128, 128, size=(blocks.size, 32)) if qtype == "q8_0" else \
        rng.integers(0, 256, size=(blocks.size, 16))
    return QuantizedTensor(blocks.view(np.uint8), (n, k), qtype)


def cases(env) -> list:
    """Rows for bench/gpu_ops.py; `env` is its GpuBench (backend, torch or None, device(), call(),
    copy_peer(), torch_peer(), sync(), quick)."""
    torch = env.torch
    rng = np.random.default_rng(0)
    big = 4096 if env.quick else 8192
    rows = []

    def on_device(op, *args, **kwargs):
        """Like env.call, but the result stays on the device even for host-only inputs (dequantize of a
        QuantizedTensor would otherwise download its float result inside the timing)."""
        c = env.ops[op].prepare(*args, **kwargs)
        c.on_device = True
        backend, sync = env.backend, env.sync

        def run():
            backend.run(c)
            sync()
        return run

    # ---- dequantize: bandwidth vs a copy of the same bytes
    for qtype in ("q8_0", "q4_0"):
        w = random_quantized(rng, big, big, qtype)
        moved = w.nbytes + 4 * big * big
        rows.append(Case("dequantize", f"{qtype} {big}x{big}", on_device("dequantize", w), env.copy_peer(moved),
                         "hbm copy (same bytes)", bytes=moved, target=0.85, family="gpu-quant"))

    # ---- qmatmul mat-vec: bandwidth vs copy, and vs torch mv on the float matrix
    shapes = [(big, big)] if env.quick else [(8192, 8192), (16384, 16384), (14336, 4096)]
    for qtype in ("q8_0", "q4_0"):
        for n, k in shapes:
            w = random_quantized(rng, n, k, qtype)
            x = rng.standard_normal(k).astype(np.float32)
            ours = env.call("qmatmul", w, env.device(x))
            moved = w.nbytes + 4 * (k + n)
            rows.append(Case("qmatmul", f"{qtype} ({n},{k}) x vec", ours, env.copy_peer(moved),
                             "hbm copy (same bytes)", bytes=moved, target=0.75, floor=0.6, family="gpu-quant"))
            if torch is not None and n * k <= 8192 * 8192:
                wf, xt = torch.from_numpy(_dequantized(w)).cuda(), torch.from_numpy(x).cuda()
                rows.append(Case("qmatmul", f"{qtype} ({n},{k}) x vec", ours,
                                 env.torch_peer(lambda wf=wf, xt=xt: torch.mv(wf, xt)), "torch mv, float32 W",
                                 bytes=moved, family="gpu-quant"))

    # ---- qmatmul with 8 columns: torch mm reads 4x the bytes (float32 W), so >= 1.5x is the bandwidth's due
    if torch is not None:
        w = random_quantized(rng, big, big, "q8_0")
        xm = rng.standard_normal((big, 8)).astype(np.float32)
        wf, xt = torch.from_numpy(_dequantized(w)).cuda(), torch.from_numpy(xm).cuda()
        rows.append(Case("qmatmul", f"q8_0 ({big},{big}) x ({big},8)", env.call("qmatmul", w, env.device(xm)),
                         env.torch_peer(lambda: torch.mm(wf, xt)), "torch mm, float32 W",
                         bytes=w.nbytes + 4 * 8 * 2 * big, flops=2.0 * big * big * 8, target=1.5, floor=1.0,
                         family="gpu-quant"))

    # ---- attention vs torch SDPA fp32 (memory-efficient kernel): goal 0.8x, floor 0.6x
    if torch is not None:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        shapes = [(1, 8, 1024, 64)] if env.quick else [(1, 8, 2048, 64), (1, 8, 2048, 128), (4, 16, 1024, 64)]
        for (b, h, s, d) in shapes:
            q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
            tq, tk, tv = (torch.from_numpy(a).cuda() for a in (q, k, v))
            dq, dk, dv = env.device(q), env.device(k), env.device(v)
            for causal in (False, True):
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                rows.append(Case("attention", f"b{b} h{h} s{s} d{d}{' causal' if causal else ''}",
                                 env.call("attention", dq, dk, dv, causal=causal),
                                 env.torch_peer(lambda c=causal, tq=tq, tk=tk, tv=tv: sdpa(tq, tk, tv, is_causal=c)),
                                 "torch SDPA fp32", flops=flops, target=0.8, floor=0.6, family="gpu-attention"))
    return rows


def _dequantized(w):
    """Float32 matrix of a QuantizedTensor by NumPy (fp16 scale times quants), for the torch peers."""
    dt, _ = GGML_BLOCK[w.qtype]
    blocks = np.asarray(w.data).reshape(-1).view(dt)
    d = blocks["d"].astype(np.float32)[:, None]
    if w.qtype == "q8_0":
        q = blocks["qs"].astype(np.float32)
    else:
        qs = blocks["qs"]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
    return (q * d).reshape(w.shape)


