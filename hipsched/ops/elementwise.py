"""Elementwise ops: add, scale, softmax (validation and work measures; see base.py).

add(a, b): b has a's shape, or a trailing part of it (a bias repeated over a's leading axes; a 0-d b
is a scalar). scale(x, alpha): alpha any real scalar, rounded to float32 as NumPy does for
`float32_array * python_float`; NaN/inf alpha propagate as in NumPy.
softmax(x, axis=-1): exp(x - max) / sum along `axis`, exactly scipy.special.softmax's formula, so a
slice containing NaN, or whose max is +inf or -inf (all -inf), comes out all NaN, and -inf entries
give 0 when the slice has a finite max. Results agree with scipy in float64 to about 1e-6 relative
(the CPU kernel's vector exp is within 2 ulp).

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
from . import base
from .base import FLOATS, Call, any_on_device, as_float, check_result_fits, dtype_name, promote, rand_f32, \
    partition_from_split, register, shape_mismatch, split_rows

_CPU = "hipsched.cpu._elementwise"
_GPU = "hipsched.gpu.ops.elementwise"


def _elements(op: str, shape, itemsize: int = 4) -> int:
    """Element count of a result of `shape`, MemoryError (check_result_fits) if it cannot fit.
    These results are the size of an input, so the full check runs only past the cheap bound."""
    n = math.prod(shape)
    if itemsize * n > base.PHYSICAL_MEMORY:
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
          sweep=_sweep_rows(lambda rng, x: ((x, rand_f32(rng, *x.shape)), {})), cost=(12.0, 1.0))
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
          sweep=_sweep_rows(lambda rng, x: ((x, 0.5), {})), cost=(8.0, 1.0))
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
          sweep=_sweep_rows(lambda rng, x: ((x,), {"axis": -1})), cost=(8.0, 5.0))
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
