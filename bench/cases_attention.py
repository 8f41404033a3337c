"""Attention benchmarks: hipsched's tiled CPU kernel against PyTorch's CPU
scaled_dot_product_attention (its flash kernel) on the same float32 arrays, both using all cores; and
in bfloat16 and float16 against PyTorch's SDPA in the same dtype (issue 11)."""
import numpy as np

from harness import Case


def cases():
    import torch
    import torch.nn.functional as F

    import hipsched as hs

    rng = np.random.default_rng(0)
    ex = hs.Executor()
    b, h, s, d = 1, 8, 2048, 64
    q, k, v = (rng.standard_normal((b, h, s, d), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))  # zero-copy views of the same memory
    out = []
    for causal in (False, True):
        flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        out.append(Case("attention", f"({b},{h},{s},{d}){' causal' if causal else ''}",
                        lambda c=causal: ex.attention(q, k, v, causal=c, backend="cpu"),
                        lambda c=causal: F.scaled_dot_product_attention(tq, tk, tv, is_causal=c),
                        f"torch sdpa ({torch.get_num_threads()} threads)", flops=flops, target=1.0,
                        family="attention"))
    try:
        import ml_dtypes
    except ImportError:
        print("cases_attention: ml_dtypes not installed, half rows skipped")
        return out
    flops = 4.0 * b * h * s * s * d
    for name, dt, tdt in (("bf16", ml_dtypes.bfloat16, torch.bfloat16), ("fp16", np.float16, torch.float16)):
        qh, kh, vh = (x.astype(dt) for x in (q, k, v))
        th = tuple(torch.from_numpy(x).to(tdt) for x in (q, k, v))
        out.append(Case("attention", f"({b},{h},{s},{d}) {name}", lambda a=(qh, kh, vh): ex.attention(*a, backend="cpu"),
                        lambda a=th: F.scaled_dot_product_attention(*a),
                        f"torch sdpa {name} ({torch.get_num_threads()} threads)", flops=flops, target=1.0,
                        family="attention"))
    return out
