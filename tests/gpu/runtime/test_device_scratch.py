"""The device scratch each op's launch glue declares beside its planner (`<op>_scratch(call, multiprocessors)` in
hipsched/gpu/glue/<family>.py, read through OpSpec.device_scratch by GpuBackend.device_bytes_needed and
so by the memory check and the out-of-memory chunking) is exactly what the glue allocates beyond the
call's inputs and results.

The glue runs against a context that counts what it is asked for and runs nothing: the allocations are
the glue's own requests (ctx.empty, ctx.scratch by name, uploads in a packed layout), which do not depend
on what the kernels compute, so no device and no kernel emulator are needed. Every op of the op matrix
(tests/support/op_cases.py) on host data, and the shapes that change what is allocated."""
import itertools

import numpy as np
import pytest
from op_cases import CASES, matrix

from hipsched import quantize
from hipsched.gpu.compilation.kernel_constants import HS_TOPK_SEG
from hipsched.gpu.glue import quant
from hipsched.ops import OPS
from hipsched.ops.base import Call, host_arrays


class _Buffer:
    """A device array as the glue reads one: shape, dtype, size, bytes and a 256-byte aligned address."""

    _next = itertools.count(1)

    def __init__(self, shape, dtype, ptr=None):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.ptr = ptr if ptr is not None else 256 * next(self._next)


class _Nothing:
    def memset(self, *args):
        pass

    def memcpy_dtod(self, *args):
        pass


class AllocationCounter:
    """A GpuContext to the glue of one call: launches are taken as planned and not run; `extra()` is the
    device bytes it was asked for beyond the call's inputs and results: uploads beyond their host bytes
    (a packed layout), or whole where the upload is not one of the call's inputs (a converted copy);
    ctx.empty buffers not given back as a result; and each named ctx.scratch buffer at its largest use
    (GpuContext.scratch keeps one buffer per name)."""

    warp_size, multiprocessors, arch = 32, 132, "sm_90"
    rt = _Nothing()

    def __init__(self, call):
        self._inputs = {id(a) for a, _ in host_arrays(call.args)}
        self._uploaded = set()
        self._upload_extra = 0
        self._empties = []
        self._scratch = {}
        self._results = set()

    def blas(self):
        return None

    def check_launches(self, launches):
        return launches

    def planned(self, call, planner):
        return planner(self, call)

    def run(self, launch, args, stream=0):
        pass

    def upload(self, x, stream, immutable=False, pack=None):
        if not isinstance(x, np.ndarray):
            return x   # already on the device
        dev = x if pack is None else pack(x)
        if id(x) not in self._uploaded:
            self._uploaded.add(id(x))
            self._upload_extra += dev.nbytes - (x.nbytes if id(x) in self._inputs else 0)
        return _Buffer(x.shape, x.dtype) if pack is None else _Buffer((dev.nbytes,), np.uint8)

    def empty(self, shape, dtype, stream):
        buf = _Buffer((shape,) if isinstance(shape, int) else shape, dtype)
        self._empties.append(buf)
        return buf

    def scratch(self, name, shape, dtype, stream):
        buf = _Buffer((shape,) if isinstance(shape, int) else shape, dtype)
        self._scratch[name] = max(self._scratch.get(name, 0), buf.nbytes)
        return buf

    def finish(self, out, call, stream):
        self._results.update(id(o) for o in (out if isinstance(out, tuple) else (out,)))
        return out

    def extra(self) -> int:
        unreturned = sum(b.nbytes for b in self._empties if id(b) not in self._results)
        return self._upload_extra + unreturned + sum(self._scratch.values())


def allocated_beyond_io(call) -> int:
    ctx = AllocationCounter(call)
    OPS[call.op].gpu_function()(ctx, call, 0)
    return ctx.extra()


def _host_cases():
    return [p for p in matrix() if p.values[3] == "host"]


@pytest.mark.parametrize("op, dtype, form, where", _host_cases())
def test_declared_scratch_is_what_the_glue_allocates(op, dtype, form, where):
    case = CASES.get(op)
    assert case is not None, f"{op} has a GPU side but no builder in tests/support/op_cases.py"
    args, kwargs = case.make(np.random.default_rng(0), dtype, form)
    call = OPS[op].prepare(*args, **kwargs)
    assert OPS[op].device_scratch(call) == allocated_beyond_io(call)


