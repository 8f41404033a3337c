"""Out-of-memory recovery: split a call into independent chunks that fit in free device memory and
run them one after another on the GPU, before giving up on the GPU for the call.

Each op splits along an axis whose slices are independent computations (rows of add/scale/softmax/
matmul, targets of cosine_similarity, queries of top_k, columns of qmatmul, batch*heads of attention);
the results are concatenated back. Only host inputs are split (device inputs are left to the fallback)."""
from __future__ import annotations

import math

import numpy as np

from .errors import GpuError
from .ops.base import Call

MAX_CHUNKS = 1 << 16
HEADROOM = 0.8   # use at most this share of the free memory (the allocator needs slack)


def _rows(x):
    return x.shape[0] if isinstance(x, np.ndarray) and x.ndim >= 1 else 0


def _plan_matmul(args):
    """np.matmul's layouts: split the axis that is the result's first (or, for a 1-d a against a
    matrix, last) axis, on every operand that carries it."""
    if len(args) < 2 or not all(isinstance(a, np.ndarray) for a in args[:2]):
        return None
    a, b = args[0], args[1]
    rest = tuple(args[2:])
    if a.ndim >= 3 and b.ndim == a.ndim:          # equal batch axes: split both
        split, n = (lambda lo, hi: (a[lo:hi], b[lo:hi]) + rest), a.shape[0]
    elif a.ndim >= 2 and b.ndim <= 2:             # a's batch axis or rows
        split, n = (lambda lo, hi: (a[lo:hi], b) + rest), a.shape[0]
    elif b.ndim >= 3 and a.ndim <= 2:             # b's batch axis (a broadcast over it)
        split, n = (lambda lo, hi: (a, b[lo:hi]) + rest), b.shape[0]
    elif a.ndim == 1 and b.ndim == 2:             # vector @ matrix: columns of b
        if b.shape[1] < 2:
            return None
        return b.shape[1], (lambda lo, hi: (a, np.ascontiguousarray(b[:, lo:hi])) + rest), \
            (lambda rs: np.concatenate(rs, axis=-1))
    else:
        return None
    if n < 2:
        return None
    return n, split, (lambda rs: np.concatenate(rs, axis=0))


def _plan(call):
    """(number of independent pieces, split(lo, hi) -> args, combine(results) -> result) or None."""
    op, args = call.op, call.args
    if not args:
        return None
    x = args[0]
    if op == "qmatmul" and len(args) >= 2 and isinstance(args[1], np.ndarray) and args[1].ndim == 2 \
            and args[1].shape[1] >= 2:
        w, v = args[0], args[1]
        return v.shape[1], (lambda lo, hi: (w, np.ascontiguousarray(v[:, lo:hi])) + tuple(args[2:])), \
            (lambda rs: np.concatenate(rs, axis=1))
    if not isinstance(x, np.ndarray):
        return None
    if op == "matmul":
        return _plan_matmul(args)
    if op in ("add", "scale"):
        if x.ndim < 1 or x.shape[0] < 2:
            return None
        same = [isinstance(a, np.ndarray) and a.shape == x.shape for a in args]
        return x.shape[0], (lambda lo, hi: tuple(a[lo:hi] if s else a for a, s in zip(args, same))), \
            (lambda rs: np.concatenate(rs, axis=0))
    if op == "softmax":
        axis = call.params.get("axis", -1)
        if x.ndim < 2 or axis % x.ndim == 0 or x.shape[0] < 2:
            return None
        return x.shape[0], (lambda lo, hi: (x[lo:hi],) + tuple(args[1:])), (lambda rs: np.concatenate(rs, axis=0))
    if op == "cosine_similarity" and len(args) >= 2 and _rows(args[1]) >= 2:
        q, t = args[0], args[1]
        return t.shape[0], (lambda lo, hi: (q, t[lo:hi]) + tuple(args[2:])), \
            (lambda rs: np.concatenate(rs, axis=-1))
    if op == "top_k" and x.ndim == 2 and x.shape[0] >= 2:
        return x.shape[0], (lambda lo, hi: (x[lo:hi],) + tuple(args[1:])), \
            (lambda rs: tuple(np.concatenate(p, axis=0) for p in zip(*rs)))
    if op == "attention" and len(args) >= 3 and all(isinstance(a, np.ndarray) and a.ndim == 4 for a in args[:3]):
        b, h = x.shape[0], x.shape[1]
        if b * h < 2:
            return None
        flat = [a.reshape(b * h, 1, a.shape[2], a.shape[3]) for a in args[:3]]
        return b * h, (lambda lo, hi: tuple(f[lo:hi] for f in flat) + tuple(args[3:])), \
            (lambda rs: (lambda r: r.reshape(b, h, r.shape[2], r.shape[3]))(np.concatenate(rs, axis=0)))
    return None


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
                    sub = split(int(lo), int(hi))
                    frac = (hi - lo) / pieces
                    results.append(gpu.run(Call(call.op, sub, call.params, max(1, int(call.size * frac)),
                                                max(1, int(call.nbytes * frac)), call.dtype, False), stream))
            return combine(results)
        except GpuError as e:
            if e.kind != "oom":
                raise
            last = e
            if n == pieces:
                break
            n = min(pieces, n * 2)
    raise last or GpuError("oom", f"{call.op}: does not fit on the device even in {pieces} pieces")
