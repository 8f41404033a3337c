"""GPU engine benchmark: hipsched's kernels against CuPy and PyTorch on the same device in the same run,
plus the bandwidth targets measured against a device-to-device copy in the same run.

Usage: python bench/gpu_ops.py [--quick]
Exits 0 with a message when there is no GPU. Inputs live on the device (DeviceArray), so the table
measures kernels, not PCIe; each hipsched call is `GpuBackend.run(prepared_call)` plus a synchronize.

Bandwidth rows ("hbm copy" peer): the peer copies, device to device, the same number of bytes the op
reads + writes, so `peer time / our time` is the share of the copy bandwidth the op reaches. Each row's
target column is issue 21's goal, with its floor where the issue names one (`floor`: the least accepted):

| row | peer | goal (floor) |
|---|---|---|
| attention fp16 / bf16 (1,8,2048,64) | torch SDPA, same dtype | 0.5x (0.3x) |
| attention fp32 d=64 / d=128 | torch SDPA fp32 | 0.8x (0.6x) |
| qmatmul Q8_0 / Q4_0 mat-vec | copy of the weight bytes | 0.75x (0.6x) |
| qmatmul Q8_0 with 8 columns | torch mm, float32 W | 1.5x (1x) |
| dequantize Q8_0 / Q4_0 | copy | 0.85x |
| softmax fp32 (8192, 4096) | copy / torch.softmax | 0.85x / 1.1x |
| add / scale fp16, bf16 (64M) | torch, same dtype | 0.95x |
| add / scale fp32 (256 MiB) | copy | 0.92x |
| matmul fp16 / bf16 4096^3 (vendor BLAS) | torch.matmul, same dtype | 0.95x |
| matmul fp32 | torch.matmul (no TF32) | 0.9x |
| cosine_similarity fp32 | copy | 0.7x |

bench/gpu_cases_quant_attention.py, when present, adds cases through `cases(env) -> list[Case]`, env being the
GpuBench below (backend, torch/cupy or None, device(), call(), copy_peer(), sync())."""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from harness import Case, run_cases  # noqa: E402

BW_TARGET = 0.7          # cosine_similarity's share of the copy (issue 18; met at 0.84x on the H100)
ELEMENTWISE_GOAL = 0.92  # add / scale float32 against the copy (issue 21)


