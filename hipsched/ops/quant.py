"""GGUF block-quantized weights: `quantize`, and the registered `dequantize` and `qmatmul` ops
(validation and work measures; the kernels are src_c/cpu/quant*.c). The block format itself, and
QuantizedTensor, live in the leaf hipsched/gguf_blocks.py."""
from __future__ import annotations

import numpy as np

# QuantizedTensor is public here too (hipsched.QuantizedTensor resolves through this module)
from ..gguf_blocks import QTYPES, QuantizedTensor, check_shape, qtype_name
from .base import Call, Partition, _resolve, rand_f32, register
from .validation import FLOATS, any_on_device, as_float, check_ndim, check_result_fits, dtype_name, shape_mismatch

__all__ = ["QuantizedTensor", "quantize"]


def qmatmul_dtype(qtype: str, x_dtype: str) -> str:
    """qmatmul's Call.dtype: the weights' quant type and x's dtype, both of which pick the kernels and
    change the cost (a half x moves half the bytes), so the scheduler's model, the GPU's capability
    check and the telemetry all key on the pair. float32 x, the common case, is the quant type alone
    ("q8_0", as logs and saved models have always said); a half x is "q8_0/float16"."""
    return qtype if x_dtype == "float32" else f"{qtype}/{x_dtype}"


# every (quant type, x dtype) pair both sides run: Q8_0 and Q4_0 against float32, float16 and bfloat16
QMATMUL_DTYPES = tuple(qmatmul_dtype(q, x) for q in QTYPES for x in FLOATS)

_CPU = "hipsched.cpu._quant"
_GPU = "hipsched.gpu.glue.quant"
# quantize is not an op (it always runs on the CPU), so no spec names its kernel: this does, imported on
# first use like the specs' entries, so importing the op specs never loads a kernel module
_QUANTIZE = (_CPU, "quantize")


def quantize(W, qtype) -> QuantizedTensor:
    """Quantize a float matrix W (n, k), k a multiple of 32, to "q8_0" or "q4_0" GGUF blocks.

    Rounding is ggml's reference quantizer's (quantize_row_q8_0_ref / q4_0_ref), so the bytes equal the
    `gguf` package's `gguf.quants.quantize(W, GGMLQuantizationType.Q8_0 / Q4_0)`. W is converted to
    float32 as NumPy's astype would; a float16 or bfloat16 W is read as it is and widened (exactly) a row
    chunk at a time, so its bytes are gguf's quantization of the same values widened to float32.
    ValueError for NaN/inf in W, and for magnitudes whose fp16 block scale would overflow (|W| >= about
    8.3e6 for q8_0, 5.2e5 for q4_0), where ggml would write inf."""
    qtype = qtype_name(qtype, "quantize")
    W = as_float(W, "quantize", "W", allow_device=False)
    check_ndim(W, (2,), "quantize", "W")
    check_shape(W.shape, "quantize")
    return QuantizedTensor(_resolve(_QUANTIZE)(W, qtype), W.shape, qtype)


def _check_qt(w, op: str) -> QuantizedTensor:
    if not isinstance(w, QuantizedTensor):
        raise TypeError(f"{op}: argument 'w' must be a QuantizedTensor (see hipsched.quantize), "
                        f"got {type(w).__name__}")
    return w


def _split_qmatmul(call):
    """Columns of x: each is an independent matrix-vector product with the whole of w."""
    args = call.args
    if len(args) < 2 or not isinstance(args[1], np.ndarray) or args[1].ndim != 2 or args[1].shape[1] < 2:
        return None
    w, v = args[0], args[1]
    return v.shape[1], (lambda lo, hi: (w, np.ascontiguousarray(v[:, lo:hi])) + tuple(args[2:])), \
        (lambda rs: np.concatenate(rs, axis=1))


def _weight_rows(w: QuantizedTensor, lo: int, hi: int) -> QuantizedTensor:
    """Rows [lo, hi) of w, sharing its block bytes (a view: no copy, and the GPU reads them from w's kept
    copy at their offset)."""
    return QuantizedTensor(w.data[lo:hi], (hi - lo, w.shape[1]), w.qtype)


