"""GPU launch glue for attention (kernels: src_c/hip/attention.hip).

q (B, H, Sq, hd), k and v (B, Hkv, Sk, hd) contiguous with H a multiple of Hkv (query head h reads KV
slab (b, h // (H / Hkv)): every kernel takes the group and computes the KV slab, nothing is repeated),
all float32, float16 or bfloat16 (Call.dtype; the output has that dtype); kv_len None or int64 (B,)
(uploaded, the kernels read row b's bound from it); causal 0, 1 (top-left) or 2 (bottom-right: each
kernel shifts its rows' last visible key by kv_len - Sq). The matrix-core kernels keep their
16-aligned diagonal steps, so "lower_right" runs on them only when every batch row's offset kv_len - Sq
is a multiple of 16 (decided here, on the host's kv_len), else on the SIMT kernels. The kernel for the smallest head-dim class >= hd runs with the rest of the dims
zero-padded (hd up to 256). Two kernel families:
- the SIMT flash-attention kernels (hs_attention_[f16_|bf16_]d<D>, every class and target): float32
  arithmetic throughout, half inputs widened;
- the matrix-core kernels (hs_attention_{f16,bf16}_mma_d<D>, D in MMA_CLASSES[warp]) for half inputs on
  targets with mma.sync m16n8k16 (NVIDIA sm_80 and later; prelude.h's HS_MMA_M16N8K16) or MFMA
  16x16x16 (AMD gfx908, gfx90a, gfx940-942; HS_MFMA_16X16X16): Q K^T accumulated in float32, P rounded
  to the input type for P V (docs/design/kernels.md, "Attention on tensor cores"). A block is 4 warps of the
  target's width. Other targets (older NVIDIA, AMD RDNA and GCN) run the SIMT kernels for every dtype."""
from __future__ import annotations

import ctypes
import math

import numpy as np

from ...errors import GpuError
from ..compilation.kernel_constants import HSA_DIMS, HSA_R, HSA_THREADS, HSF_ROWS, HSF_THREADS, HSM_ROWS, HSM_THREADS
from ..launch.context import Launch, pure_plan
from .common import KERNEL_SUFFIX, has_mma, kernel_suffix, np_dtype

HEAD_DIM_CLASSES = (32, 64, 128, 256)
MAX_HEAD_DIM = HEAD_DIM_CLASSES[-1]
# head-dim classes with matrix-core kernels, by warp width: NVIDIA's mma.sync kernel (warp 32) and AMD's
# MFMA kernel (wavefront 64) at every class, d256 included (NVIDIA's Q fragments read per k step, not
# held; AMD's held, in 32 of its 512 registers a lane: docs/design/kernels.md)
MMA_CLASSES = {32: (32, 64, 128, 256), 64: (32, 64, 128, 256)}


def head_dim_class(hd: int) -> int:
    for d in HEAD_DIM_CLASSES:
        if hd <= d:
            return d
    raise GpuError("unsupported", f"attention: head_dim {hd} exceeds the GPU kernel's maximum {MAX_HEAD_DIM}")


