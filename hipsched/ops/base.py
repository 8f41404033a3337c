"""What every operation shares: the validated `Call` a backend runs and the registry of op specs
(`OpSpec`, `register`, `OPS`), with the ways a spec cuts a call (`Partition`, `split_rows`). The input
checks each op's `prepare` composes are ops/validation.py's (dtype, shape, memory; validation happens
once, before any scheduling decision, so both backends receive identical, well-formed inputs), other
libraries' host arrays in and out ops/foreign_arrays.py's, and the kept converted copies of immutable
inputs ops/converted_copies.py's."""
from __future__ import annotations

import importlib

import numpy as np

from ..gguf_blocks import QuantizedTensor
from .validation import F32


class Call:
    """One validated invocation. `args` hold float32 C-contiguous host arrays, device arrays (objects
    with __cuda_array_interface__), or op-specific objects (QuantizedTensor, CSR parts); `params` the
    scalars. `size` is the op's work measure (what the cost model buckets by), `nbytes` what it reads
    and writes (what transfers cost), `on_device` whether the inputs already live on a GPU. `dtype` is
    the name the kernels are chosen by, one of the op spec's declared dtypes: the inputs' float type, a
    quant type, or qmatmul's (quant type, x dtype) pair (ops/quant.py); the scheduler's model, the GPU's
    capability check and the telemetry key on it. `judged`: the GPU backend's Judgement of this call
    (backends/interface.py), set by the dispatcher when it asks, and read by the run it decided. `out`:
    the host array the result is written into (an op's out=, validated by its prepare), or None; the CPU
    kernel writes it directly, any other run (GPU, split, pieces) makes its result and the dispatcher
    copies it there (deliver)."""

    __slots__ = ("op", "args", "params", "size", "nbytes", "dtype", "on_device", "judged", "out")

    def __init__(self, op, args, params, size, nbytes, dtype="float32", on_device=False):
        self.op = op
        self.args = args
        self.params = params
        self.size = size
        self.nbytes = nbytes
        self.dtype = dtype
        self.on_device = on_device
        self.judged = None
        self.out = None

    def part(self, args, share: float) -> "Call":
        """The call of one piece of this one, on host data: `args` for `share` of its work and bytes (at
        least 1 of each), the same op, params and dtype (out-of-memory chunks, split parts), its own
        result (the whole's rejoined pieces reach `out` through deliver)."""
        return Call(self.op, args, self.params, max(1, int(self.size * share)), max(1, int(self.nbytes * share)),
                    self.dtype, False)

    def __repr__(self):
        return f"Call({self.op}, size={self.size}, nbytes={self.nbytes}, dtype={self.dtype}, on_device={self.on_device})"



def run_kernel(fn, call):
    """A host kernel `fn(*call.args, **call.params)` run on the call, writing into call.out when out= was
    given (the CPU writes it directly: deliver then has nothing to copy)."""
    if call.out is None:
        return fn(*call.args, **call.params)
    return fn(*call.args, out=call.out, **call.params)


def deliver(call, result):
    """The result as the caller gets it: written into call.out when out= was given (unless the run wrote
    it there already) and call.out returned."""
    out = call.out
    if out is None or result is out:
        return result
    np.copyto(out, result)
    return out


def host_arrays(args, min_bytes: int = 0, out=None) -> list:
    """(array, trusted) for each host NumPy array a call's arguments hold (nested tuples and lists too) of
    at least `min_bytes`: what a GPU run of the call uploads. A QuantizedTensor stands for its block
    bytes, `trusted`: its contract says they never change. The one walker of Call.args for the
    scheduler's upload accounting, the GPU backend's transfer count and the demo's oracle."""
    if out is None:
        out = []
    for a in args:
        if type(a) is np.ndarray or isinstance(a, np.ndarray):
            if a.nbytes >= min_bytes:
                out.append((a, False))
        elif isinstance(a, (tuple, list)):
            host_arrays(a, min_bytes, out)
        elif isinstance(a, QuantizedTensor):
            if a.data.nbytes >= min_bytes:
                out.append((a.data, True))
    return out


def _resolve(path):
    module, name = path
    return getattr(importlib.import_module(module), name)


