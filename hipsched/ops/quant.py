"""GGUF block-quantized weights: the QuantizedTensor container, `quantize`, and the registered
`dequantize` and `qmatmul` ops (validation and work measures; the kernels are src_c/cpu/quant*.c).

Formats are ggml's, blocks of 32 consecutive elements along each row, little-endian:
  q8_0: fp16 scale d + 32 int8 q            (34 bytes per block), value = q * d
  q4_0: fp16 scale d + 16 bytes of nibbles  (18 bytes per block), element j in the low nibble of byte j,
        element j + 16 in the high nibble, value = (q - 8) * d
so the bytes are interchangeable with the `gguf` package and llama.cpp model files."""
from __future__ import annotations

import numpy as np

from .base import Call, any_on_device, as_f32, check_ndim, check_result_fits, rand_f32, register, shape_mismatch

__all__ = ["QuantizedTensor", "quantize"]

QK = 32
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}


def _qtype_name(qtype, where: str) -> str:
    """'q8_0' / 'q4_0' from a string in any case or a gguf GGMLQuantizationType member."""
    name = getattr(qtype, "name", qtype)
    if isinstance(name, str) and name.lower() in BLOCK_BYTES:
        return name.lower()
    raise ValueError(f"{where}: qtype must be one of {sorted(BLOCK_BYTES)}, got {qtype!r}")