@pure_plan
def attention_launches(b: int, h: int, sq: int, hd: int, suffix: str = "f32", mma: bool = False,
                       warp: int = 32, aligned: bool = True) -> list[Launch]:
    """One block per query tile of one (batch, head), all on grid x: the matrix-core kernel when `mma`
    (the target has it) and the dtype and head-dim class do and the causal diagonal is `aligned` (4
    warps of `warp` lanes: the mma.sync kernel's HSM_ geometry at warp 32, the MFMA one's HSF_ at
    wavefront 64), else the SIMT kernel."""
    d = head_dim_class(hd)
    if mma and aligned and suffix != "f32" and d in MMA_CLASSES[warp]:
        rows, threads = (HSM_ROWS, HSM_THREADS) if warp == 32 else (HSF_ROWS, HSF_THREADS)
        return [Launch.of("attention", f"hs_attention_{suffix}_mma_d{d}", -(-sq // rows) * b * h, threads)]
    rows = HSA_R * HSA_THREADS // (d // HSA_DIMS)
    name = f"hs_attention_d{d}" if suffix == "f32" else f"hs_attention_{suffix}_d{d}"
    return [Launch.of("attention", name, -(-sq // rows) * b * h, HSA_THREADS)]


HSD_G = 8   # query heads per decode block (attention.hip)


@pure_plan
def decode_launches(b: int, h: int, hkv: int, sk: int, hd: int, suffix: str = "f32",
                    multiprocessors: int = 132) -> tuple[list[Launch], int, int]:
    """The split-K decode (one query per head): (launches, nsplit, chunk). Ranges of `chunk` keys, as many
    as make about two blocks per multiprocessor over all (batch, KV head, head block) slabs (one wave at
    the two a multiprocessor holds at once on sm_90: docs/design/kernels.md, "Decode attention on the GPU"), but
    none shorter than 4 block steps (a range's fixed cost: its q loads, its merge, its partial), then the
    combine, one block per query row."""
    d = head_dim_class(hd)
    kpb = HSA_THREADS // (d // 8)
    slabs = b * hkv * -(-(h // hkv) // HSD_G)
    nsplit = max(1, min(-(-2 * multiprocessors // slabs), -(-sk // (4 * kpb))))
    chunk = -(-(-(-sk // nsplit)) // kpb) * kpb
    nsplit = max(1, -(-sk // chunk))
    name = f"hs_attention_decode_d{d}" if suffix == "f32" else f"hs_attention_decode_{suffix}_d{d}"
    return ([Launch.of("attention", name, slabs * nsplit, HSA_THREADS),
             Launch.of("attention", f"hs_attention_decode_combine_{suffix}", b * h, HSA_THREADS)], nsplit, chunk)


def _diagonal_aligned(call) -> bool:
    """Whether every batch row's lower_right offset (kv_len - Sq) is a multiple of 16 (trivially so for
    the other causal modes): the matrix-core kernels' condition."""
    if int(call.params.get("causal", 0)) != 2:
        return True
    sq, sk = int(call.args[0].shape[2]), int(call.args[1].shape[2])
    lens = call.args[3] if len(call.args) > 3 else None
    if lens is None:
        return (sk - sq) % 16 == 0
    return bool(np.all((np.asarray(lens) - sq) % 16 == 0))


def attention_plan(ctx, call) -> list[Launch]:
    suffix = kernel_suffix(call)
    b, h, sq, hd = (int(s) for s in call.args[0].shape)
    head_dim_class(hd)  # an empty call with too large a head_dim is refused as well: the kernels never take it
    if sq == 1 and b * h * hd:
        hkv, sk = int(call.args[1].shape[1]), int(call.args[1].shape[2])
        return decode_launches(b, h, hkv, max(sk, 1), hd, suffix, ctx.multiprocessors)[0]
    return attention_launches(b, h, sq, hd, suffix, has_mma(ctx.arch), ctx.warp_size,
                              _diagonal_aligned(call)) if b * h * sq * hd else []


def attention_scratch(call, multiprocessors: int) -> int:
    """Device bytes the glue allocates beyond the call's inputs and results: the split-K decode's partials
    (per query row and key range: d accumulators, its maximum and its sum, float32); nothing for the
    other kernels, or for a call that launches nothing."""
    b, h, sq, hd = (int(s) for s in call.args[0].shape)
    if sq != 1 or not b * h * hd:
        return 0
    hkv, sk = int(call.args[1].shape[1]), int(call.args[1].shape[2])
    _, nsplit, _ = decode_launches(b, h, hkv, max(sk, 1), hd, kernel_suffix(call), multiprocessors)
    return 4 * b * h * nsplit * (head_dim_class(hd) + 2)


def attention(ctx, call, stream):
    plan = ctx.planned(call, attention_plan)  # before any upload: an unsupported call costs nothing
    b, h, sq, hd = (int(s) for s in call.args[0].shape)
    hkv, sk = int(call.args[1].shape[1]), int(call.args[1].shape[2])
    causal = int(call.params.get("causal", 0))
    scale = call.params.get("scale")
    out = ctx.empty((b, h, sq, hd), np_dtype(call.dtype), stream)
    if not plan:
        return ctx.finish(out, call, stream)
    q, k, v = (ctx.upload(a, stream) for a in call.args[:3])
    lens = ctx.upload(call.args[3], stream) if len(call.args) > 3 and call.args[3] is not None else None
    scale = 1.0 / math.sqrt(hd) if scale is None else float(scale)
    if sq == 1:
        _, nsplit, chunk = decode_launches(b, h, hkv, max(sk, 1), hd, kernel_suffix(call), ctx.multiprocessors)
        d = head_dim_class(hd)
        part = ctx.scratch("attention_decode", (b * h * nsplit * (d + 2),), np.float32, stream)
        ctx.run(plan[0], (q, k, v, part, ctypes.c_int64(sk), ctypes.c_int32(hd), ctypes.c_float(scale),
                          ctypes.c_int32(causal), ctypes.c_int32(h // hkv), ctypes.c_int64(hkv), lens,
                          ctypes.c_int32(nsplit), ctypes.c_int64(chunk)), stream)
        ctx.run(plan[1], (part, out, ctypes.c_int32(hd), ctypes.c_int32(d + 2), ctypes.c_int32(nsplit)), stream)
        return ctx.finish(out, call, stream)
    (launch,) = plan
    ctx.run(launch, (q, k, v, out, ctypes.c_int64(sq), ctypes.c_int64(sk), ctypes.c_int32(hd),
                     ctypes.c_float(scale), ctypes.c_int32(causal), ctypes.c_int32(h // hkv), ctypes.c_int64(h),
                     lens), stream)
    return ctx.finish(out, call, stream)


def report_launches(warp: int, multiprocessors: int, arch: str | None = None) -> list[Launch]:
    """Every head-dim class's kernel (the compile report's occupancy rows): the matrix-core ones too for
    `arch` when it has them, or for any target when no arch is given (both widths have some)."""
    mma = has_mma(arch) if arch is not None else True
    return [launch for sfx in KERNEL_SUFFIX.values() for hd in HEAD_DIM_CLASSES for use in {False, mma}
            for launch in attention_launches(1, 2, 100, hd, sfx, use, warp)] + \
        [decode_launches(1, 32, 8, 4096, hd, sfx, multiprocessors)[0][0] for sfx in KERNEL_SUFFIX.values()
         for hd in HEAD_DIM_CLASSES] + \
        [decode_launches(1, 32, 8, 4096, 128, sfx, multiprocessors)[0][1] for sfx in KERNEL_SUFFIX.values()]
