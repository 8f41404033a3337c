"""matmul, attention, dequantize and qmatmul on Dask arrays, as blockwise maps through each worker's
executor (workers.executor). Shapes, dtypes and chunking are checked on the client before any task is
built, with the single-machine ops' messages. See docs/guide/distributed.md for the equality to expect."""
from __future__ import annotations

import math
import numbers

import dask
import dask.array as da
import numpy as np

from ..gguf_blocks import BLOCK_BYTES, QuantizedTensor, check_shape, qtype_name, row_blocks, row_bytes
from ..ops.attention import check_attention
from ..ops.validation import as_f32, as_float, check_ndim, shape_mismatch
from ..ops.linalg import matmul_shapes
from .ops import _dask, _dtype_ok, result_dtype
from .workers import executor



def _known_chunks(x, op, arg):
    if any(math.isnan(c) for cs in x.chunks for c in cs):
        raise ValueError(f"hipsched.dask.{op}: {arg} has unknown chunk sizes; call {arg}.compute_chunk_sizes() first")


def _one_block(x, op, arg, ndims):
    """x (NumPy or Dask) as a one-chunk Dask array: a small operand every task needs whole (a vector or
    a few columns), sent once to each worker that runs one."""
    if isinstance(x, da.Array):
        _dtype_ok(x, op, arg)
        check_ndim(x, ndims, op, arg)
        _known_chunks(x, op, arg)
        return x.rechunk(x.shape) if x.numblocks != (1,) * x.ndim else x
    x = as_f32(x, op, arg, allow_device=False)
    check_ndim(x, ndims, op, arg)
    return da.from_array(x, chunks=x.shape, name=f"hipsched-{arg}-{dask.base.tokenize(x)}")


# ---------------------------------------------------------------------------------------- matmul
def _mm_block(ab, bb):
    return executor().matmul(ab, bb)


def _mm_partial(ab, bb, axis):
    # one term of the sum over the contraction's chunks, on an axis of its own that the sum removes; in
    # float32 (half operands widened exactly, as the single-machine op does), rounded once after the sum
    if ab.dtype != np.float32 or bb.dtype != np.float32:
        ab, bb = ab.astype(np.float32), bb.astype(np.float32)
    return np.expand_dims(np.asarray(executor().matmul(ab, bb)), axis)


def _matmul_operand(x, arg):
    if isinstance(x, da.Array):
        _dtype_ok(x, "matmul", arg)
        return x
    x = as_float(x, "matmul", arg, allow_device=False)
    return da.from_array(x, chunks=x.shape, name=f"hipsched-matmul-{arg}-{dask.base.tokenize(x)}")


def matmul(a, b):
    """hipsched.matmul on Dask arrays (one of them may be NumPy): np.matmul's shape rules (1-d
    operands; batch axes equal on both sides or on one side only). Each output block is its row block
    of a times its column block of b through the worker's executor; the operands' chunks along shared
    axes (the contraction, the batch) are unified as dask.array.blockwise does. When the contraction
    axis (a's last) is in one chunk, each element is one BLAS dot as on one machine; when it is in c
    chunks, the c partial products are separate tasks summed in a fixed tree. Either way BLAS's own
    blocking decides the summation order, so the result agrees with the single-machine op within the
    float32 bound 2 gamma_(k+c) (|a| @ |b|), gamma_m = m 2^-24 / (1 - m 2^-24)."""
    if not isinstance(a, da.Array) and not isinstance(b, da.Array):
        raise TypeError(f"hipsched.dask.matmul: at least one of a, b must be a dask array, got "
                        f"{type(a).__name__} and {type(b).__name__} (hipsched.matmul takes NumPy arrays)")
    a = _matmul_operand(a, "a")
    b = _matmul_operand(b, "b")
    sa, sb = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
    ba, bb = matmul_shapes(sa, sb)[:2]   # the single-machine op's rule and messages
    _known_chunks(a, "matmul", "a")
    _known_chunks(b, "matmul", "b")
    nb = len(ba or bb)
    if nb > 20:
        raise ValueError(f"hipsched.dask.matmul: at most 20 batch axes, got {nb}")
    batch = "".join(chr(ord("A") + i) for i in range(nb))
    a_ind = (batch if ba else "") + ("i" if len(sa) > 1 else "") + "k"
    b_ind = (batch if bb else "") + "k" + ("j" if len(sb) > 1 else "")
    core = ("i" if len(sa) > 1 else "") + ("j" if len(sb) > 1 else "")
    chunkss, (a, b) = da.core.unify_chunks(a, a_ind, b, b_ind)
    token = dask.base.tokenize(a, b)
    out = result_dtype(a, b)
    if len(chunkss["k"]) == 1:
        return da.blockwise(_mm_block, batch + core, a, a_ind, b, b_ind, dtype=out, concatenate=True,
                            name="hipsched-matmul-" + token)
    parts = da.blockwise(_mm_partial, batch + "k" + core, a, a_ind, b, b_ind, axis=nb, adjust_chunks={"k": 1},
                         dtype=np.float32, name="hipsched-matmul-partial-" + token)
    total = parts.sum(axis=nb, dtype=np.float32)
    return total if out == np.float32 else total.astype(out)


