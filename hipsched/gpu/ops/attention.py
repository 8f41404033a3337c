"""GPU launch glue for attention (kernels: src_c/hip/attention.hip).

q (B, H, Sq, hd), k and v (B, H, Sk, hd) contiguous, all float32, float16 or bfloat16 (Call.dtype; the
output has that dtype). The kernel for the smallest head-dim class >= hd runs with the rest of the dims
zero-padded (hd up to 256). Two kernel families:
- the SIMT flash-attention kernels (hs_attention_[f16_|bf16_]d<D>, every class and target): float32
  arithmetic throughout, half inputs widened;
- the matrix-core kernels (hs_attention_{f16,bf16}_mma_d<D>, D in MMA_CLASSES) for half inputs on
  targets with mma.sync m16n8k16 (NVIDIA sm_80 and later; prelude.h's HS_MMA_M16N8K16) or MFMA
  16x16x16 (AMD gfx908, gfx90a, gfx940-942; HS_MFMA_16X16X16): Q K^T accumulated in float32, P rounded
  to the input type for P V (docs/design/kernels.md, "Attention on tensor cores"). A block is 4 warps of the
  target's width. Other targets (older NVIDIA, AMD RDNA and GCN) run the SIMT kernels for every dtype."""
from __future__ import annotations

import ctypes
import math

from ...errors import GpuError
from ..compilation.kernel_constants import HSA_DIMS, HSA_R, HSA_THREADS, HSF_ROWS, HSF_THREADS, HSM_ROWS, HSM_THREADS
from ..launch.context import Launch, pure_plan
from .common import KERNEL_SUFFIX, has_mma, kernel_suffix, np_dtype

HEAD_DIM_CLASSES = (32, 64, 128, 256)
MAX_HEAD_DIM = HEAD_DIM_CLASSES[-1]
MMA_CLASSES = (32, 64, 128)   # head-dim classes with tensor-core kernels (d256 would spill its registers)


def head_dim_class(hd: int) -> int:
    for d in HEAD_DIM_CLASSES:
        if hd <= d:
            return d
    raise GpuError("unsupported", f"attention: head_dim {hd} exceeds the GPU kernel's maximum {MAX_HEAD_DIM}")


@pure_plan
def attention_launches(b: int, h: int, sq: int, hd: int, suffix: str = "f32", mma: bool = False,
                       warp: int = 32) -> list[Launch]:
    """One block per query tile of one (batch, head), all on grid x: the matrix-core kernel when `mma`
    (the target has it) and the dtype and head-dim class do (4 warps of `warp` lanes: the mma.sync kernel's
    HSM_ geometry at warp 32, the MFMA one's HSF_ at wavefront 64), else the SIMT kernel."""
    d = head_dim_class(hd)
    if mma and suffix != "f32" and d in MMA_CLASSES:
        rows, threads = (HSM_ROWS, HSM_THREADS) if warp == 32 else (HSF_ROWS, HSF_THREADS)
        return [Launch.of("attention", f"hs_attention_{suffix}_mma_d{d}", -(-sq // rows) * b * h, threads)]
    rows = HSA_R * HSA_THREADS // (d // HSA_DIMS)
    name = f"hs_attention_d{d}" if suffix == "f32" else f"hs_attention_{suffix}_d{d}"
    return [Launch.of("attention", name, -(-sq // rows) * b * h, HSA_THREADS)]


def attention_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    b, h, sq, hd = (int(s) for s in call.args[0].shape)
    head_dim_class(hd)  # an empty call with too large a head_dim is refused as well: the kernels never take it
    return attention_launches(b, h, sq, hd, suffix, has_mma(ctx.arch), ctx.warp_size) if b * h * sq * hd else []


def attention(ctx, call, stream):
    plan = ctx.planned(call, attention_plan)  # before any upload: an unsupported call costs nothing
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


def report_launches(warp: int, multiprocessors: int, arch: str | None = None) -> list[Launch]:
    """Every head-dim class's kernel (the compile report's occupancy rows): the matrix-core ones too for
    `arch` when it has them, or for any target when no arch is given (both widths have some)."""
    mma = has_mma(arch) if arch is not None else True
    return [launch for sfx in KERNEL_SUFFIX.values() for hd in HEAD_DIM_CLASSES for use in {False, mma}
            for launch in attention_launches(1, 2, 100, hd, sfx, use, warp)]