def _check_shape(shape, where: str):
    try:
        n, k = (int(s) for s in shape)
        ok = all(int(s) == s for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: shape must be a pair of integers (n, k), got {shape!r}") from None
    if not ok or n < 0 or k < 0:
        raise ValueError(f"{where}: shape must be two non-negative integers (n, k), got {shape!r}")
    if k % QK:
        raise ValueError(f"{where}: k = {k} (the row length) must be a multiple of the block size {QK}")
    return n, k


class QuantizedTensor:
    """A (n, k) matrix in GGUF Q8_0 or Q4_0 blocks.

    `data` is the raw block bytes: a uint8 NumPy array (any shape, e.g. a gguf tensor's `.data`), or
    bytes / bytearray / memoryview; its length must be n * (k / 32) * block bytes. `.data` reads it back
    as a read-only uint8 array of shape (n, row bytes), sharing memory with what was given (no copy for
    contiguous arrays, so gguf memory maps stay mapped, not loaded): do not modify the source afterwards.
    The tensor is immutable; caches (the GPU's resident copies) key on its identity."""

    __slots__ = ("_data", "_shape", "_qtype", "__weakref__")

    def __init__(self, data, shape, qtype):
        qtype = _qtype_name(qtype, "QuantizedTensor")
        n, k = _check_shape(shape, "QuantizedTensor")
        if isinstance(data, (bytes, bytearray, memoryview)):
            arr = np.frombuffer(data, dtype=np.uint8)
        elif isinstance(data, np.ndarray):
            if data.dtype != np.uint8:
                raise TypeError(f"QuantizedTensor: data must be raw GGUF block bytes as uint8, got dtype {data.dtype}")
            arr = np.ascontiguousarray(data).reshape(-1)
        else:
            raise TypeError(f"QuantizedTensor: data must be a uint8 array, bytes or memoryview, "
                            f"got {type(data).__name__}")
        row_bytes = (k // QK) * BLOCK_BYTES[qtype]
        if arr.size != n * row_bytes:
            raise ValueError(f"QuantizedTensor: {qtype} data for shape ({n}, {k}) must be {n * row_bytes} bytes "
                             f"({n} rows x {k // QK} blocks x {BLOCK_BYTES[qtype]} bytes), got {arr.size}")
        view = arr.reshape(n, row_bytes).view()
        view.flags.writeable = False
        self._data, self._shape, self._qtype = view, (n, k), qtype

    data = property(lambda self: self._data, doc="uint8 (n, row bytes) GGUF blocks, read-only")
    shape = property(lambda self: self._shape, doc="(n, k) of the float matrix it encodes")
    qtype = property(lambda self: self._qtype, doc="'q8_0' or 'q4_0'")
    dtype = property(lambda self: self._qtype, doc="the qtype (what Call.dtype and telemetry report)")
    nbytes = property(lambda self: self._data.nbytes, doc="bytes of block data")
    ndim = 2

    def __setattr__(self, name, value):
        if hasattr(self, "_qtype"):
            raise AttributeError("QuantizedTensor is immutable")
        object.__setattr__(self, name, value)

    def __reduce__(self):  # pickles (e.g. to worker processes) as its bytes
        return (QuantizedTensor, (np.array(self._data), self._shape, self._qtype))

    def __repr__(self):
        return f"QuantizedTensor(shape={self._shape}, qtype={self._qtype!r}, nbytes={self.nbytes})"


def quantize(W, qtype) -> QuantizedTensor:
    """Quantize a float matrix W (n, k), k a multiple of 32, to "q8_0" or "q4_0" GGUF blocks.

    Rounding is ggml's reference quantizer's (quantize_row_q8_0_ref / q4_0_ref), so the bytes equal the
    `gguf` package's `gguf.quants.quantize(W, GGMLQuantizationType.Q8_0 / Q4_0)`. W is converted to
    float32 as NumPy's astype would. ValueError for NaN/inf in W, and for magnitudes whose fp16 block
    scale would overflow (|W| >= about 8.3e6 for q8_0, 5.2e5 for q4_0), where ggml would write inf."""
    from ..cpu import _quant
    qtype = _qtype_name(qtype, "quantize")
    W = as_f32(W, "quantize", "W", allow_device=False)
    check_ndim(W, (2,), "quantize", "W")
    _check_shape(W.shape, "quantize")
    return QuantizedTensor(_quant.quantize(W, qtype), W.shape, qtype)


def _check_qt(w, op: str) -> QuantizedTensor:
    if not isinstance(w, QuantizedTensor):
        raise TypeError(f"{op}: argument 'w' must be a QuantizedTensor (see hipsched.quantize), "
                        f"got {type(w).__name__}")
    return w


_CPU = "hipsched.cpu._quant"
_GPU = "hipsched.gpu.ops_quant"


def _split_qmatmul(call):
    """Columns of x: each is an independent matrix-vector product with the whole of w."""
    args = call.args
    if len(args) < 2 or not isinstance(args[1], np.ndarray) or args[1].ndim != 2 or args[1].shape[1] < 2:
        return None
    w, v = args[0], args[1]
    return v.shape[1], (lambda lo, hi: (w, np.ascontiguousarray(v[:, lo:hi])) + tuple(args[2:])), \
        (lambda rs: np.concatenate(rs, axis=1))


def _sweep(with_x):
    def sweep(rng):
        for n in (64, 256, 1024, 2048):
            w = quantize(rand_f32(rng, n, 1024), "q8_0")
            yield n * 1024, ((w, rand_f32(rng, 1024)) if with_x else (w,)), {}
    return sweep


_QTYPES = tuple(BLOCK_BYTES)


@register("dequantize", cpu=(_CPU, "dequantize"), gpu=(_GPU, "dequantize"), cpu_dtypes=_QTYPES, gpu_dtypes=_QTYPES,
          sweep=_sweep(False))
def prepare_dequantize(w) -> Call:
    _check_qt(w, "dequantize")
    n, k = w.shape
    check_result_fits("dequantize", n, k)
    return Call("dequantize", (w,), {}, size=n * k, nbytes=w.nbytes + 4 * n * k, dtype=w.qtype)


@register("qmatmul", cpu=(_CPU, "qmatmul"), gpu=(_GPU, "qmatmul"), cpu_dtypes=_QTYPES, gpu_dtypes=_QTYPES,
          split=_split_qmatmul, sweep=_sweep(True))
def prepare_qmatmul(w, x) -> Call:
    """w (n, k) quantized times float32 x (k,) or (k, m). The CPU kernel keeps x in float32 and
    dequantizes each weight in registers (bit-exact to `dequantize`), so the result is the float32
    product of the dequantized matrix and x up to summation order: no 8-bit quantization of x."""
    _check_qt(w, "qmatmul")
    x = as_f32(x, "qmatmul", "x")
    check_ndim(x, (1, 2), "qmatmul", "x")
    n, k = w.shape
    if x.shape[0] != k:
        raise shape_mismatch("qmatmul", "w", w.shape, "x", x.shape, "w is (n, k); x must be (k,) or (k, m)")
    m = 1 if x.ndim == 1 else int(x.shape[1])
    check_result_fits("qmatmul", n, m)
    on_device = any_on_device(x)
    return Call("qmatmul", (w, x), {}, size=n * k * m, nbytes=w.nbytes + 4 * (k * m + n * m), dtype=w.qtype,
                on_device=on_device)