# ---------------------------------------------------------------------------------------- attention
def _attn_block(qb, kb, vb, causal, scale):
    return executor().attention(qb, kb, vb, causal=causal, scale=scale)


def attention(q, k, v, causal=False, scale=None):
    """hipsched.attention on Dask arrays (batch, heads, seq, head_dim), chunked over batch and heads
    only: each block of (batch, heads) runs through its worker's executor with whole sequences, so it is
    the single-machine computation of those slices, bit for bit. k and v are rechunked to q's batch and
    head chunks when theirs differ. A chunked seq or head_dim axis is a ValueError naming the rechunk
    (a query needs every key of its slice; splitting them would need a second softmax pass)."""
    op = "attention"
    q, k, v = _dask(q, op, "q"), _dask(k, op, "k"), _dask(v, op, "v")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _dtype_ok(x, op, name)
    scale = check_attention(q, k, v, causal, scale)  # the single-machine op's rule and messages
    for name, x in (("q", q), ("k", k), ("v", v)):
        _known_chunks(x, op, name)
        if len(x.chunks[2]) > 1 or len(x.chunks[3]) > 1:
            raise ValueError(f"hipsched.dask.attention: {name} {tuple(x.shape)} is chunked along seq or head_dim "
                             f"(chunks {x.chunks[2]}, {x.chunks[3]}); chunk it over batch and heads only: "
                             f"{name} = {name}.rechunk({{2: -1, 3: -1}})")
    # scale stays None when not given: each block then derives 1/sqrt(head_dim) exactly as one machine does
    return da.blockwise(_attn_block, "bhsd", q, "bhsd", k, "bhtd", v, "bhtd", dtype=result_dtype(q, k, v), concatenate=True,
                        causal=bool(causal), scale=scale,
                        name="hipsched-attention-" + dask.base.tokenize(q, k, v, bool(causal), scale))


# ---------------------------------------------------------------------------------------- quantized
class QuantizedRows:
    """A GGUF-quantized matrix (n, k) sharded by rows, for hipsched.dask.dequantize and qmatmul.

    `blocks` is a Dask uint8 array (n, row bytes) of the raw GGUF block bytes (a QuantizedTensor's
    `.data`), chunked by rows only: each chunk is a QuantizedTensor of its rows, and a row's blocks are
    never split. Build one with `shard_rows(qt, rows_per_chunk)`, from a list of QuantizedTensor row
    blocks with `shard_rows([qt0, qt1, ...])`, or directly from a Dask array of the bytes (e.g.
    `da.from_array(np.memmap(gguf_file, ...), chunks=(rows, -1))`, so each worker reads its own rows).
    `persist()` keeps the chunks in the workers' memory for repeated products."""

    __slots__ = ("_blocks", "_shape", "_qtype")

    def __init__(self, blocks, shape, qtype):
        qtype = qtype_name(qtype, "QuantizedRows")
        n, k = check_shape(shape, "QuantizedRows")
        if not isinstance(blocks, da.Array):
            raise TypeError(f"QuantizedRows: blocks must be a dask array of uint8 GGUF block bytes, got "
                            f"{type(blocks).__name__} (hipsched.dask.shard_rows(qt, rows_per_chunk) makes one "
                            f"from a QuantizedTensor)")
        if blocks.dtype != np.uint8:
            raise TypeError(f"QuantizedRows: blocks must hold raw GGUF block bytes as uint8, got dtype {blocks.dtype}")
        nbytes = row_bytes(k, qtype)
        if tuple(blocks.shape) != (n, nbytes):
            raise ValueError(f"QuantizedRows: {qtype} blocks for shape ({n}, {k}) must be ({n}, {nbytes}) bytes "
                             f"({row_blocks(k)} blocks x {BLOCK_BYTES[qtype]} bytes per row), got {tuple(blocks.shape)}")
        _known_chunks(blocks, "QuantizedRows", "blocks")
        if len(blocks.chunks[1]) > 1:
            raise ValueError(f"QuantizedRows: blocks are chunked along the row bytes (chunks {blocks.chunks[1]}); "
                             f"a row's blocks must stay together: blocks.rechunk({{1: -1}})")
        self._blocks, self._shape, self._qtype = blocks, (n, k), qtype

    blocks = property(lambda self: self._blocks, doc="Dask uint8 (n, row bytes), chunked by rows")
    shape = property(lambda self: self._shape, doc="(n, k) of the float matrix it encodes")
    qtype = property(lambda self: self._qtype, doc="'q8_0' or 'q4_0'")
    chunks = property(lambda self: self._blocks.chunks[0], doc="rows per chunk")
    nbytes = property(lambda self: int(self._blocks.nbytes), doc="bytes of block data")
    ndim = 2

    def persist(self, **kwargs) -> "QuantizedRows":
        return QuantizedRows(self._blocks.persist(**kwargs), self._shape, self._qtype)

    def __repr__(self):
        return (f"QuantizedRows(shape={self._shape}, qtype={self._qtype!r}, chunks={len(self.chunks)} of up to "
                f"{max(self.chunks, default=0)} rows)")


