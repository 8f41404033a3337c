"""The GGUF block format of quantized weights, as a leaf every layer may import: the block constants,
the pure layout checks and QuantizedTensor, the immutable container of the raw blocks. It imports
nothing of hipsched, so the op specs (ops/quant.py), the GPU glue (gpu/glue/quant.py) and hipsched.dask
share one definition of the layout without pointing at each other. The kernels that read the blocks
(src_c/cpu/quant*.c, src_c/hip/quant.hip) spell the same layout in C; a test checks they agree.

Formats are ggml's, blocks of QK = 32 consecutive elements along each row, little-endian:
  q8_0: fp16 scale d + 32 int8 q            (34 bytes per block), value = q * d
  q4_0: fp16 scale d + 16 bytes of nibbles  (18 bytes per block), element j in the low nibble of byte j,
        element j + 16 in the high nibble, value = (q - 8) * d
so the bytes are interchangeable with the `gguf` package and llama.cpp model files."""
from __future__ import annotations

import numpy as np

__all__ = ["QK", "BLOCK_BYTES", "QTYPES", "SUPERBLOCK", "QuantizedTensor", "qtype_name", "check_shape", "row_blocks",
           "row_superblocks", "row_bytes", "device_bytes"]

QK = 32
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}
QTYPES = tuple(BLOCK_BYTES)
# Blocks per superblock of the GPU's resident layout (hipsched/gpu/glue/quant.py's device_layout): a row
# is held there in whole superblocks of 512 quant bytes plus their scales, the last one padded. Here
# because the op specs' device memory accounting needs the size, and they import no GPU code.
SUPERBLOCK = {"q8_0": 16, "q4_0": 32}


def qtype_name(qtype, where: str) -> str:
    """'q8_0' / 'q4_0' from a string in any case or a gguf GGMLQuantizationType member."""
    name = getattr(qtype, "name", qtype)
    if isinstance(name, str) and name.lower() in BLOCK_BYTES:
        return name.lower()
    raise ValueError(f"{where}: qtype must be one of {sorted(BLOCK_BYTES)}, got {qtype!r}")


def check_shape(shape, where: str):
    """(n, k) as ints: non-negative, each row a whole number of blocks."""
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


def row_blocks(k: int) -> int:
    """Blocks in one row of k elements (k a multiple of QK): every count of blocks is this one."""
    return k // QK


def row_superblocks(k: int, qtype: str) -> int:
    """Superblocks of the GPU's resident layout in one row of k elements, the last one partly padding."""
    return -(-row_blocks(k) // SUPERBLOCK[qtype])


def row_bytes(k: int, qtype: str) -> int:
    """Bytes of one row of k elements (k a multiple of QK) in `qtype` blocks."""
    return row_blocks(k) * BLOCK_BYTES[qtype]


def device_bytes(n: int, k: int, qtype: str) -> int:
    """Bytes of a (n, k) `qtype` matrix in the GPU's resident layout: the block bytes, its rows padded to
    whole superblocks (equal to the block bytes when k is a multiple of 512 for q8_0, 1024 for q4_0)."""
    return n * row_superblocks(k, qtype) * SUPERBLOCK[qtype] * BLOCK_BYTES[qtype]


class QuantizedTensor:
    """A (n, k) matrix in GGUF Q8_0 or Q4_0 blocks.

    `data` is the raw block bytes: a uint8 NumPy array (any shape, e.g. a gguf tensor's `.data`), or
    bytes / bytearray / memoryview; its length must be n * (k / 32) * block bytes. `.data` reads it back
    as a read-only uint8 array of shape (n, row bytes), sharing memory with what was given (no copy for
    contiguous arrays, so gguf memory maps stay mapped, not loaded): do not modify the source afterwards.
    The tensor is immutable; caches (the GPU's resident copies) key on its identity."""

    __slots__ = ("_data", "_shape", "_qtype", "__weakref__")

    def __init__(self, data, shape, qtype):
        qtype = qtype_name(qtype, "QuantizedTensor")
        n, k = check_shape(shape, "QuantizedTensor")
        if isinstance(data, (bytes, bytearray, memoryview)):
            arr = np.frombuffer(data, dtype=np.uint8)
        elif isinstance(data, np.ndarray):
            if data.dtype != np.uint8:
                raise TypeError(f"QuantizedTensor: data must be raw GGUF block bytes as uint8, got dtype {data.dtype}")
            arr = np.ascontiguousarray(data).reshape(-1)
        else:
            raise TypeError(f"QuantizedTensor: data must be a uint8 array, bytes or memoryview, "
                            f"got {type(data).__name__}")
        nrow = row_bytes(k, qtype)
        if arr.size != n * nrow:
            raise ValueError(f"QuantizedTensor: {qtype} data for shape ({n}, {k}) must be {n * nrow} bytes "
                             f"({n} rows x {row_blocks(k)} blocks x {BLOCK_BYTES[qtype]} bytes), got {arr.size}")
        view = arr.reshape(n, nrow).view()
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
