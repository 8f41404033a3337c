"""Elementwise benchmarks: add and scale on 64 MB against NumPy (memory-bound: the target is parity),
softmax over the last axis of (4096, 4096) against torch.softmax and NumPy's exp(x - max) / sum; the
same in float16 (add, scale against NumPy float16, whose GB/s sit beside a measured copy's) and softmax
in float16 and bfloat16 against torch.softmax in the same dtype. silu_mul and rope (the transformer
element-wise ops, issue 34: goal >= 0.8x the copy bandwidth for large inputs) against np.copyto of the
same number of bytes (read + write) into a preallocated array, measured beside them: the ratio is the
share of this machine's copy bandwidth the op reaches (its result is a new array each call; the copyto
peer allocates nothing, so rows against np.copy, which allocates, follow, and then rows with out= into
memory already there, silu_mul into a preallocated array and rope in place, the peer's terms exactly;
scale's row beside the copy shows where an existing one-pass op stands). gelu beside torch's gelu."""
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

    out += _transformer_cases(ex, rng)

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


def _copy_peer(nbytes, dtype):
    """np.copyto over an array of nbytes / 2 bytes: nbytes of traffic (read + write), preallocated."""
    src = np.ones(int(nbytes // 2 // np.dtype(dtype).itemsize), dtype)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def _transformer_cases(ex, rng):
    out = []
    halves = [("fp16", np.float16)]
    try:
        import ml_dtypes
        halves.append(("bf16", ml_dtypes.bfloat16))
    except ImportError:
        print("cases_elementwise: ml_dtypes not installed, bf16 rows skipped")
    n = 16 << 20   # 64 MB per float32 operand
    g32, u32 = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    # the share of the copy bandwidth an existing one-pass op reaches on the same machine, for scale
    out.append(Case("scale", "f32 2.5 * x(16M), 64 MB, beside the copy", lambda: ex.scale(g32, 2.5, backend="cpu"),
                    _copy_peer(2.0 * g32.nbytes, np.float32), "np.copyto of 64 MB (r+w)", bytes=2.0 * g32.nbytes,
                    family="elementwise"))
    for label, dt in [("f32", np.float32)] + halves:
        g, u = g32.astype(dt), u32.astype(dt)
        traffic = 3.0 * g.nbytes   # gate and up read, the result written
        out.append(Case("silu_mul", f"{label} gate, up (16M), {g.nbytes >> 20} MB each",
                        lambda g=g, u=u: ex.silu_mul(g, u, backend="cpu"), _copy_peer(traffic, dt),
                        f"np.copyto of {traffic / 2**20:.0f} MB (r+w)", bytes=traffic, target=0.8, family="elementwise"))
    # a Llama-7B/8B prefill block of 4096 tokens: 32 heads of d = 128, positions 0 .. 4095
    x32 = rng.standard_normal((1, 32, 4096, 128), dtype=np.float32)
    pos = np.arange(4096)
    for label, dt in [("f32", np.float32)] + halves:
        x = x32.astype(dt)
        for style in ("neox", "gptj"):
            out.append(Case("rope", f"{label} {style} (1, 32, 4096, 128), {x.nbytes >> 20} MB",
                            lambda x=x, style=style: ex.rope(x, pos, style=style, backend="cpu"),
                            _copy_peer(2.0 * x.nbytes, dt), f"np.copyto of {x.nbytes >> 20} MB (r+w)",
                            bytes=2.0 * x.nbytes, target=0.8, family="elementwise"))
    # the same against a copy that allocates its result, as every hipsched op does (np.copy): what the
    # fresh result's page faults cost is then on both sides
    # (a fresh result of 32-64 MB is mmapped and faulted in page by page: on the development machine that
    # is as long as the kernel, so against np.copyto, which writes into memory already there, every row
    # measures the allocator as much as the op)
    for label, dt in [("f32", np.float32)] + halves:
        g, u, x = g32.astype(dt), u32.astype(dt), x32.astype(dt)
        src = np.ones(3 * n // 2, dt)
        out.append(Case("silu_mul", f"{label} gate, up (16M), {g.nbytes >> 20} MB each, vs an allocating copy",
                        lambda g=g, u=u: ex.silu_mul(g, u, backend="cpu"), lambda src=src: np.copy(src),
                        f"np.copy of {src.nbytes >> 20} MB (r+w {2 * src.nbytes >> 20} MB)", bytes=3.0 * g.nbytes,
                        target=0.8, family="elementwise"))
        out.append(Case("rope", f"{label} neox (1, 32, 4096, 128), {x.nbytes >> 20} MB, vs an allocating copy",
                        lambda x=x: ex.rope(x, pos, backend="cpu"), lambda x=x: np.copy(x),
                        f"np.copy of {x.nbytes >> 20} MB (r+w)", bytes=2.0 * x.nbytes, target=0.8,
                        family="elementwise"))
    # out= into an array already there (rope in place, as a decode loop runs it on its q and k): the
    # same memory as the copyto peer's, so these rows are the kernels against the copy bandwidth alone
    for label, dt in [("f32", np.float32)] + halves:
        g, u, x = g32.astype(dt), u32.astype(dt), x32.astype(dt)
        res = np.empty_like(g)
        traffic = 3.0 * g.nbytes
        out.append(Case("silu_mul", f"{label} gate, up (16M), {g.nbytes >> 20} MB each, out= preallocated",
                        lambda g=g, u=u, res=res: ex.silu_mul(g, u, out=res, backend="cpu"), _copy_peer(traffic, dt),
                        f"np.copyto of {traffic / 2**20:.0f} MB (r+w)", bytes=traffic, target=0.8, family="elementwise"))
        for style in ("neox", "gptj"):
            mine = x.copy()   # rotated again each call: a rotation keeps every pair's length
            out.append(Case("rope", f"{label} {style} (1, 32, 4096, 128), {x.nbytes >> 20} MB, in place (out=x)",
                            lambda mine=mine, style=style: ex.rope(mine, pos, style=style, out=mine, backend="cpu"),
                            _copy_peer(2.0 * x.nbytes, dt), f"np.copyto of {x.nbytes >> 20} MB (r+w)",
                            bytes=2.0 * x.nbytes, target=0.8, family="elementwise"))
    # decode: one token, 32 heads, at position 4095 (latency: the table and the call overhead)
    xd = rng.standard_normal((1, 32, 1, 128), dtype=np.float32)
    pd = np.array([4095])
    out.append(Case("rope", "f32 neox decode (1, 32, 1, 128), 16 KB", lambda: ex.rope(xd, pd, backend="cpu"),
                    _copy_peer(2.0 * xd.nbytes, np.float32), "np.copyto of 16 KB (r+w)", bytes=2.0 * xd.nbytes,
                    family="elementwise"))
    try:
        import torch
    except ImportError:
        return out
    xt = torch.from_numpy(g32)
    for form in ("none", "tanh"):
        out.append(Case("gelu", f"f32 x(16M), approximate={form}",
                        lambda form=form: ex.gelu(g32, approximate=form, backend="cpu"),
                        lambda form=form: torch.nn.functional.gelu(xt, approximate=form),
                        f"torch gelu ({torch.get_num_threads()} threads)", bytes=2.0 * g32.nbytes, family="elementwise"))
    ut = torch.from_numpy(u32)
    out.append(Case("silu_mul", "f32 gate, up (16M) vs torch", lambda: ex.silu_mul(g32, u32, backend="cpu"),
                    lambda: torch.nn.functional.silu(xt) * ut, f"torch silu(g)*u ({torch.get_num_threads()} threads)",
                    bytes=3.0 * g32.nbytes, family="elementwise"))
    return out