def shard_rows(w, rows_per_chunk=None) -> QuantizedRows:
    """A QuantizedTensor sharded by rows: `shard_rows(qt, rows_per_chunk)` cuts it into chunks of
    `rows_per_chunk` rows (the last may be shorter); `shard_rows([qt0, qt1, ...])` stacks row blocks of
    one qtype and row length, one chunk each, in order. The bytes are not copied or requantized, so a
    chunk's rows are the same bytes as in the whole tensor."""
    if isinstance(w, QuantizedTensor):
        if isinstance(rows_per_chunk, (bool, np.bool_)) or not isinstance(rows_per_chunk, numbers.Integral) \
                or rows_per_chunk < 1:
            raise ValueError(f"hipsched.dask.shard_rows: rows_per_chunk must be an integer >= 1, got {rows_per_chunk!r}")
        data = w.data
        blocks = da.from_array(data, chunks=(int(rows_per_chunk), data.shape[1]),
                               name="hipsched-qrows-" + dask.base.tokenize(data, w.qtype, int(rows_per_chunk)))
        return QuantizedRows(blocks, w.shape, w.qtype)
    if isinstance(w, (list, tuple)):
        if rows_per_chunk is not None:
            raise ValueError("hipsched.dask.shard_rows: rows_per_chunk applies to one QuantizedTensor; a list of "
                             "row blocks is one chunk per block")
        if not w:
            raise ValueError("hipsched.dask.shard_rows: the list of row blocks is empty")
        for i, t in enumerate(w):
            if not isinstance(t, QuantizedTensor):
                raise TypeError(f"hipsched.dask.shard_rows: block {i} must be a QuantizedTensor, got {type(t).__name__}")
            if (t.qtype, t.shape[1]) != (w[0].qtype, w[0].shape[1]):
                raise ValueError(f"hipsched.dask.shard_rows: block {i} is {t.qtype} with rows of {t.shape[1]}, block 0 "
                                 f"is {w[0].qtype} with rows of {w[0].shape[1]}: row blocks must share qtype and k")
        parts = [da.from_array(t.data, chunks=t.data.shape, name="hipsched-qrows-" + dask.base.tokenize(t.data, t.qtype))
                 for t in w]
        return QuantizedRows(da.concatenate(parts, axis=0), (sum(t.shape[0] for t in w), w[0].shape[1]), w[0].qtype)
    raise TypeError(f"hipsched.dask.shard_rows: expected a QuantizedTensor or a list of them, got {type(w).__name__}")


def _check_rows(w, op):
    if isinstance(w, QuantizedTensor):
        raise TypeError(f"hipsched.dask.{op}: w is a whole QuantizedTensor; shard it by rows first: "
                        f"w = hipsched.dask.shard_rows(w, rows_per_chunk) (hipsched.{op} takes it as it is)")
    if not isinstance(w, QuantizedRows):
        raise TypeError(f"hipsched.dask.{op}: argument 'w' must be a QuantizedRows (see hipsched.dask.shard_rows), "
                        f"got {type(w).__name__}")
    return w


def _rows_tensor(block, k, qtype):
    return QuantizedTensor(block, (block.shape[0], k), qtype)   # no copy for a contiguous chunk


def _dequantize_block(block, k, qtype):
    return executor().dequantize(_rows_tensor(block, k, qtype))


def _qmatmul_block(block, xb, k, qtype):
    return executor().qmatmul(_rows_tensor(block, k, qtype), xb)


def dequantize(w):
    """hipsched.dequantize of a QuantizedRows -> Dask float32 (n, k), chunked as w's rows; each chunk is
    the single-machine dequantization of its rows, bit for bit."""
    w = _check_rows(w, "dequantize")
    n, k = w.shape
    return w.blocks.map_blocks(_dequantize_block, k, w.qtype, chunks=(w.chunks, (k,)), dtype=np.float32,
                               name="hipsched-dequantize-" + dask.base.tokenize(w.blocks, w.qtype, k))


def qmatmul(w, x):
    """hipsched.qmatmul of a QuantizedRows w (n, k) and x (k,) or (k, m), NumPy or Dask -> Dask (n,) or
    (n, m) chunked as w's rows. x is sent whole to every task (one chunk). The CPU kernel computes each
    row's dot products on their own, so each chunk's rows are the single-machine op's, bit for bit."""
    w = _check_rows(w, "qmatmul")
    xd = _one_block(x, "qmatmul", "x", (1, 2))
    n, k = w.shape
    if xd.shape[0] != k:
        raise shape_mismatch("qmatmul", "w", w.shape, "x", xd.shape, "w is (n, k); x must be (k,) or (k, m)")
    out_ind = "i" if xd.ndim == 1 else "im"
    x_ind = "c" if xd.ndim == 1 else "cm"
    return da.blockwise(_qmatmul_block, out_ind, w.blocks, "ib", xd, x_ind, k=k, qtype=w.qtype, dtype=np.float32,
                        concatenate=True, name="hipsched-qmatmul-" + dask.base.tokenize(w.blocks, w.qtype, xd))
