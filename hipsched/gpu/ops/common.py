"""What the launch glue of every op family (the modules beside this one, named as hipsched/ops/'s)
shares. A glue function is `op(ctx, call, stream)` on a validated Call (see hipsched/ops): inputs are
C-contiguous host arrays or DeviceArrays, and the result comes back where the inputs live through
ctx.finish. Each op's launches (kernel, grid, block, shared memory) come from a pure
`<op>_launches(...)` of shapes and device geometry, checked before any upload; `<op>_plan(ctx, call)`
gives them for a call, and each module's `report_launches` lists what reaches every kernel it launches
(the compile report's occupancy rows)."""
from __future__ import annotations

import math

import numpy as np

from ...errors import GpuError

BLOCK = 256

# Kernel name suffix per element type (prelude.h's HS_FOR_EACH_FLOAT).
KERNEL_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


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


def _size(shape) -> int:
    return math.prod(shape)


def _empty_result(ctx, call, shape, dtype, stream):
    out = ctx.empty(shape, dtype, stream)
    return ctx.finish(out, call, stream)
