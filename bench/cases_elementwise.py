"""Elementwise benchmarks: add and scale on 64 MB against NumPy (memory-bound: the target is parity),
softmax over the last axis of (4096, 4096) against torch.softmax and NumPy's exp(x - max) / sum; the
same in float16 (add, scale against NumPy float16, whose GB/s sit beside a measured copy's) and softmax
in float16 and bfloat16 against torch.softmax in the same dtype."""
import time

import numpy as np

from harness import Case


def _copy_bandwidth(src):
    """Read+write GB/s of np.copyto over src (the memory roof an elementwise op can reach here), best of 5."""
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2.0 * src.nbytes / best / 1e9


def cases():
    import hipsched as hs

    rng = np.random.default_rng(0)
    ex = hs.Executor()
    out = []

    n = 16 << 20  # 64 MB of float32 per operand
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    out.append(Case("add", "a(16M) + b(16M), 64 MB each", lambda: ex.add(a, b, backend="cpu"), lambda: np.add(a, b),
                    "numpy a+b", bytes=12.0 * n, target=0.9, family="elementwise"))
    out.append(Case("scale", "2.5 * x(16M), 64 MB", lambda: ex.scale(a, 2.5, backend="cpu"), lambda: a * np.float32(2.5),
                    "numpy x*alpha", bytes=8.0 * n, target=0.9, family="elementwise"))

    x = rng.standard_normal((4096, 4096), dtype=np.float32)

    def numpy_softmax():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    out.append(Case("softmax", "(4096, 4096), axis -1", lambda: ex.softmax(x, backend="cpu"), numpy_softmax,
                    "numpy exp(x-max)/sum", bytes=8.0 * x.size, target=4.0, family="elementwise"))
    try:
        import torch
    except ImportError:
        print("cases_elementwise: torch not installed, softmax vs torch skipped")
    else:
        xt = torch.from_numpy(x)
        out.append(Case("softmax", "(4096, 4096), axis -1", lambda: ex.softmax(x, backend="cpu"),
                        lambda: torch.softmax(xt, -1), f"torch.softmax ({torch.get_num_threads()} threads)",
                        bytes=8.0 * x.size, target=1.0, family="elementwise"))

    # float16: 64 MB per operand (32M elements); NumPy float16 arithmetic is the peer
    nh = 32 << 20
    ah = rng.standard_normal(nh, dtype=np.float32).astype(np.float16)
    bh = rng.standard_normal(nh, dtype=np.float32).astype(np.float16)
    bw = _copy_bandwidth(ah)
    out.append(Case("add", f"fp16 a(32M) + b(32M), 64 MB each (copy: {bw:.1f} GB/s r+w)",
                    lambda: ex.add(ah, bh, backend="cpu"), lambda: np.add(ah, bh), "numpy float16 a+b",
                    bytes=6.0 * nh, target=0.9, family="elementwise"))
    out.append(Case("scale", f"fp16 2.5 * x(32M), 64 MB (copy: {bw:.1f} GB/s r+w)",
                    lambda: ex.scale(ah, 2.5, backend="cpu"), lambda: ah * np.float16(2.5), "numpy float16 x*alpha",
                    bytes=4.0 * nh, target=0.9, family="elementwise"))

    try:
        import torch
    except ImportError:
        return out
    halves = [("fp16", np.float16, torch.float16)]
    try:
        import ml_dtypes
        halves.append(("bf16", ml_dtypes.bfloat16, torch.bfloat16))
    except ImportError:
        print("cases_elementwise: ml_dtypes not installed, bf16 softmax skipped")
    for label, dt, tdt in halves:
        xh = x.astype(dt)
        xth = torch.from_numpy(x).to(tdt)
        out.append(Case("softmax", f"{label} (4096, 4096), axis -1", lambda xh=xh: ex.softmax(xh, backend="cpu"),
                        lambda xth=xth: torch.softmax(xth, -1),
                        f"torch.softmax {label} ({torch.get_num_threads()} threads)",
                        bytes=4.0 * x.size, target=2.0, family="elementwise"))
    return out
