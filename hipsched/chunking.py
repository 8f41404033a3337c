"""Out-of-memory recovery: split a call into independent chunks that fit in free device memory and
run them one after another on the GPU, before giving up on the GPU for the call.

Each op's spec says how it splits (OpSpec.split): along an axis whose slices are independent
computations (rows, targets, queries, columns, batch*heads), the results concatenated back. Only host inputs are split (device inputs are left to the fallback)."""
from __future__ import annotations

import math

import numpy as np

from .errors import GpuError
from .ops import OPS

MAX_CHUNKS = 1 << 16
HEADROOM = 0.8   # use at most this share of the free memory (the allocator needs slack)


def _plan(call):
    """(number of independent pieces, split(lo, hi) -> args, combine(results) -> result) or None, as the
    op's spec cuts it."""
    spec = OPS.get(call.op)
    if spec is None or not call.args:
        return None
    return spec.chunks(call)


def chunkable(call) -> bool:
    return not call.on_device and _plan(call) is not None


def run_chunked(gpu, call, stream=None, first_error: GpuError | None = None):
    """Run `call` on `gpu` in as few chunks as fit; on repeated OOM the chunk count doubles. Raises the
    last GpuError when the call cannot be split or even single pieces do not fit."""
    plan = None if call.on_device else _plan(call)
    if plan is None:
        raise first_error or GpuError("oom", f"{call.op}: does not fit on the device and cannot be split")
    pieces, split, combine = plan
    try:
        need, free = gpu.device_bytes_needed(call), gpu.free_memory()
        n = max(2, math.ceil(need / max(1.0, free * HEADROOM)))
    except GpuError:
        n = 2
    n = min(n, pieces, MAX_CHUNKS)  # an estimate beyond one piece per chunk still gets that one try
    last = first_error
    while n <= min(pieces, MAX_CHUNKS):
        bounds = np.linspace(0, pieces, n + 1).astype(np.int64)
        try:
            results = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                if hi > lo:
                    results.append(gpu.run(call.part(split(int(lo), int(hi)), (hi - lo) / pieces), stream))
            return combine(results)
        except GpuError as e:
            if e.kind != "oom":
                raise
            last = e
            if n == pieces:
                break
            n = min(pieces, n * 2)
    raise last or GpuError("oom", f"{call.op}: does not fit on the device even in {pieces} pieces")
