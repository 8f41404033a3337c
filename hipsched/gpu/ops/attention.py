"""GPU launch glue for attention (kernel: src_c/hip/attention.hip, fp32 flash attention).

q (B, H, Sq, hd), k and v (B, H, Sk, hd) contiguous, all float32, float16 or bfloat16 (Call.dtype; the
output has that dtype, the kernel keeps float32 running max, sum and output); the kernel for the smallest head-dim
class >= hd runs with the rest of the dims zero-padded in registers (hd up to 256)."""
from __future__ import annotations

import ctypes
import math

from ...errors import GpuError
from ..launch.context import Launch, pure_plan
from .common import KERNEL_SUFFIX, kernel_suffix, np_dtype

HEAD_DIM_CLASSES = (32, 64, 128, 256)
MAX_HEAD_DIM = HEAD_DIM_CLASSES[-1]
_THREADS = 128  # HSA_THREADS
_ROWS_PER_THREAD = 2  # HSA_R
_DIMS_PER_THREAD = 16  # a query row is spread over head_dim_class / 16 threads


def head_dim_class(hd: int) -> int:
    for d in HEAD_DIM_CLASSES:
        if hd <= d:
            return d
    raise GpuError("unsupported", f"attention: head_dim {hd} exceeds the GPU kernel's maximum {MAX_HEAD_DIM}")


@pure_plan
def attention_launches(b: int, h: int, sq: int, hd: int, suffix: str = "f32") -> list[Launch]:
    """One block per ROWS query rows of one (batch, head), all on grid x."""
    d = head_dim_class(hd)
    rows = _ROWS_PER_THREAD * _THREADS // (d // _DIMS_PER_THREAD)
    name = f"hs_attention_d{d}" if suffix == "f32" else f"hs_attention_{suffix}_d{d}"
    return [Launch.of("attention", name, -(-sq // rows) * b * h, _THREADS)]


def attention_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    b, h, sq, hd = (int(s) for s in call.args[0].shape)
    head_dim_class(hd)  # an empty call with too large a head_dim is refused as well: the kernels never take it
    return attention_launches(b, h, sq, hd, suffix) if b * h * sq * hd else []


def attention(ctx, call, stream):
    plan = ctx.check_launches(attention_plan(ctx, call))  # before any upload: an unsupported call costs nothing
    b, h, sq, hd = (int(s) for s in call.args[0].shape)
    sk = int(call.args[1].shape[2])
    causal = bool(call.params.get("causal", False))
    scale = call.params.get("scale")
    out = ctx.empty((b, h, sq, hd), np_dtype(call.dtype), stream)
    if not plan:
        return ctx.finish(out, call, stream)
    (launch,) = plan
    q, k, v = (ctx.upload(a, stream) for a in call.args[:3])
    scale = 1.0 / math.sqrt(hd) if scale is None else float(scale)
    ctx.run(launch, (q, k, v, out, ctypes.c_int64(sq), ctypes.c_int64(sk), ctypes.c_int32(hd),
                     ctypes.c_float(scale), ctypes.c_int32(1 if causal else 0)), stream)
    return ctx.finish(out, call, stream)


def report_launches(warp: int, multiprocessors: int) -> list[Launch]:
    """Every head-dim class's kernel (the compile report's occupancy rows)."""
    return [launch for sfx in KERNEL_SUFFIX.values() for hd in HEAD_DIM_CLASSES
            for launch in attention_launches(1, 2, 100, hd, sfx)]