def _f32(*shape):
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def _graph(n, steps):
    indptr = np.arange(n + 1, dtype=np.int32)
    return (indptr, np.arange(n, dtype=np.int32), np.ones(n, np.float32)), np.ones(n, np.float32)


SHAPES = {
    # the selection's passes: one, two (one pair of partials), three and more (both pairs, the second
    # smaller than the first)
    "top_k-one-pass": ("top_k", lambda: (_f32(2, 8), _f32(HS_TOPK_SEG // 2, 8), 5)),
    "top_k-two-passes": ("top_k", lambda: (_f32(2, 8), _f32(3 * HS_TOPK_SEG, 8), 5)),
    "top_k-three-passes": ("top_k", lambda: (_f32(4), _f32(4 * HS_TOPK_SEG, 4), HS_TOPK_SEG // 2)),
    "top_k-d0": ("top_k", lambda: (_f32(3, 0), _f32(50, 0), 4)),
    "top_k-empty-corpus": ("top_k", lambda: (_f32(3, 8), _f32(0, 8), 4)),
    "top_k-no-queries": ("top_k", lambda: (_f32(0, 8), _f32(50, 8), 4)),
    "cosine-d0": ("cosine_similarity", lambda: (_f32(3, 0), _f32(50, 0))),
    "cosine-empty-corpus": ("cosine_similarity", lambda: (_f32(3, 8), _f32(0, 8))),
    "cosine-many-queries": ("cosine_similarity", lambda: (_f32(40, 8), _f32(50, 8))),
    # k a multiple of neither superblock (padded rows) and of both (none); empty calls upload nothing
    "qmatmul-padded": ("qmatmul", lambda: (quantize(_f32(5, 96), "q4_0"), _f32(96))),
    "qmatmul-whole-superblocks": ("qmatmul", lambda: (quantize(_f32(5, 1024), "q8_0"), _f32(1024, 3))),
    "qmatmul-no-columns": ("qmatmul", lambda: (quantize(_f32(5, 96), "q8_0"), _f32(96, 0))),
    "qmatmul-no-rows": ("qmatmul", lambda: (quantize(_f32(0, 96), "q8_0"), _f32(96))),
    "dequantize-no-rows": ("dequantize", lambda: (quantize(_f32(0, 96), "q8_0"),)),
}
STEPS = {"spread-one-step": 1, "spread-two-steps": 2, "spread-no-steps": 0}


@pytest.mark.parametrize("name", list(SHAPES) + list(STEPS))
def test_declared_scratch_is_exact_where_allocations_change(name):
    if name in STEPS:
        csr, seeds = _graph(30, STEPS[name])
        call = OPS["spread_activation"].prepare(csr, seeds, steps=STEPS[name], decay=0.5, threshold=0.0)
    else:
        op, make = SHAPES[name]
        call = OPS[op].prepare(*make())
    allocated = allocated_beyond_io(call)
    assert OPS[call.op].device_scratch(call) == allocated
    if name in ("top_k-two-passes", "top_k-three-passes", "qmatmul-padded", "spread-two-steps"):
        assert allocated > 0   # the case reaches what it is named for


def test_an_unaligned_device_x_is_copied_and_declared():
    """qmatmul's matrix-vector product copies a device x whose base its loads cannot take: that copy is
    scratch too (a device x is not one of the bytes a host call uploads)."""
    w = quantize(_f32(5, 96), "q8_0")
    for ptr, copied in ((256, False), (260, True)):
        x = _Buffer((96,), np.float32, ptr=ptr)
        call = Call("qmatmul", (w, x), {}, size=5 * 96, nbytes=w.nbytes + 4 * (96 + 5), dtype="q8_0",
                    on_device=True)
        assert OPS["qmatmul"].device_scratch(call) == allocated_beyond_io(call)
        assert (OPS["qmatmul"].device_scratch(call) - quant._layout_padding(w) == x.nbytes) == copied
