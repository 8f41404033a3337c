"""Elementwise ops: add, scale, softmax, silu_mul, gelu, rope (validation and work measures; see base.py).

add(a, b): b has a's shape, or a trailing part of it (a bias repeated over a's leading axes; a 0-d b
is a scalar). scale(x, alpha): alpha any real scalar, rounded to float32 as NumPy does for
`float32_array * python_float`; NaN/inf alpha propagate as in NumPy.
softmax(x, axis=-1): exp(x - max) / sum along `axis`, exactly scipy.special.softmax's formula, so a
slice containing NaN, or whose max is +inf or -inf (all -inf), comes out all NaN, and -inf entries
give 0 when the slice has a finite max. Results agree with scipy in float64 to about 1e-6 relative
(the CPU kernel's vector exp is within 2 ulp).
silu_mul(gate, up): SwiGLU's silu(gate) * up = gate / (1 + exp(-gate)) * up, fused (one pass, no
intermediate array). gelu(x, approximate): torch.nn.functional.gelu's two forms, computed in float64
(so a large negative x, where 1 + erf cancels, keeps its relative accuracy). rope(x, positions): rotary
position embedding (the docstring of prepare_rope says exactly what it computes). Non-finite inputs
propagate as torch's float64 formulas give them (NaN in, NaN out; silu_mul(-inf) and gelu(-inf) are NaN).

Dtypes: float32, float16 and bfloat16 (ml_dtypes) run as they are on both backends, computed in float32 and
rounded once to the input dtype, which is the result's (float16 past 65504 becomes inf, as NumPy's and
PyTorch's conversion makes it). Other real types convert to float32; add's a and b of two different
float dtypes promote to float32, as NumPy and PyTorch promote them, but a Python scalar b takes a's
dtype (NumPy's rule for Python scalars, NEP 50)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..broadcast import bias_fits
from ..dlpack_devices import is_device_array
from . import validation
from .base import Call, rand_f32, partition_from_split, register, same_as_input, split_rows
from .foreign_arrays import _read_host
from .validation import FLOATS, any_on_device, as_float, check_result_fits, contiguous_aligned, dtype_name, out_array, \
    promote, shape_mismatch

_CPU = "hipsched.cpu._elementwise"
_GPU = "hipsched.gpu.glue.elementwise"


def _elements(op: str, shape, itemsize: int = 4) -> int:
    """Element count of a result of `shape`, MemoryError (check_result_fits) if it cannot fit.
    These results are the size of an input, so the full check runs only past the cheap bound."""
    n = math.prod(shape)
    if itemsize * n > validation.PHYSICAL_MEMORY:
        check_result_fits(op, *shape, itemsize=itemsize)
    return n


def _itemsize(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _sweep_rows(make):
    """64 .. 4M elements in rows of 256, about 4x per step (the usual CPU/GPU crossover lies inside)."""
    def sweep(rng):
        for n in (2 ** e for e in range(6, 23, 2)):
            rows = max(1, n // 256)
            x = rand_f32(rng, rows, n // rows)
            yield (n,) + make(rng, x)
    return sweep


def _split_softmax(call):
    x = call.args[0]
    if not isinstance(x, np.ndarray) or x.ndim < 2 or call.params.get("axis", -1) % x.ndim == 0:
        return None
    return split_rows(call)


@register("add", cpu=(_CPU, "add"), gpu=(_GPU, "add"), hot=(_CPU, "add_hot"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=lambda call: split_rows(call, same_shape_only=True),
          partition=lambda call: partition_from_split(split_rows(call, same_shape_only=True)),
          sweep=_sweep_rows(lambda rng, x: ((x, rand_f32(rng, *x.shape)), {})), cost=(12.0, 1.0),
          result=same_as_input())
def prepare_add(a, b) -> Call:
    """Elementwise a + b. b has a's shape, or a trailing part of it (a bias repeated over a's leading
    axes; a 0-d b or a Python number is a scalar). float32, float16 or bfloat16, computed in float32 and
    rounded once to the result's dtype: a's and b's when they agree, float32 for a mix of float dtypes
    (a Python scalar b takes a's dtype); other real types convert to float32."""
    a = as_float(a, "add", "a")
    if type(b) is float or type(b) is int:
        # a Python scalar is weak, as in NumPy: it takes a's dtype rather than widening a half a
        try:
            b = np.asarray(b, dtype=a.dtype)  # a device a's too: a host b beside it, as before
        except (OverflowError, TypeError):  # an int past float range: as_float names it as it always has
            pass
    b = as_float(b, "add", "b")
    dtype, (a, b) = promote("add", a=a, b=b)
    sa, sb = tuple(a.shape), tuple(b.shape)
    if not bias_fits(sa, sb):
        raise shape_mismatch("add", "a", sa, "b", sb, "b must have a's shape or a trailing part of it")
    es = _itemsize(dtype)
    n, nb = _elements("add", sa, es), math.prod(sb)
    return Call("add", (a, b), {}, size=n, nbytes=es * (2 * n + nb), dtype=dtype, on_device=any_on_device(a, b))


def _real_scalar(value, op: str, name: str) -> float:
    """A real scalar (Python or NumPy number, or a 0-d real array); NaN and inf allowed."""
    if type(value) is float or type(value) is int:  # the common case, before the ABC checks
        return float(value)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":
        return float(value)
    if isinstance(value, (numbers.Real, np.bool_)) and not isinstance(value, (str, bytes)):
        return float(value)
    raise TypeError(f"{op}: {name} must be a real scalar, got {value!r}")


@register("scale", cpu=(_CPU, "scale"), gpu=(_GPU, "scale"), hot=(_CPU, "scale_hot"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=split_rows, partition=lambda call: partition_from_split(split_rows(call)),
          sweep=_sweep_rows(lambda rng, x: ((x, 0.5), {})), cost=(8.0, 1.0),
          result=same_as_input())
def prepare_scale(x, alpha) -> Call:
    """alpha * x, alpha any real scalar (rounded to float32 as NumPy does; NaN and inf propagate). x
    float32, float16 or bfloat16, the result in x's dtype (computed in float32, rounded once); other real
    types convert to float32."""
    x = as_float(x, "scale", "x")
    alpha = _real_scalar(alpha, "scale", "alpha")
    dtype = dtype_name(x)
    es = _itemsize(dtype)
    n = _elements("scale", x.shape, es)
    return Call("scale", (x,), {"alpha": alpha}, size=n, nbytes=2 * es * n, dtype=dtype, on_device=any_on_device(x))


@register("softmax", cpu=(_CPU, "softmax"), gpu=(_GPU, "softmax"), hot=(_CPU, "softmax_hot"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=_split_softmax, partition=lambda call: partition_from_split(_split_softmax(call)),
          sweep=_sweep_rows(lambda rng, x: ((x,), {"axis": -1})), cost=(8.0, 5.0),
          result=same_as_input())
def prepare_softmax(x, axis=-1) -> Call:
    """Numerically stable softmax along `axis`: exp(x - max) / sum, scipy.special.softmax's formula (a
    slice holding NaN, or whose max is infinite, comes out all NaN). x float32, float16 or bfloat16, the
    result in x's dtype (computed in float32, rounded once); other real types convert to float32."""
    x = as_float(x, "softmax", "x")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"softmax: axis must be an integer, got {axis!r}")
    nd = len(x.shape)
    if nd == 0:
        raise ValueError("softmax: x must have at least one dimension, got a 0-d array")
    if not -nd <= axis < nd:
        raise ValueError(f"softmax: axis {axis} is out of range for shape {tuple(x.shape)}")
    dtype = dtype_name(x)
    es = _itemsize(dtype)
    n = _elements("softmax", x.shape, es)
    return Call("softmax", (x,), {"axis": int(axis) % nd}, size=n, nbytes=2 * es * n, dtype=dtype,
                on_device=any_on_device(x))


@register("silu_mul", cpu=(_CPU, "silu_mul"), gpu=(_GPU, "silu_mul"), hot=(_CPU, "silu_mul_hot"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=lambda call: split_rows(call, same_shape_only=True),
          partition=lambda call: partition_from_split(split_rows(call, same_shape_only=True)),
          sweep=_sweep_rows(lambda rng, x: ((x, rand_f32(rng, *x.shape)), {})),
          result=same_as_input())
def prepare_silu_mul(gate, up, *, out=None) -> Call:
    """SwiGLU's gate: silu(gate) * up = gate / (1 + exp(-gate)) * up, element-wise and fused. gate and up
    of one shape; float32, float16 or bfloat16, computed in float32 and rounded once to the result's
    dtype (theirs when they agree, float32 for a mix, as add promotes); other real types convert to
    float32. Non-finite values propagate as torch's silu(gate) * up gives them (gate -inf: NaN).
    out: a host array of the result's shape and dtype to write it into (gate or up itself for in place),
    returned; see validation.out_array."""
    gate = as_float(gate, "silu_mul", "gate")
    up = as_float(up, "silu_mul", "up")
    dtype, (gate, up) = promote("silu_mul", gate=gate, up=up)
    sg, su = tuple(gate.shape), tuple(up.shape)
    if sg != su:
        raise shape_mismatch("silu_mul", "gate", sg, "up", su, "gate and up must have one shape")
    es = _itemsize(dtype)
    n = _elements("silu_mul", sg, es)
    call = Call("silu_mul", (gate, up), {}, size=n, nbytes=3 * es * n, dtype=dtype, on_device=any_on_device(gate, up))
    call.out = out_array(out, "silu_mul", gate, (("gate", gate), ("up", up)))
    return call


GELU_FORMS = ("none", "tanh")


@register("gelu", cpu=(_CPU, "gelu"), gpu=(_GPU, "gelu"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=split_rows, partition=lambda call: partition_from_split(split_rows(call)),
          sweep=_sweep_rows(lambda rng, x: ((x,), {"approximate": "none"})),
          result=same_as_input())
def prepare_gelu(x, approximate="none", *, out=None) -> Call:
    """GELU as torch.nn.functional.gelu: approximate="none" is x * Phi(x) = 0.5 x erfc(-x / sqrt 2) (the
    erf form), "tanh" is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Each element is computed in
    float64 and rounded once to x's dtype (float32, float16 or bfloat16; other real types convert to
    float32), so the result is within half an ulp of torch's float64 gelu (plus what the float64
    formula itself loses in 1 + tanh for the tanh form). out: a host array of the result's shape and
    dtype to write it into (x itself for in place), returned; see validation.out_array."""
    if not isinstance(approximate, str) or approximate not in GELU_FORMS:
        raise ValueError(f"gelu: approximate must be one of {', '.join(repr(f) for f in GELU_FORMS)}, got {approximate!r}")
    x = as_float(x, "gelu", "x")
    dtype = dtype_name(x)
    es = _itemsize(dtype)
    n = _elements("gelu", x.shape, es)
    call = Call("gelu", (x,), {"approximate": approximate}, size=n, nbytes=2 * es * n, dtype=dtype,
                on_device=any_on_device(x))
    call.out = out_array(out, "gelu", x, (("x", x),))
    return call


ROPE_STYLES = ("neox", "gptj")


def _rope_positions(positions, x_shape):
    """positions as a C-contiguous int64 host array of shape (seq,) or, for a 4-d x, (batch, seq)."""
    if is_device_array(positions):
        raise TypeError("rope: positions must be a host integer array (seq ints, read by the CPU side and uploaded "
                        "with x for the GPU), got a device array")
    p = _read_host(positions, "rope", "positions")
    if p.dtype.kind not in "iu":
        raise TypeError(f"rope: positions must be an integer array, got dtype {p.dtype}")
    seq = x_shape[-2]
    allowed = [(seq,)] + ([(x_shape[0], seq)] if len(x_shape) == 4 else [])
    if tuple(p.shape) not in allowed:
        raise shape_mismatch("rope", "x", x_shape, "positions", p.shape,
                             "positions must be (seq,)" + (" or (batch, seq)" if len(x_shape) == 4 else ""))
    if p.dtype.kind == "u" and p.size and int(p.max()) > np.iinfo(np.int64).max:
        raise ValueError("rope: positions past int64's range")
    return contiguous_aligned(p, np.int64) if p.dtype != np.int64 else contiguous_aligned(p)


def rope_parameter(value, name: str) -> float:
    """base or scale: a real scalar (not a string), finite and > 0."""
    v = _real_scalar(value, "rope", name)
    if not math.isfinite(v):
        raise ValueError(f"rope: {name} must be finite, got {value!r}")
    if v <= 0:
        raise ValueError(f"rope: {name} must be > 0, got {value!r}")
    return v


def _split_rope(call):
    """Rows of x's first axis (batch, or heads for a 3-d x), positions cut alike when they are per batch."""
    x, pos = call.args
    if not isinstance(x, np.ndarray) or x.shape[0] < 2:
        return None
    per_batch = pos.ndim == 2
    return x.shape[0], (lambda lo, hi: (x[lo:hi], pos[lo:hi] if per_batch else pos)), \
        (lambda rs: np.concatenate(rs, axis=0))


def _sweep_rope(rng):
    """(1, 8, seq, 64) for seq 1 .. 8192: a decode step up to a long prefill."""
    for seq in (1, 8, 64, 512, 2048, 8192):
        x = rand_f32(rng, 1, 8, seq, 64)
        yield (x.size, (x, np.arange(seq, dtype=np.int64)), {})


@register("rope", cpu=(_CPU, "rope"), gpu=(_GPU, "rope"), hot=(_CPU, "rope_hot"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=_split_rope, partition=lambda call: partition_from_split(_split_rope(call)), sweep=_sweep_rope,
          result=same_as_input())
def prepare_rope(x, positions, *, base=10000.0, scale=1.0, style="neox", out=None) -> Call:
    """Rotary position embedding of x (batch, heads, seq, head_dim) or (heads, seq, head_dim), head_dim
    even, at integer `positions` (seq,) (one position per sequence index, shared by every batch row) or,
    for a 4-d x, (batch, seq). With d = head_dim and i = 0 .. d/2 - 1, pair i of each row is rotated by
    the angle theta_i = (pos / scale) * base^(-2i/d):
        (a, b) -> (a cos theta_i - b sin theta_i, a sin theta_i + b cos theta_i).
    style="neox" pairs element i with i + d/2 (the halves: llama.cpp's ROPE_TYPE_NEOX, HF Llama's
    rotate_half), style="gptj" pairs 2i with 2i + 1 (interleaved: llama.cpp's ROPE_TYPE_NORM, the original
    GPT-J / Meta Llama layout). `scale` is linear position interpolation: positions are divided by it
    (scale=4 stretches a model trained on n positions over 4n); base is the frequency base (10000, or
    500000 for Llama 3). The angles are formed in float64 (pos / scale * base^(-2i/d), reduced, their
    cosine and sine rounded to float32), so positions far past 32k lose nothing; the rotation is float32,
    rounded once to x's dtype (float32, float16, bfloat16; other real types convert to float32).

    The result is a new array on the side x lives on, or, for a host x, `out`: a host array of x's shape
    and dtype it is written into and returned. In place is out=x (each pair is read before it is
    written); see validation.out_array for what out must be. A device x's result is a new device array
    (write it where x is kept for in place)."""
    if not isinstance(style, str) or style not in ROPE_STYLES:
        raise ValueError(f"rope: style must be one of {', '.join(repr(s) for s in ROPE_STYLES)}, got {style!r}")
    base, scale = rope_parameter(base, "base"), rope_parameter(scale, "scale")
    x = as_float(x, "rope", "x")
    shape = tuple(x.shape)
    if len(shape) not in (3, 4):
        raise ValueError(f"rope: x must be 4-d (batch, heads, seq, head_dim) or 3-d (heads, seq, head_dim), got "
                         f"shape {shape}")
    if shape[-1] % 2:
        raise ValueError(f"rope: head_dim (x's last axis) must be even, got {shape[-1]}")
    pos = _rope_positions(positions, shape)
    dtype = dtype_name(x)
    es = _itemsize(dtype)
    n = _elements("rope", shape, es)
    call = Call("rope", (x, pos), {"base": base, "scale": scale, "style": style}, size=n,
                nbytes=2 * es * n + 8 * pos.size, dtype=dtype, on_device=any_on_device(x))
    call.out = out_array(out, "rope", x, (("x", x),))
    return call
