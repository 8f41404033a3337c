"""matmul: a @ b in float32 with np.matmul's shape rules for 1-d operands; leading (batch) axes must be
equal on both sides or present on one side only (what both backends implement). The CPU side is
NumPy's BLAS. Call.size = batch * m * n * k."""
from __future__ import annotations

import math

from .base import Call, any_on_device, as_f32, check_result_fits, register, shape_mismatch


@register("matmul")
def prepare_matmul(a, b) -> Call:
    a = as_f32(a, "matmul", "a")
    b = as_f32(b, "matmul", "b")
    sa, sb = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
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
    batch_shape = ba or bb
    out_shape = batch_shape + ((m,) if len(sa) > 1 else ()) + ((n,) if len(sb) > 1 else ())
    check_result_fits("matmul", *out_shape)
    batch = math.prod(batch_shape)
    nbytes = 4 * (math.prod(sa) + math.prod(sb) + math.prod(out_shape))
    return Call("matmul", (a, b), {}, size=batch * m * n * k, nbytes=nbytes,
                on_device=any_on_device(a, b))
