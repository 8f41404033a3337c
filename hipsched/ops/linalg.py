"""matmul: a @ b with np.matmul's shape rules for 1-d operands; leading (batch) axes must be equal on
both sides or present on one side only (what both backends implement). The CPU side is NumPy's BLAS.
Call.size = batch * m * n * k.

Dtypes: float32, float16, bfloat16 on both backends; the result has the inputs' dtype and is accumulated in
float32 (half operands are widened exactly, a row panel at a time, for the float32 BLAS; the result is
rounded once, to nearest even). A mix promotes to float32, as NumPy and PyTorch do (ops.validation.promote)."""
from __future__ import annotations

import math

import numpy as np

from .base import Call, rand_f32, register
from .validation import FLOATS, any_on_device, as_float, check_result_fits, promote, shape_mismatch


def _split(call):
    """np.matmul's layouts: split the axis that is the result's first (or, for a 1-d a against a
    matrix, last) axis, on every operand that carries it."""
    args = call.args
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


def _sweep(rng):
    for n in (8, 16, 32, 64, 128, 256, 512):
        yield n ** 3, (rand_f32(rng, n, n), rand_f32(rng, n, n)), {}


def matmul_shapes(sa: tuple, sb: tuple):
    """np.matmul's shape rule, checked: (a's batch axes, b's batch axes, m, k, n) for operand shapes sa
    and sb (a 1-d a is a row, a 1-d b a column; batch axes equal or on one side only)."""
    if not sa or not sb:
        raise ValueError(f"matmul: operands must be at least 1-d, got a {sa} and b {sb}")
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    m, k = a2[-2], a2[-1]
    k2, n = b2[-2], b2[-1]
    if k != k2:
        raise shape_mismatch("matmul", "a", sa, "b", sb, f"a's last axis ({k}) must equal b's "
                             f"{'only' if len(sb) == 1 else 'second-to-last'} axis ({k2})")
    ba, bb = a2[:-2], b2[:-2]
    if ba and bb and ba != bb:
        raise shape_mismatch("matmul", "a", sa, "b", sb, "batch axes must be equal or on one side only")
    return ba, bb, m, k, n


def _matmul_result(call):
    sa, sb = tuple(int(s) for s in call.args[0].shape), tuple(int(s) for s in call.args[1].shape)
    ba, bb, m, k, n = matmul_shapes(sa, sb)
    return (ba or bb) + ((m,) if len(sa) > 1 else ()) + ((n,) if len(sb) > 1 else ()), call.dtype


@register("matmul", cpu=("hipsched.cpu._similarity", "matmul"), gpu=("hipsched.gpu.glue.linalg", "matmul"),
          cpu_dtypes=FLOATS, gpu_dtypes=FLOATS, split=_split, sweep=_sweep, cost=(0.05, 2.0), result=_matmul_result)
def prepare_matmul(a, b) -> Call:
    """a @ b with np.matmul's shape rules (leading batch axes equal on both sides or present on one side
    only); the CPU side is NumPy's BLAS. float32, float16 or bfloat16, accumulated in float32 and rounded
    once to the inputs' dtype; a mix of float dtypes promotes to float32."""
    a = as_float(a, "matmul", "a")
    b = as_float(b, "matmul", "b")
    on_device = any_on_device(a, b)
    dtype, (a, b) = promote("matmul", a=a, b=b)
    sa, sb = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
    ba, bb, m, k, n = matmul_shapes(sa, sb)
    batch_shape = ba or bb
    out_shape = batch_shape + ((m,) if len(sa) > 1 else ()) + ((n,) if len(sb) > 1 else ())
    check_result_fits("matmul", *out_shape)
    batch = math.prod(batch_shape)
    nbytes = a.dtype.itemsize * (math.prod(sa) + math.prod(sb) + math.prod(out_shape))
    return Call("matmul", (a, b), {}, size=batch * m * n * k, nbytes=nbytes, dtype=dtype, on_device=on_device)
