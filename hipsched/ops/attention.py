"""attention: scaled dot-product attention on (batch, heads, seq, head_dim) arrays.

    out[b, h, i] = sum_j softmax_j(scale * q[b, h, i] . k[b, h, j]) v[b, h, j]

`scale` defaults to 1/sqrt(head_dim). With `causal=True` query i sees keys j <= i only, aligned at the
top-left exactly as torch.nn.functional.scaled_dot_product_attention(is_causal=True), also when
seq_q != seq_k; every query then sees key 0, so no row is fully masked. seq_k == 0 (no keys at all)
gives zeros, as PyTorch does. NaN or inf in a row's scores propagates to that row's output as the formula
gives it (NumPy-style); PyTorch's CPU flash kernel instead returns zeros for such rows. With
`causal=True` a key hidden from a query never reaches that query's output, even when its row of v
holds inf or NaN (the formula's 0 * inf would be NaN there).

The CPU kernel (src_c/cpu/attention.inc) is tiled with an online softmax: its scratch is
O(64 * (head_dim + 64)) floats per thread, never seq_q x seq_k. Results agree with a float64
reference to about 1e-5 relative (float32 accumulation, an exp2 accurate to ~1e-7).

Dtypes: q, k, v float32, float16 or bfloat16 on the CPU; the output has their dtype. Half inputs are
read as half (K and V widened one 64-key tile at a time into per-thread scratch, in registers); the
scores, the running max and sum and the output accumulate in float32, and the output is rounded once
(float16 overflow to inf). A mix promotes all three to float32, as PyTorch's type promotion does
(ops.base.promote; device arrays are not converted, so a mix on a device is a TypeError). The GPU
kernels take the same three types."""
from __future__ import annotations

import math

import numpy as np

from .base import FLOATS, Call, any_on_device, as_float, check_ndim, check_result_fits, finite_scalar, \
    promote, rand_f32, register, shape_mismatch

OP = "attention"


def _split(call):
    """batch * heads: each (b, h) slice attends only within itself."""
    args = call.args
    if len(args) < 3 or not all(isinstance(a, np.ndarray) and a.ndim == 4 for a in args[:3]):
        return None
    b, h = args[0].shape[0], args[0].shape[1]
    if b * h < 2:
        return None
    flat = [a.reshape(b * h, 1, a.shape[2], a.shape[3]) for a in args[:3]]
    return b * h, (lambda lo, hi: tuple(f[lo:hi] for f in flat) + tuple(args[3:])), \
        (lambda rs: (lambda r: r.reshape(b, h, r.shape[2], r.shape[3]))(np.concatenate(rs, axis=0)))


def _sweep(rng):
    for s in (16, 64, 128, 256, 512):
        q, k, v = (rand_f32(rng, 1, 4, s, 64) for _ in range(3))
        yield 4 * s * s * 64, (q, k, v), {}


def check_attention(q, k, v, causal, scale, op=OP):
    """The shape and parameter rule, on anything with shape: q, k, v 4-d, k of v's shape, batch, heads
    and head_dim agreeing, causal a bool, scale None or finite within float32's range. Returns the
    checked scale (None stays None). hipsched.dask.attention applies it to Dask arrays before any task."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_ndim(x, (4,), op, name)
    if tuple(k.shape) != tuple(v.shape):
        raise shape_mismatch(op, "k", k.shape, "v", v.shape, "k and v must both be (batch, heads, seq_k, head_dim)")
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise shape_mismatch(op, "q", q.shape, "k", k.shape,
                             "batch, heads and head_dim must agree; only the sequence lengths may differ")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{op}: causal must be a bool, got {causal!r}")
    if scale is not None:
        scale = finite_scalar(scale, op, "scale")
        # the kernels take scale as float32 and fold log2(e) into it: beyond that range 0 * inf gives NaN
        if abs(scale) * math.log2(math.e) > float(np.finfo(np.float32).max):
            raise ValueError(f"{op}: scale must be within float32's range (|scale| <= about 2.4e38), got {scale!r}")
    return scale


@register(OP, cpu=("hipsched.cpu._attention", "attention"), gpu=("hipsched.gpu.ops.attention", "attention"),
          cpu_dtypes=FLOATS, gpu_dtypes=FLOATS, split=_split, sweep=_sweep, cost=(0.05, 4.0))
def prepare(q, k, v, causal=False, scale=None) -> Call:
    """Scaled dot-product attention on (batch, heads, seq, head_dim) arrays: softmax(scale * q k^T) v,
    `scale` defaulting to 1/sqrt(head_dim); with `causal=True` query i sees keys j <= i only (aligned
    top-left, as PyTorch's is_causal). q, k, v float32, float16 or bfloat16, accumulated in float32, the
    output in their dtype; a mix of float dtypes promotes to float32."""
    q = as_float(q, OP, "q")
    k = as_float(k, OP, "k")
    v = as_float(v, OP, "v")
    on_device = any_on_device(q, k, v)
    dtype, (q, k, v) = promote(OP, q=q, k=k, v=v)
    scale = check_attention(q, k, v, causal, scale)
    b, h, sq, d = (int(s) for s in q.shape)
    sk = int(k.shape[2])
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    check_result_fits(OP, b, h, sq, d)
    return Call(OP, (q, k, v), {"causal": bool(causal), "scale": scale},
                size=b * h * sq * sk * d,
                nbytes=q.dtype.itemsize * (2 * b * h * sq * d + 2 * b * h * sk * d), dtype=dtype,
                on_device=on_device)
