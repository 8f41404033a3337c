"""Normalisation ops: rms_norm (validation, work measure and the op's spec; see base.py and validation.py).

rms_norm(x, weight, eps=1e-6): over the last axis of x (at least 1-d), x / sqrt(mean(x**2) + eps) *
weight, with weight of shape (x.shape[-1],) and eps a finite number > 0. Both backends form the sum of
squares and each product in float64 and round once to float32, so results are the float64 formula
within float32 rounding; NaN and inf go through the formula (a row holding inf comes out NaN where x is
inf and 0 elsewhere, a NaN makes its row NaN). Empty inputs give empty results.
Dtypes: float32, float16 and bfloat16 (ml_dtypes) run as they are on both backends (host or device
arrays), the result in x's dtype, rounded to it once from the float32 value (float16 past 65504 becomes
inf); x and weight of two different float dtypes promote to float32, as NumPy and PyTorch promote them,
and other real types convert to float32."""
from __future__ import annotations

import math

import numpy as np

from .base import Call, partition_from_split, rand_f32, register, same_as_input, split_rows
from .validation import FLOATS, any_on_device, as_float, check_result_fits, finite_scalar, promote, shape_mismatch

OP = "rms_norm"


def _split(call):
    """Rows of x (any axis but the last): each row is normalised on its own, weight goes whole."""
    x = call.args[0]
    return split_rows(call) if isinstance(x, np.ndarray) and x.ndim >= 2 else None


def _sweep(rng):
    """64 .. 4M elements in rows of up to 1024 (a transformer's hidden size is of that order)."""
    for n in (2 ** e for e in range(6, 23, 2)):
        width = min(n, 1024)
        yield n, (rand_f32(rng, n // width, width), rand_f32(rng, width)), {"eps": 1e-6}


@register(OP, cpu=("hipsched.cpu._norm", "rms_norm"), gpu=("hipsched.gpu.glue.norm", "rms_norm"), cpu_dtypes=FLOATS, gpu_dtypes=FLOATS,
          split=_split, partition=lambda call: partition_from_split(_split(call)),
          sweep=_sweep, cost=(8.0, 3.0), result=same_as_input())
def prepare_rms_norm(x, weight, eps=1e-6) -> Call:
    """x / sqrt(mean(x**2, -1) + eps) * weight over the last axis (float32, float16 or bfloat16);
    weight is (x.shape[-1],), eps finite and > 0."""
    x = as_float(x, OP, "x")
    weight = as_float(weight, OP, "weight")
    dtype, (x, weight) = promote(OP, x=x, weight=weight)
    if len(x.shape) == 0:
        raise ValueError(f"{OP}: argument 'x' must be at least 1-d, got a 0-d array")
    if tuple(weight.shape) != (x.shape[-1],):
        raise shape_mismatch(OP, "x", x.shape, "weight", weight.shape, "weight must be (x.shape[-1],)")
    if isinstance(eps, (str, bytes)):  # float() would parse it; a number is what the formula adds
        raise TypeError(f"{OP}: eps must be a real number, got {eps!r}")
    eps = finite_scalar(eps, OP, "eps")
    if not eps > 0:
        raise ValueError(f"{OP}: eps must be > 0, got {eps!r}")
    n = math.prod(x.shape)
    es = 4 if dtype == "float32" else 2
    check_result_fits(OP, *x.shape, itemsize=es)
    return Call(OP, (x, weight), {"eps": eps}, size=n, nbytes=es * (2 * n + int(weight.shape[0])), dtype=dtype,
                on_device=any_on_device(x, weight))
