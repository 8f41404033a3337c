"""The numbers the HIP kernels (src_c/hip) and their launch glue (hipsched/gpu/glue) must agree on, declared
once. The glue reads these names; `kernel_sources()` (kernels.py) puts `prelude_defines()` before
prelude.h and `defines()` between prelude.h and each .hip file, so the kernels see the same values as
`#define`s of the same names and no .hip file or prelude.h defines them
(tests/gpu/runtime/test_kernel_constants.py checks both).

A value is an int or a float (`#define NAME 128`, `#define NAME 8.0f`), a {qtype: value} for the
"q8_0"/"q4_0" pair (a function-like `#define NAME(Q8) ((Q8) ? a : b)`: the quant kernels are templates on
Q8), or a PerVendor (`#if defined(HS_NVIDIA)` ... `#else` ..., which is why `defines()` comes after the
prelude's vendor test). Launch bounds take these names, so each is spelled as a literal number, never an
expression (`__launch_bounds__` wants a constant, and the compile report and the emulator read the
kernels' bounds back).

Imports nothing of hipsched but the gguf_blocks leaf (the superblock layout is the GGUF blocks')."""
from __future__ import annotations

from typing import NamedTuple

from ...gguf_blocks import BLOCK_BYTES, QK, SUPERBLOCK


class PerVendor(NamedTuple):
    """A value that differs by vendor: NVIDIA (warp 32) and AMD (the prelude's HS_AMD)."""
    nvidia: int
    amd: int


# ---------------------------------------------------------------- targets (prelude.h reads these)
# Targets whose kernels include the matrix-core ones (attention's and qmatmul's `_mma_` kernels, prelude.h's
# HS_MMA_M16N8K16 and HS_MFMA_16X16X16; common.has_mma reads the same two on the target's name).
MMA_MIN_SM = 80   # mma.sync m16n8k16 in bf16, cp.async, ldmatrix: sm_80's
# MFMA 16x16x16: CDNA (gfx908, gfx90a, gfx940-942). RDNA3's WMMA (gfx11xx) is not used: ROCm 5.2's hiprtc
# (what CI has) cannot compile for gfx11xx, so such a kernel could not be checked.
MFMA_TARGETS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942")

# ---------------------------------------------------------------- attention.hip
# SIMT kernel, hs_attention_*d<D>. Launch bounds matter on AMD: without them hipcc budgets registers for
# 1024-thread blocks (64 VGPRs) and this kernel would spill most of its state to scratch.
HSA_THREADS = 128
HSA_R = 4          # query rows per thread
HSA_DIMS = 16      # head dims per thread: a query row of class D is spread over D / 16 threads
# Matrix-core kernels, hs_attention_{f16,bf16}_mma_d<D>: 4 warps (NVIDIA, HSM_) or waves of 64 (AMD MFMA,
# HSF_), 16 query rows each. The thread counts are spelled out for __launch_bounds__.
HSM_WARPS = 4
HSM_THREADS = HSM_WARPS * 32
HSM_ROWS = HSM_WARPS * 16
HSF_WARPS = 4
HSF_THREADS = HSF_WARPS * 64
HSF_ROWS = HSF_WARPS * 16

# ---------------------------------------------------------------- graph.hip
HSG_GROUP = 8   # lanes per row of the push kernel: most rows are short, a full warp per row would idle

# ---------------------------------------------------------------- matmul.hip (the fallback SGEMM)
HS_MM_TILE = 64       # a 64 x 64 tile of C per block, 4 x 4 outputs per thread
HS_MM_THREADS = 256   # (HS_MM_TILE / 4)^2

# ---------------------------------------------------------------- softmax.hip
# The largest block of the register-row softmax (hs_softmax_regs_*_p4, compiled for it: __launch_bounds__,
# so at most 64 registers a thread on sm_90); the glue's row_regs_geometry never asks for more.
HS_SOFTMAX_REGS_THREADS = 1024

# ---------------------------------------------------------------- similarity.hip
# Candidates one top-k block selects from. k above half a segment would make the multi-pass selection
# stall, so larger k is not offered on the GPU (the glue's TOPK_MAX_K; the CPU takes those calls).
HS_TOPK_SEG = 2048
HS_TOPK_THREADS = 256
HS_COSINE_MQ = 8   # queries scored per pass over T by the multi-query cosine kernel (hs_cosine_*_q8*)

