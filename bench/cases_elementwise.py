"""Elementwise benchmarks: add and scale on 64 MB against NumPy (memory-bound: the target is parity),
softmax over the last axis of (4096, 4096) against torch.softmax and NumPy's exp(x - max) / sum."""
import numpy as np

from harness import Case


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
    return out