def _partition_rows(call):
    """Rows of the weights: each is its own dot product (qmatmul) or its own row of values (dequantize),
    x goes whole; results stacked along axis 0."""
    w = call.args[0]
    if not isinstance(w, QuantizedTensor) or w.shape[0] < 2 or call.on_device:
        return None
    rest = call.args[1:]
    return Partition(w.shape[0], lambda lo, hi: (_weight_rows(w, lo, hi),) + rest,
                     lambda results, bounds: np.concatenate(results, axis=0))


def _sweep(with_x):
    """Both quantization types (the model keeps each in its own slot); qmatmul also with a matrix x of
    m columns, up to the m * n * k of a transformer's projections over a few hundred tokens (the
    matrix-vector sizes alone left those buckets for the fit to guess, 1000x beyond its last point)."""
    shapes = [(64, 1), (256, 1), (1024, 1), (2048, 1)]
    if with_x:
        shapes += [(1024, 16), (2048, 64), (4096, 128), (4096, 512)]
    def sweep(rng):
        for n, m in shapes:   # growing sizes, so calibrate's time limit ends the sweep at the right point
            x = rand_f32(rng, 1024) if m == 1 else rand_f32(rng, 1024, m)
            for qtype in QTYPES:
                w = quantize(rand_f32(rng, n, 1024), qtype)
                yield n * 1024 * m, ((w, x) if with_x else (w,)), {}
    return sweep


def _x_dtype(call) -> str:
    """The float type of qmatmul's x, which its result takes: the part of Call.dtype after the quant type."""
    return call.dtype.partition("/")[2] or "float32"


def _qmatmul_result(call):
    """(n,) for an x of (k,), (n, m) for (k, m), in x's dtype."""
    w, x = call.args[0], call.args[1]
    return (int(w.shape[0]),) + tuple(int(s) for s in x.shape[1:]), _x_dtype(call)


@register("dequantize", cpu=(_CPU, "dequantize"), gpu=(_GPU, "dequantize"), cpu_dtypes=QTYPES, gpu_dtypes=QTYPES,
          partition=_partition_rows, sweep=_sweep(False), cost=(5.0, 1.0),
          result=lambda call: (tuple(int(s) for s in call.args[0].shape), "float32"))
def prepare_dequantize(w) -> Call:
    """QuantizedTensor (GGUF Q8_0 or Q4_0 blocks) -> float32 array of its shape."""
    _check_qt(w, "dequantize")
    n, k = w.shape
    check_result_fits("dequantize", n, k)
    return Call("dequantize", (w,), {}, size=n * k, nbytes=w.nbytes + 4 * n * k, dtype=w.qtype)


@register("qmatmul", cpu=(_CPU, "qmatmul"), gpu=(_GPU, "qmatmul"), cpu_dtypes=QMATMUL_DTYPES,
          gpu_dtypes=QMATMUL_DTYPES, split=_split_qmatmul, partition=_partition_rows,
          sweep=_sweep(True), cost=(0.1, 2.0), result=_qmatmul_result)
def prepare_qmatmul(w, x) -> Call:
    """Quantized weights w (n, k), a QuantizedTensor, times x (k,) or (k, m) -> (n,) or (n, m). Both
    backends dequantize each weight in registers (bit-exact to `dequantize`), so the result is the
    float32 product of the dequantized matrix and x up to summation order: no 8-bit quantization of x.
    x float32, float16 or bfloat16 (host or device); a half x is widened exactly (in registers on the
    GPU; the CPU widens it once, small next to w), the sums are float32, and the result is rounded once
    to x's dtype. Call.dtype is `qmatmul_dtype(w.qtype, x's dtype)`."""
    _check_qt(w, "qmatmul")
    x = as_float(x, "qmatmul", "x")
    check_ndim(x, (1, 2), "qmatmul", "x")
    n, k = w.shape
    if x.shape[0] != k:
        raise shape_mismatch("qmatmul", "w", w.shape, "x", x.shape, "w is (n, k); x must be (k,) or (k, m)")
    m = 1 if x.ndim == 1 else int(x.shape[1])
    check_result_fits("qmatmul", n, m)
    nbytes = w.nbytes + x.dtype.itemsize * (k * m + n * m)
    return Call("qmatmul", (w, x), {}, size=n * k * m, nbytes=nbytes, dtype=qmatmul_dtype(w.qtype, dtype_name(x)),
                on_device=any_on_device(x))