class GpuBench:
    """What every GPU case needs: the backend, the peers, device inputs and the copy baseline."""

    def __init__(self, backend, quick=False):
        from hipsched.ops import OPS
        self.backend = backend
        self.rt = backend._ctx.rt
        self.ops = OPS
        self.quick = quick
        self.torch = self._import_torch()
        self.cupy = self._import("cupy")
        self._scratch = None

    @staticmethod
    def _import(name):
        try:
            return __import__(name)
        except Exception:
            return None

    def _import_torch(self):
        torch = self._import("torch")
        return torch if torch is not None and torch.cuda.is_available() else None

    def sync(self):
        self.rt.synchronize()

    def device(self, x):
        from hipsched.gpu.memory.device_array import to_device
        return to_device(np.ascontiguousarray(x, dtype=np.float32), runtime=self.rt)

    def call(self, op, *args, **kwargs):
        """A callable running one prepared hipsched call to completion on the GPU."""
        c = self.ops[op].prepare(*args, **kwargs)
        backend, sync = self.backend, self.sync

        def run():
            backend.run(c)
            sync()
        return run

    def device_as(self, x, dtype: str):
        """A device copy of x in a half dtype ("float16", or "bfloat16" through ml_dtypes)."""
        from hipsched.gpu.memory.device_array import to_device
        from hipsched.gpu.glue.common import np_dtype
        return to_device(np.ascontiguousarray(np.asarray(x, np.float32).astype(np_dtype(dtype))), runtime=self.rt)

    def half_call(self, op, dtype, args, params, size=0):
        """A callable running `op` on device half arrays through the backend with a Call built here,
        so the rows measure the kernels whatever dtypes the op specs accept yet."""
        from hipsched.ops.base import Call
        c = Call(op, tuple(args), dict(params), size, sum(a.nbytes for a in args), dtype=dtype, on_device=True)
        backend, sync = self.backend, self.sync

        def run():
            backend.run(c)
            sync()
        return run

    def copy_peer(self, nbytes):
        """A device-to-device copy moving `nbytes` in total (nbytes/2 read, nbytes/2 written)."""
        half = max(4, int(nbytes) // 2 // 4 * 4)
        if self._scratch is None or self._scratch[0].nbytes < half:
            self._scratch = (self.backend._ctx.empty(half // 4, np.float32, 0),
                             self.backend._ctx.empty(half // 4, np.float32, 0))
        src, dst = self._scratch
        rt, sync = self.rt, self.sync

        def run():
            rt.memcpy_dtod(dst.ptr, src.ptr, half, 0)
            sync()
        return run

    def torch_peer(self, fn):
        torch = self.torch

        def run():
            fn()
            torch.cuda.synchronize()
        return run

    def cupy_peer(self, fn):
        cp = self.cupy

        def run():
            fn()
            cp.cuda.Device().synchronize()
        return run


def copy_bandwidth(env, nbytes=1 << 30, repeat=10):
    """GB/s of a device-to-device copy (bytes read + written per second), timed with events."""
    rt = env.rt
    n = nbytes // 2 // 4
    src, dst = env.backend._ctx.empty(n, np.float32, 0), env.backend._ctx.empty(n, np.float32, 0)
    start, end = rt.event_create(), rt.event_create()
    try:
        rt.memcpy_dtod(dst.ptr, src.ptr, n * 4, 0)
        rt.event_record(start, 0)
        for _ in range(repeat):
            rt.memcpy_dtod(dst.ptr, src.ptr, n * 4, 0)
        rt.event_record(end, 0)
        rt.event_synchronize(end)
        ms = rt.event_elapsed_ms(start, end) / repeat
    finally:
        rt.event_destroy(start)
        rt.event_destroy(end)
    return 2 * n * 4 / (ms / 1e3) / 1e9


def basic_cases(env) -> list[Case]:
    rng = np.random.default_rng(0)
    torch, cp = env.torch, env.cupy
    big = (1 << 24) if env.quick else (1 << 26)          # 64 MiB or 256 MiB of float32
    cases = []

    def add_bw(op, shape, nbytes, ours, target=BW_TARGET):
        cases.append(Case(op, shape, ours, env.copy_peer(nbytes), "hbm copy (same bytes)", bytes=nbytes,
                          target=target, family="gpu"))

    def add_peer(op, shape, ours, name, peer, nbytes=0.0, flops=0.0, target=None):
        cases.append(Case(op, shape, ours, peer, name, bytes=nbytes, flops=flops, target=target, family="gpu"))

    # add / scale
    a, b = rng.standard_normal(big, dtype=np.float32), rng.standard_normal(big, dtype=np.float32)
    da, db = env.device(a), env.device(b)
    shape = f"{big * 4 >> 20} MiB"
    add_bw("add", shape, 12 * big, env.call("add", da, db), ELEMENTWISE_GOAL)
    add_bw("scale", shape, 8 * big, env.call("scale", da, 1.5), ELEMENTWISE_GOAL)
    if torch is not None:
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        add_peer("add", shape, env.call("add", da, db), "torch a+b", env.torch_peer(lambda: ta + tb), 12 * big)
        add_peer("scale", shape, env.call("scale", da, 1.5), "torch 1.5*x", env.torch_peer(lambda: ta * 1.5), 8 * big)
    if cp is not None:
        ca, cb = cp.asarray(a), cp.asarray(b)
        add_peer("add", shape, env.call("add", da, db), "cupy a+b", env.cupy_peer(lambda: ca + cb), 12 * big)

    # softmax over the last axis
    rows = 2048 if env.quick else 8192
    x = rng.standard_normal((rows, 4096), dtype=np.float32)
    dx = env.device(x)
    shape = f"({rows}, 4096) axis=-1"
    add_bw("softmax", shape, 8 * x.size, env.call("softmax", dx), 0.85)
    if torch is not None:
        tx = torch.from_numpy(x).cuda()
        add_peer("softmax", shape, env.call("softmax", dx), "torch.softmax",
                 env.torch_peer(lambda: torch.softmax(tx, -1)), 8 * x.size, target=1.1)

    # cosine similarity and top_k: one 768-d query against 1M (quick: 256K) targets
    n = (1 << 18) if env.quick else (1 << 20)
    T = rng.standard_normal((n, 768), dtype=np.float32)
    q = rng.standard_normal(768, dtype=np.float32)
    dT, dq = env.device(T), env.device(q)
    shape = f"q(768) x T({n},768)"
    tbytes = T.nbytes + 4 * n
    add_bw("cosine_similarity", shape, tbytes, env.call("cosine_similarity", dq, dT))
    if torch is not None:
        tT, tq = torch.from_numpy(T).cuda(), torch.from_numpy(q).cuda()
        cos = lambda: torch.nn.functional.cosine_similarity(tT, tq[None, :], dim=1)  # noqa: E731
        add_peer("cosine_similarity", shape, env.call("cosine_similarity", dq, dT), "torch cosine_similarity",
                 env.torch_peer(cos), tbytes)
        add_peer("top_k", shape + " k=10", env.call("top_k", dq, dT, 10), "torch cosine+topk",
                 env.torch_peer(lambda: torch.topk(cos(), 10)), tbytes)
    if cp is not None:
        cT, cq = cp.asarray(T), cp.asarray(q)
        ccos = lambda: (cT @ cq) / (cp.linalg.norm(cT, axis=1) * cp.linalg.norm(cq))  # noqa: E731
        add_peer("cosine_similarity", shape, env.call("cosine_similarity", dq, dT), "cupy (T@q)/norms",
                 env.cupy_peer(ccos), tbytes)
    del T

    # matmul (vendor BLAS through hipsched vs torch.matmul on the same BLAS)
    size = 2048 if env.quick else 4096
    A = rng.standard_normal((size, size), dtype=np.float32)
    B = rng.standard_normal((size, size), dtype=np.float32)
    dA, dB = env.device(A), env.device(B)
    shape = f"({size},{size}) @ ({size},{size})"
    flops = 2.0 * size ** 3
    if torch is not None:
        tA, tB = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
        torch.backends.cuda.matmul.allow_tf32 = False  # same float32 arithmetic as ours
        add_peer("matmul", shape, env.call("matmul", dA, dB), "torch.matmul (fp32)",
                 env.torch_peer(lambda: tA @ tB), flops=flops, target=0.9)
    if cp is not None:
        cA, cB = cp.asarray(A), cp.asarray(B)
        add_peer("matmul", shape, env.call("matmul", dA, dB), "cupy matmul", env.cupy_peer(lambda: cA @ cB),
                 flops=flops)
    return cases


def half_cases(env) -> list[Case]:
    """float16 and bfloat16 rows against torch in the same dtype (CuPy for float16: it has no bfloat16).
    Bandwidth rows count the half bytes moved, so GB/s compares with the float32 rows directly."""
    rng = np.random.default_rng(1)
    torch, cp = env.torch, env.cupy
    cases = []
    big = (1 << 24) if env.quick else (1 << 26)
    for dtype, tag in (("float16", "fp16"), ("bfloat16", "bf16")):
        tdt = getattr(torch, dtype) if torch is not None else None

        def peer(op, shape, ours, name, fn, nbytes=0.0, flops=0.0, target=None, floor=None):
            cases.append(Case(f"{op} {tag}", shape, ours, fn, name, bytes=nbytes, flops=flops, family="gpu",
                              target=target, floor=floor))

        a, b = rng.standard_normal(big, dtype=np.float32), rng.standard_normal(big, dtype=np.float32)
        da, db = env.device_as(a, dtype), env.device_as(b, dtype)
        add = env.half_call("add", dtype, (da, db), {}, big)
        scale = env.half_call("scale", dtype, (da,), {"alpha": 1.5}, big)
        shape = f"{big // (1 << 20)}M"
        x = rng.standard_normal((2048 if env.quick else 8192, 4096), dtype=np.float32)
        dx = env.device_as(x, dtype)
        softmax = env.half_call("softmax", dtype, (dx,), {"axis": -1}, x.size)
        n = (1 << 16) if env.quick else (1 << 18)
        T, q = rng.standard_normal((n, 768), dtype=np.float32), rng.standard_normal(768, dtype=np.float32)
        dT, dq = env.device_as(T, dtype), env.device_as(q, dtype)
        cos = env.half_call("cosine_similarity", dtype, (dq, dT), {}, n * 768)
        topk = env.half_call("top_k", dtype, (dq, dT), {"k": 10}, n * 768)
        size = 2048 if env.quick else 4096
        A, B = rng.standard_normal((size, size), dtype=np.float32), rng.standard_normal((size, size), dtype=np.float32)
        dA, dB = env.device_as(A, dtype), env.device_as(B, dtype)
        mm = env.half_call("matmul", dtype, (dA, dB), {}, size ** 3)
        qkv = [rng.standard_normal((1, 8, 2048, 64), dtype=np.float32) for _ in range(3)]
        dqkv = [env.device_as(t, dtype) for t in qkv]
        attn = env.half_call("attention", dtype, dqkv, {"causal": False, "scale": None}, 8 * 2048 * 2048 * 64)
        if torch is not None:
            ta, tb = (torch.from_numpy(t).cuda().to(tdt) for t in (a, b))
            peer("add", shape, add, f"torch a+b ({tag})", env.torch_peer(lambda: ta + tb), 6 * big, target=0.95)
            peer("scale", shape, scale, f"torch 1.5*x ({tag})", env.torch_peer(lambda: ta * 1.5), 4 * big,
                 target=0.95)
            tx = torch.from_numpy(x).cuda().to(tdt)
            peer("softmax", f"{x.shape[0]}x4096", softmax, f"torch.softmax ({tag})",
                 env.torch_peer(lambda: torch.softmax(tx, -1)), 4 * x.size)
            tT, tq = torch.from_numpy(T).cuda().to(tdt), torch.from_numpy(q).cuda().to(tdt)
            tcos = lambda: torch.nn.functional.cosine_similarity(tT, tq[None, :], dim=1)  # noqa: E731
            peer("cosine_similarity", f"{n}x768", cos, f"torch cosine_similarity ({tag})", env.torch_peer(tcos),
                 2 * T.size)
            peer("top_k", f"{n}x768 k=10", topk, f"torch cosine+topk ({tag})",
                 env.torch_peer(lambda: torch.topk(tcos(), 10)), 2 * T.size)
            tA, tB = torch.from_numpy(A).cuda().to(tdt), torch.from_numpy(B).cuda().to(tdt)
            peer("matmul", f"{size}^3", mm, f"torch.matmul ({tag})", env.torch_peer(lambda: tA @ tB),
                 flops=2.0 * size ** 3, target=0.95)
            tq3 = [torch.from_numpy(t).cuda().to(tdt) for t in qkv]
            sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(*tq3)  # noqa: E731
            peer("attention", "(1,8,2048,64)", attn, f"torch SDPA ({tag})", env.torch_peer(sdpa),
                 flops=4.0 * 8 * 2048 * 2048 * 64, target=0.5, floor=0.3)
        elif cp is not None and dtype == "float16":
            ca, cb = cp.asarray(a, dtype=cp.float16), cp.asarray(b, dtype=cp.float16)
            peer("add", shape, add, "cupy a+b (fp16)", env.cupy_peer(lambda: ca + cb), 6 * big)
            cA, cB = cp.asarray(A, dtype=cp.float16), cp.asarray(B, dtype=cp.float16)
            peer("matmul", f"{size}^3", mm, "cupy matmul (fp16)", env.cupy_peer(lambda: cA @ cB),
                 flops=2.0 * size ** 3)
    return cases


def main(argv):
    from hipsched.backends.gpu import create_gpu_backend
    backend = create_gpu_backend()
    if not backend.available:
        print(f"bench/gpu_ops.py: no GPU available ({backend.unavailable_reason}); nothing to measure.")
        return 0
    env = GpuBench(backend, quick="--quick" in argv)
    bw = copy_bandwidth(env)
    blas = backend._ctx.blas()
    title = (f"hipsched GPU ops ({backend.device_name}, {backend.device_arch}, runtime={backend.runtime_name}, "
             f"blas={blas.flavour if blas else 'none (tiled kernel)'}; device-to-device copy {bw:.0f} GB/s; "
             f"peers: torch={'yes' if env.torch else 'no'}, cupy={'yes' if env.cupy else 'no'})")
    cases = basic_cases(env)
    from hipsched.errors import GpuError
    try:
        cases += half_cases(env)
    except GpuError as e:   # bfloat16 needs ml_dtypes (np_dtype says so): keep the float32 rows
        print(f"bench/gpu_ops.py: half-precision rows skipped: {e}")
    try:
        import gpu_cases_quant_attention
    except ImportError:
        gpu_cases_quant_attention = None
    if gpu_cases_quant_attention is not None:
        cases += gpu_cases_quant_attention.cases(env)
    run_cases(cases, title, "gpu_ops.md", repeat=5)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
