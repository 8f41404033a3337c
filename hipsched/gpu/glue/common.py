"""What the launch glue of every op family (the modules beside this one, named as hipsched/ops/'s)
shares. A glue function is `op(ctx, call, stream)` on a validated Call (see hipsched/ops): inputs are
C-contiguous host arrays or DeviceArrays, and the result comes back where the inputs live through
ctx.finish. Each op's launches (kernel, grid, block, shared memory) come from a pure
`<op>_launches(...)` of shapes and device geometry, checked before any upload; `<op>_plan(ctx, call)`
gives them for a call, and each module's `report_launches` lists what reaches every kernel it launches
(the compile report's occupancy rows)."""
from __future__ import annotations

import math
import re

import numpy as np

from ...errors import GpuError
from ..compilation.kernel_constants import MFMA_TARGETS, MMA_MIN_SM

BLOCK = 256

# Blocks of BLOCK threads that fill one compute unit: 8 x 256 = 2048 threads, an H100 SM's most
# resident threads, and 32 waves of 64, a CDNA CU's (4 SIMDs x 8). See bandwidth_blocks.
RESIDENT_BLOCKS = 8
# The same for the 16-byte (_v8) elementwise kernels, which hold two packs per input per thread: up to
# 64 registers on sm_90 (the compile report), so an SM keeps 4 blocks of 256 resident (1024 threads).
# At 64-128 bytes requested per thread that is 64-128 KB in flight per SM, 4-8x what Little's law asks
# of an H100 (elementwise.hip).
RESIDENT_BLOCKS_V8 = 4

# Kernel name suffix per element type (prelude.h's HS_FOR_EACH_FLOAT).
KERNEL_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def has_mma(arch: str | None) -> bool:
    """Whether kernels compiled for `arch` ("sm_90", "gfx90a:xnack-") include the matrix-core ones: the
    tests prelude.h's HS_MMA_M16N8K16 (__CUDA_ARCH__) and HS_MFMA_16X16X16 (the __gfx*__ macros) make,
    on the target name (an AMD target's features after the colon do not matter), from the same
    kernel_constants MMA_MIN_SM and MFMA_TARGETS."""
    arch = (arch or "").strip()
    if arch.split(":")[0] in MFMA_TARGETS:
        return True
    found = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    return bool(found) and int(found.group(1)) >= MMA_MIN_SM


def kernel_suffix(call, op=None, dtypes=tuple(KERNEL_SUFFIX)) -> str:
    """The kernel suffix of call.dtype, one of `dtypes` (those the glue's kernels are built for: every
    entry point asks, so a call of another dtype is refused before its elements could be read at the
    wrong width); GpuError("unsupported") for any other."""
    dtype = getattr(call, "dtype", "float32") or "float32"
    if dtype not in dtypes:
        raise GpuError("unsupported", f"{op or call.op}: no GPU kernels for dtype {dtype}")
    return KERNEL_SUFFIX[dtype]


def np_dtype(name: str) -> np.dtype:
    """NumPy dtype of a Call.dtype name. bfloat16 is ml_dtypes' (imported only when a bfloat16 call
    comes, and only the holder of a bfloat16 array needs it)."""
    if name == "bfloat16":
        try:
            import ml_dtypes  # deferred: ml_dtypes is optional, needed only for bfloat16
        except ImportError as e:
            raise GpuError("unsupported", "bfloat16 on the GPU needs the ml_dtypes package for its NumPy "
                                          "dtype (pip install ml_dtypes)") from e
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _param(call, index, name):
    """A scalar given either positionally (call.args) or as a keyword (call.params)."""
    if name in call.params:
        return call.params[name]
    if len(call.args) > index:
        return call.args[index]
    raise GpuError("unsupported", f"{call.op}: missing parameter {name!r}")


def _aligned(*arrays, multiple=16) -> bool:
    return all(int(a.ptr) % multiple == 0 for a in arrays)


def _will_align(*inputs, multiple=16) -> bool:
    """Whether the device copies of these inputs will be `multiple`-aligned, known before uploading:
    hipsched's own device allocations always are (the runtimes align them to 256 bytes or more); a
    foreign device array is as its pointer says."""
    return all(isinstance(x, np.ndarray) or int(x.ptr) % multiple == 0 for x in inputs)


def bandwidth_blocks(items: int, multiprocessors: int, resident: int = RESIDENT_BLOCKS, block: int = BLOCK) -> int:
    """Blocks for a bandwidth-bound grid-stride loop over `items` work items: one resident wave,
    `resident` blocks per compute unit (RESIDENT_BLOCKS, or RESIDENT_BLOCKS_V8 for the _v8 kernels),
    fewer when there is less work.
    One wave rather than several: every block starts at once and strides to the end, so no late
    blocks leave a ragged last wave, and the kernels keep enough bytes in flight per thread
    (elementwise.hip's Little's-law note) that a fuller device would not be faster. The grid depends
    on the device only through `multiprocessors`, a launch parameter like any other: a recorded plan
    (the compiled call path) replays it on the device it was planned for."""
    need = max(1, -(-int(items) // block))
    return min(need, max(1, int(multiprocessors)) * int(resident))


# Row kernels with the row in registers (softmax, rms_norm: hs_*_regs_*_p{1,2,4}): each thread holds up
# to 4 packs of 8 elements as float (32 registers of values, no spills on sm_90 or gfx90a: `hipsched
# compile --report`), a block up to `max_threads` threads, so rows up to 8 * 4 * max_threads elements are
# read from global memory once.
ROW_REGS_PACKS = (1, 2, 4)


def row_regs_max_len(max_threads: int) -> int:
    return 8 * ROW_REGS_PACKS[-1] * max_threads


def row_regs_geometry(length: int, max_threads: int) -> tuple[int, int] | None:
    """(packs per thread, threads per block) of a register row kernel for rows of `length` (a
    multiple of 8), or None past row_regs_max_len(max_threads). The fewest packs per thread that keep
    the block at 256 threads or under (small blocks: several rows per SM, one row's loads overlapping
    another's reductions), then up to `max_threads` at 4 packs. A multiple of 64 threads: whole warps
    on either vendor."""
    packs8 = length // 8
    for packs in ROW_REGS_PACKS:
        threads = -(-packs8 // packs)
        if threads <= 256 or (packs == ROW_REGS_PACKS[-1] and threads <= max_threads):
            return packs, max(64, -(-threads // 64) * 64)
    return None


def _size(shape) -> int:
    return math.prod(shape)


def _empty_result(ctx, call, shape, dtype, stream):
    out = ctx.empty(shape, dtype, stream)
    return ctx.finish(out, call, stream)