# ---------------------------------------------------------------- quant.hip: the device layout
# Each row of a quantized matrix is a run of superblocks (gguf_blocks.SUPERBLOCK blocks, the last padded),
# each 512 bytes of quants, 16 for each of 32 lanes, then the blocks' fp16 scales (quant.hip's header and
# gpu/glue/quant.py's device_layout describe it). Lane l holds groups g of 4 weights, 128 g + 4 l + c.
HSQ_LANES = 32
HSQ_SBQ = HSQ_LANES * 16                                                 # quant bytes of a superblock
HSQ_SBK = {qt: SUPERBLOCK[qt] * QK for qt in BLOCK_BYTES}                # weights of a superblock (along k)
HSQ_SBB = {qt: SUPERBLOCK[qt] * BLOCK_BYTES[qt] for qt in BLOCK_BYTES}   # bytes of a superblock
HSQ_NG = {qt: HSQ_SBK[qt] // (4 * HSQ_LANES) for qt in BLOCK_BYTES}      # groups of 4 weights a lane holds
HSQ_BIAS = {"q8_0": 128.0, "q4_0": 8.0}   # what the stored bytes / nibbles are offset by (unsigned)

# ---------------------------------------------------------------- quant.hip: the products' geometry
# One-column mat-vec (hs_qmatvec_*): teams of 32 lanes, HSQ_NR rows each (quant.hip says why 2).
HSQ_NR = 2
HSQ_MV_THREADS = 128   # 4 teams; declared so AMD compilers budget registers for it, not for 1024 threads
# Several-column mat-vec (hs_qmatvecn_*): HSQ_NRN rows per team share each x read from shared memory
# (Q4_0 takes 2, its chunks holding twice the scales: 4 rows spilled on sm_90 at 128 registers), up to
# HSQ_MC columns per block (grid y: chunks of columns).
HSQ_NRN = {"q8_0": 4, "q4_0": 2}
HSQ_MC = 8
HSQ_MN_THREADS = 128
# Matrix-matrix (hs_qmatmat_*): a HSQ_TM x HSQ_TN output tile per block, SIMT (HSQ_MM_THREADS) or on the
# matrix cores (HSQ_MMA_WARPS warps or waves: HSQ_MMA_THREADS at warp 32 / wavefront 64).
HSQ_TM = 64
HSQ_TN = 64
HSQ_MM_THREADS = 256
HSQ_MMA_WARPS = 4
HSQ_MMA_THREADS = PerVendor(nvidia=HSQ_MMA_WARPS * 32, amd=HSQ_MMA_WARPS * 64)

# What prelude.h reads (its matrix-core tests), then what the kernels read, in order.
PRELUDE_MACROS = ("HS_MMA_MIN_CUDA_ARCH", "HS_MFMA_TARGET")
MACROS = ("HSA_THREADS", "HSA_R", "HSA_DIMS", "HSM_WARPS", "HSM_THREADS", "HSM_ROWS", "HSF_WARPS", "HSF_THREADS",
          "HSF_ROWS", "HSG_GROUP", "HS_MM_TILE", "HS_MM_THREADS", "HS_SOFTMAX_REGS_THREADS", "HS_TOPK_SEG",
          "HS_TOPK_THREADS", "HS_COSINE_MQ", "HSQ_LANES", "HSQ_SBQ", "HSQ_SBK", "HSQ_SBB", "HSQ_NG", "HSQ_BIAS",
          "HSQ_NR", "HSQ_MV_THREADS", "HSQ_NRN", "HSQ_MC", "HSQ_MN_THREADS", "HSQ_TM", "HSQ_TN", "HSQ_MM_THREADS",
          "HSQ_MMA_WARPS", "HSQ_MMA_THREADS")


def _literal(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a kernel constant is a number, got {value!r}")
    return f"{float(value)!r}f" if isinstance(value, float) else str(int(value))


def _define(name: str, value) -> str:
    if isinstance(value, PerVendor):
        return (f"#if defined(HS_NVIDIA)\n#define {name} {_literal(value.nvidia)}\n"
                f"#else\n#define {name} {_literal(value.amd)}\n#endif")
    if isinstance(value, dict):
        return f"#define {name}(Q8) ((Q8) ? {_literal(value['q8_0'])} : {_literal(value['q4_0'])})"
    return f"#define {name} {_literal(value)}"


def prelude_defines() -> str:
    """What prelude.h's matrix-core tests read, from the target alone (it comes before the prelude)."""
    targets = " || ".join(f"defined(__{t}__)" for t in MFMA_TARGETS)
    return (f"#define HS_MMA_MIN_CUDA_ARCH {MMA_MIN_SM * 10}\n"
            f"#if {targets}\n#define HS_MFMA_TARGET 1\n#endif\n")


def defines() -> str:
    """Every constant in MACROS as `#define`s, after the prelude (a PerVendor tests its HS_NVIDIA)."""
    values = globals()
    return "".join(_define(name, values[name]) + "\n" for name in MACROS)
