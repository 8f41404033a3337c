"""attention: scaled dot-product attention on (batch, heads, seq, head_dim) arrays.

    out[b, h, i] = sum_j softmax_j(scale * q[b, h, i] . k[b, h // g, j]) v[b, h // g, j],  g = heads_q / heads_kv

over the keys j visible to query i. `scale` defaults to 1/sqrt(head_dim). k and v may have fewer heads
than q (grouped-query attention: heads_q a multiple of heads_kv, torch's repeat_interleave semantics,
nothing copied). `causal`: False (every key); True or "upper_left": j <= i, aligned at the top-left
exactly as torch.nn.functional.scaled_dot_product_attention(is_causal=True), also when seq_q != seq_k;
"lower_right": j <= i + kv - seq_q (FlashAttention-2, torch's causal_lower_right), kv the row's valid key
count; anything else is a ValueError naming the choices. `kv_len` (batch,) integers in [0, seq_k]: keys
at positions >= kv_len[b] are ignored (a KV cache preallocated at seq_k). A query that sees no key
(kv_len 0, or lower_right with seq_q > kv) gives zeros, as FlashAttention-2 and hipsched's seq_k == 0
do (torch's SDPA gives NaN there), on the CPU and the GPU alike. NaN or inf in a row's scores propagates
to that row's output as the formula gives it (NumPy-style); PyTorch's CPU flash kernel instead returns
zeros for such rows. A key hidden from a query (causal or past kv_len) never reaches that query's output,
even when its row of v holds inf or NaN (the formula's 0 * inf would be NaN there).

The CPU kernel (src_c/cpu/attention.inc) is tiled with an online softmax: its scratch is
O(64 * (head_dim + 64)) floats per thread, never seq_q x seq_k. Results agree with a float64
reference to about 1e-5 relative (float32 accumulation, an exp2 accurate to ~1e-7).

Dtypes: q, k, v float32, float16 or bfloat16 on the CPU; the output has their dtype. Half inputs are
read as half (K and V widened one 64-key tile at a time into per-thread scratch, in registers); the
scores, the running max and sum and the output accumulate in float32, and the output is rounded once
(float16 overflow to inf). A mix promotes all three to float32, as PyTorch's type promotion does
(ops.validation.promote; device arrays are not converted, so a mix on a device is a TypeError). The GPU
kernels take the same three types."""
from __future__ import annotations

import math

import numpy as np

from .base import Call, rand_f32, register, same_as_input
from .validation import FLOATS, any_on_device, as_float, check_ndim, check_result_fits, finite_scalar, promote, \
    shape_mismatch

OP = "attention"


CAUSAL_MODES = {False: 0, True: 1, "upper_left": 1, "lower_right": 2}
CAUSAL_NAMES = ("False", "True", '"upper_left"', '"lower_right"')


def causal_code(causal, op=OP) -> int:
    """0 (no mask), 1 (top-left aligned: True, "upper_left") or 2 ("lower_right"); any other value is a
    ValueError naming the choices."""
    if isinstance(causal, (bool, np.bool_)):
        return int(bool(causal))
    if isinstance(causal, str) and causal in ("upper_left", "lower_right"):
        return CAUSAL_MODES[causal]
    raise ValueError(f"{op}: causal must be one of {', '.join(CAUSAL_NAMES)}, got {causal!r}")