class OpSpec:
    """Everything the rest of hipsched knows about one op, declared once beside its validation.

    Kernels are named as (module path, function name) and imported only when first asked for: this
    package never imports the GPU layer, which may be absent or broken, and the glue never imports
    this package, so each layer only points down. The GPU side is judged by the launch planner beside
    the glue (`<glue>_plan(ctx, call)`), so what the GPU accepts is decided by the code that launches.
    The device memory the glue allocates beyond inputs and outputs is declared beside the planner too
    (`<glue>_scratch(call, multiprocessors)`, see device_scratch); `split(call)`
    cuts a call into independent pieces for out-of-memory recovery, (pieces, args(lo, hi),
    combine(results)) or None; `partition(call)` cuts it along the rows of its largest operand so that
    several processors can each take a share at once (hipsched.splitting), a Partition or None;
    `sweep(rng)` yields the calibration calls (size, args, kwargs). `cost` is (bytes moved, flops) per
    unit of the op's work measure (Call.size) for float32 data, roughly: the roofline prior's input
    (hipsched/priors.py), which the first measurements replace.
    `hot` names the op's compiled common case (a hipsched.cpu._hot.HotOp instance): validation and the
    CPU kernel for plain float32 arrays, which the dispatcher runs without entering Python; calls it
    declines take `prepare` and `cpu`, with the same results.
    `result(call)` declares what the call returns without running it: (shape, dtype name), or a tuple of
    them for an op returning several arrays (top_k), as torch's meta functions and JAX's abstract
    evaluation do. A batch plans a call whose input is another batch call's result before that result
    exists (hipsched/batch.py): the declared result stands in for it. None: not declared, and such a
    call's dependants are decided when their inputs are ready instead."""

    __slots__ = ("name", "prepare", "cpu", "gpu", "hot", "cpu_dtypes", "gpu_dtypes", "split", "sweep", "partition",
                 "cost", "result")

    def __init__(self, name, prepare, *, cpu, gpu=None, hot=None, cpu_dtypes=F32, gpu_dtypes=F32, split=None,
                 sweep=None, partition=None, cost=None, result=None):
        self.name = name
        self.cost = cost
        self.result = result
        self.prepare = prepare
        self.cpu = cpu
        self.gpu = gpu
        self.hot = hot
        self.cpu_dtypes = tuple(cpu_dtypes)
        self.gpu_dtypes = tuple(gpu_dtypes) if gpu is not None else ()
        self.split = split
        self.sweep = sweep
        self.partition = partition

    def cpu_function(self):
        return _resolve(self.cpu)

    def hot_op(self):
        """The compiled common case, or None (none declared, or its module is not built)."""
        if self.hot is None:
            return None
        try:
            return _resolve(self.hot)
        except (ImportError, AttributeError):
            return None

    def gpu_function(self, suffix=""):
        return _resolve((self.gpu[0], self.gpu[1] + suffix))

    def device_scratch(self, call, multiprocessors: int = 132) -> int:
        """Device bytes a GPU run of `call` allocates beyond its inputs and outputs, as the glue's module
        declares them beside its planner (`<glue>_scratch(call, multiprocessors)`; none declared: none
        allocated). `multiprocessors`: the device's count, which a plan may depend on (attention's
        split-K decode cuts the keys into about two blocks per multiprocessor); an H100's where no device
        is known. Imports the glue's module: only a GPU backend asks."""
        if self.gpu is None:
            return 0
        declared = getattr(importlib.import_module(self.gpu[0]), self.gpu[1] + "_scratch", None)
        return int(declared(call, multiprocessors)) if declared is not None else 0

    def chunks(self, call):
        return self.split(call) if self.split is not None else None


OPS: dict[str, OpSpec] = {}


def register(name, *, cpu, gpu=None, hot=None, cpu_dtypes=F32, gpu_dtypes=F32, split=None, sweep=None,
             partition=None, cost=None, result=None):
    """Decorator for an op's prepare(*args, **kwargs) -> Call: declares the op (see OpSpec)."""
    def deco(fn):
        OPS[name] = OpSpec(name, fn, cpu=cpu, gpu=gpu, hot=hot, cpu_dtypes=cpu_dtypes, gpu_dtypes=gpu_dtypes,
                           split=split, sweep=sweep, partition=partition, cost=cost, result=result)
        return fn
    return deco


def same_as_input(index=0):
    """A result declaration (OpSpec.result): the shape of the call's argument `index` in the call's
    dtype (the elementwise ops, rms_norm, attention's q)."""
    return lambda call: (tuple(int(s) for s in call.args[index].shape), call.dtype)


def stand_in(shape, dtype):
    """A host array of a declared result's shape and dtype (zeros from calloc: pages never touched cost
    no memory), for preparing a call on a result not yet made."""
    if dtype == "bfloat16":
        import ml_dtypes  # deferred: only a bfloat16 result needs it (as everywhere bfloat16 is read)
        dtype = ml_dtypes.bfloat16
    return np.zeros(shape, dtype)


class Partition:
    """A call cut along `rows` rows of its largest operand, for processors that each take a share at
    once: `args(lo, hi)` are the arguments of the part over rows [lo, hi) (views, no copies), a call of
    its own with the same params and dtype; `merge(results, bounds)` makes the whole call's result from
    the parts' results in row order, `bounds` their (lo, hi). Every row is an independent computation
    (the same kernel on fewer rows gives the same values for them), so a merged result is the unsplit
    one wherever each side's kernel agrees with itself. `min_rows`: the fewest rows a part may have."""

    __slots__ = ("rows", "args", "merge", "min_rows")

    def __init__(self, rows, args, merge, min_rows=1):
        self.rows = int(rows)
        self.args = args
        self.merge = merge
        self.min_rows = int(min_rows)


def partition_from_split(chunks):
    """A Partition from an op's `split` (whose pieces are rows of the largest operand and whose results
    are concatenated in order): the same cut, the merge given the bounds it does not need."""
    if chunks is None:
        return None
    rows, args, combine = chunks
    return Partition(rows, args, lambda results, bounds: combine(results))


def rand_f32(rng, *shape):
    """Calibration input: standard normal float32 of this shape."""
    return rng.standard_normal(shape, dtype=np.float32)


def split_rows(call, same_shape_only=False):
    """Chunks along the first axis of args[0]; other arguments of args[0]'s shape are cut alike (with
    `same_shape_only`), the rest passed whole. Results are stacked along axis 0."""
    args = call.args
    x = args[0]
    if not isinstance(x, np.ndarray) or x.ndim < 1 or x.shape[0] < 2:
        return None
    cut = [i == 0 or (same_shape_only and isinstance(a, np.ndarray) and a.shape == x.shape)
           for i, a in enumerate(args)]
    return x.shape[0], (lambda lo, hi: tuple(a[lo:hi] if c else a for a, c in zip(args, cut))), \
        (lambda rs: np.concatenate(rs, axis=0))