def check_kv_len(kv_len, batch: int, seq_k: int, op=OP):
    """kv_len as a C-contiguous int64 host array of shape (batch,) with every entry in [0, seq_k], or None.
    A device array is refused: the lengths are a few bytes the launch reads on the host side."""
    if kv_len is None:
        return None
    if type(kv_len) is not np.ndarray and hasattr(kv_len, "__cuda_array_interface__"):
        raise TypeError(f"{op}: kv_len must be a host integer array (NumPy or a sequence), not a device array")
    a = np.asarray(kv_len)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{op}: kv_len must be an integer array of shape ({batch},), got dtype {a.dtype}")
    if a.shape != (batch,):
        raise ValueError(f"{op}: kv_len must have shape (batch,) = ({batch},), got {a.shape}")
    if a.size and (int(a.min()) < 0 or int(a.max()) > seq_k):
        raise ValueError(f"{op}: kv_len entries must be within [0, seq_k] = [0, {seq_k}], got "
                         f"min {int(a.min())}, max {int(a.max())}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _split(call):
    """batch * heads_kv groups: each (b, KV head) slice and the query heads it serves attend only within
    themselves (q reshaped to (b * heads_kv, group, seq_q, d), views; kv_len repeated per KV head)."""
    args = call.args
    if len(args) < 3 or not all(isinstance(a, np.ndarray) and a.ndim == 4 for a in args[:3]):
        return None
    q, k, v = args[:3]
    kv_len = args[3] if len(args) > 3 else None
    b, h, hkv = q.shape[0], q.shape[1], k.shape[1]
    n = b * hkv
    if n < 2:
        return None
    g = h // hkv
    fq = q.reshape(n, g, q.shape[2], q.shape[3])
    fk, fv = (a.reshape(n, 1, a.shape[2], a.shape[3]) for a in (k, v))
    fl = None if kv_len is None else np.repeat(kv_len, hkv)

    def part(lo, hi):
        return (fq[lo:hi], fk[lo:hi], fv[lo:hi]) + (() if fl is None else (fl[lo:hi],))

    return n, part, (lambda rs: np.concatenate(rs, axis=0).reshape(q.shape[:3] + (q.shape[3],)))


def _sweep(rng):
    for s in (16, 64, 128, 256, 512):
        q, k, v = (rand_f32(rng, 1, 4, s, 64) for _ in range(3))
        yield 4 * s * s * 64, (q, k, v), {}


def check_attention(q, k, v, causal, scale, op=OP):
    """The shape and parameter rule, on anything with shape: q, k, v 4-d, k of v's shape, batch and
    head_dim agreeing, q's heads a multiple of k's (grouped-query attention), causal one of False, True,
    "upper_left", "lower_right", scale None or finite within float32's range. Returns (scale, causal code):
    the checked scale (None stays None) and causal_code's 0, 1 or 2. hipsched.dask.attention applies it
    to Dask arrays before any task."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_ndim(x, (4,), op, name)
    if tuple(k.shape) != tuple(v.shape):
        raise shape_mismatch(op, "k", k.shape, "v", v.shape, "k and v must both be (batch, heads_kv, seq_k, head_dim)")
    if (q.shape[0], q.shape[3]) != (k.shape[0], k.shape[3]):
        raise shape_mismatch(op, "q", q.shape, "k", k.shape,
                             "batch and head_dim must agree; only the heads and sequence lengths may differ")
    hq, hkv = int(q.shape[1]), int(k.shape[1])
    if hkv == 0 and hq != 0 or hkv and hq % hkv:
        raise shape_mismatch(op, "q", q.shape, "k", k.shape,
                             f"q's heads ({hq}) must be a multiple of k's and v's ({hkv}): query head h uses "
                             f"KV head h // (heads_q / heads_kv)")
    code = causal_code(causal, op)
    if scale is not None:
        scale = finite_scalar(scale, op, "scale")
        # the kernels take scale as float32 and fold log2(e) into it: beyond that range 0 * inf gives NaN
        if abs(scale) * math.log2(math.e) > float(np.finfo(np.float32).max):
            raise ValueError(f"{op}: scale must be within float32's range (|scale| <= about 2.4e38), got {scale!r}")
    return scale, code


@register(OP, cpu=("hipsched.cpu._attention", "attention_call"), gpu=("hipsched.gpu.glue.attention", "attention"),
          cpu_dtypes=FLOATS, gpu_dtypes=FLOATS, split=_split, sweep=_sweep, cost=(0.05, 4.0),
          result=same_as_input())
def prepare(q, k, v, causal=False, scale=None, kv_len=None) -> Call:
    """Scaled dot-product attention on (batch, heads, seq, head_dim) arrays: softmax(scale * q k^T) v,
    `scale` defaulting to 1/sqrt(head_dim). k and v may have fewer heads than q (a divisor of q's: query
    head h uses KV head h // (heads_q / heads_kv), nothing copied). `causal`: False; True or "upper_left"
    (query i sees keys j <= i, PyTorch's is_causal); "lower_right" (j <= i + kv_len - seq_q,
    FlashAttention-2's alignment, what a KV cache needs). `kv_len` (batch,) integers: keys at positions
    >= kv_len[b] are ignored. A query that sees no key gives zeros. q, k, v float32, float16 or bfloat16,
    accumulated in float32, the output in their dtype; a mix of float dtypes promotes to float32."""
    q = as_float(q, OP, "q")
    k = as_float(k, OP, "k")
    v = as_float(v, OP, "v")
    on_device = any_on_device(q, k, v)
    dtype, (q, k, v) = promote(OP, q=q, k=k, v=v)
    scale, code = check_attention(q, k, v, causal, scale)
    b, h, sq, d = (int(s) for s in q.shape)
    hkv, sk = int(k.shape[1]), int(k.shape[2])
    kv_len = check_kv_len(kv_len, b, sk)
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    check_result_fits(OP, b, h, sq, d)
    # work: each query against the keys it may see; bytes: Q and O once, K and V once per KV head
    keys = sk if kv_len is None else (float(kv_len.mean()) if b else 0.0)
    args = (q, k, v) if kv_len is None else (q, k, v, kv_len)
    return Call(OP, args, {"causal": code, "scale": scale},
                size=max(int(b * h * sq * keys * d), 0),
                nbytes=q.dtype.itemsize * (2 * b * h * sq * d + 2 * b * hkv * sk * d), dtype=dtype,
                on_device=on_device)
