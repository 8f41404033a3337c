"""What every operation shares: the validated `Call` a backend runs, the registry of op specs, and the
input checks (dtype, shape, memory) each op's `prepare` composes. Validation happens once, here,
before any scheduling decision, so both backends receive identical, well-formed inputs."""
from __future__ import annotations

import collections
import importlib
import os
import threading
import weakref

import numpy as np

from ..device_arrays import is_device_array
from ..errors import GpuError
from ..gguf_blocks import QuantizedTensor
from ..resident import fingerprint, immutable


class Call:
    """One validated invocation. `args` hold float32 C-contiguous host arrays, device arrays (objects
    with __cuda_array_interface__), or op-specific objects (QuantizedTensor, CSR parts); `params` the
    scalars. `size` is the op's work measure (what the cost model buckets by), `nbytes` what it reads
    and writes (what transfers cost), `on_device` whether the inputs already live on a GPU. `dtype` is
    the name the kernels are chosen by, one of the op spec's declared dtypes: the inputs' float type, a
    quant type, or qmatmul's (quant type, x dtype) pair (ops/quant.py); the scheduler's model, the GPU's
    capability check and the telemetry key on it."""

    __slots__ = ("op", "args", "params", "size", "nbytes", "dtype", "on_device")

    def __init__(self, op, args, params, size, nbytes, dtype="float32", on_device=False):
        self.op = op
        self.args = args
        self.params = params
        self.size = size
        self.nbytes = nbytes
        self.dtype = dtype
        self.on_device = on_device

    def part(self, args, share: float) -> "Call":
        """The call of one piece of this one, on host data: `args` for `share` of its work and bytes (at
        least 1 of each), the same op, params and dtype (out-of-memory chunks, split parts)."""
        return Call(self.op, args, self.params, max(1, int(self.size * share)), max(1, int(self.nbytes * share)),
                    self.dtype, False)

    def __repr__(self):
        return f"Call({self.op}, size={self.size}, nbytes={self.nbytes}, dtype={self.dtype}, on_device={self.on_device})"


F32 = ("float32",)


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
    `scratch(call)` is the device memory the glue allocates beyond inputs and outputs; `split(call)`
    cuts a call into independent pieces for out-of-memory recovery, (pieces, args(lo, hi),
    combine(results)) or None; `partition(call)` cuts it along the rows of its largest operand so that
    several processors can each take a share at once (hipsched.splitting), a Partition or None;
    `sweep(rng)` yields the calibration calls (size, args, kwargs). `cost` is (bytes moved, flops) per
    unit of the op's work measure (Call.size) for float32 data, roughly: the roofline prior's input
    (hipsched/priors.py), which the first measurements replace.
    `hot` names the op's compiled common case (a hipsched.cpu._hot.HotOp instance): validation and the
    CPU kernel for plain float32 arrays, which the dispatcher runs without entering Python; calls it
    declines take `prepare` and `cpu`, with the same results."""

    __slots__ = ("name", "prepare", "cpu", "gpu", "hot", "cpu_dtypes", "gpu_dtypes", "scratch", "split", "sweep",
                 "partition", "cost")

    def __init__(self, name, prepare, *, cpu, gpu=None, hot=None, cpu_dtypes=F32, gpu_dtypes=F32, scratch=None,
                 split=None, sweep=None, partition=None, cost=None):
        self.name = name
        self.cost = cost
        self.prepare = prepare
        self.cpu = cpu
        self.gpu = gpu
        self.hot = hot
        self.cpu_dtypes = tuple(cpu_dtypes)
        self.gpu_dtypes = tuple(gpu_dtypes) if gpu is not None else ()
        self.scratch = scratch
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

    def device_scratch(self, call) -> int:
        return int(self.scratch(call)) if self.scratch is not None else 0

    def chunks(self, call):
        return self.split(call) if self.split is not None else None


OPS: dict[str, OpSpec] = {}


def register(name, *, cpu, gpu=None, hot=None, cpu_dtypes=F32, gpu_dtypes=F32, scratch=None, split=None,
             sweep=None, partition=None, cost=None):
    """Decorator for an op's prepare(*args, **kwargs) -> Call: declares the op (see OpSpec)."""
    def deco(fn):
        OPS[name] = OpSpec(name, fn, cpu=cpu, gpu=gpu, hot=hot, cpu_dtypes=cpu_dtypes, gpu_dtypes=gpu_dtypes,
                           scratch=scratch, split=split, sweep=sweep, partition=partition, cost=cost)
        return fn
    return deco


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


# ---------------------------------------------------------------- device arrays

def any_on_device(*arrays) -> bool:
    """True when any validated argument lives on a GPU (host arrays are checked by type alone: this runs
    on every call)."""
    for a in arrays:
        if type(a) is not np.ndarray and is_device_array(a):
            return True
    return False


def as_device_array(x, op, arg, dtypes=F32):
    """Wrap a foreign device array without copying (lazy import: the GPU layer is optional). Its dtype
    must be one of `dtypes` (names, see FLOATS): a device array is never converted behind the caller's
    back."""
    try:
        # deferred: the GPU layer is optional, and the specs load no kernel module at import
        from ..gpu.memory.device_array import DeviceArray
    except ImportError as e:  # pragma: no cover - only when the GPU layer is broken
        raise GpuError("unavailable", f"{op}: argument {arg!r} is a device array but hipsched's GPU layer cannot load: {e}")
    arr = DeviceArray.from_external(x)
    if np.dtype(arr.dtype).name not in dtypes:
        raise TypeError(f"{op}: argument {arg!r} is a device array of dtype {arr.dtype}; {op} takes "
                        f"{', '.join(dtypes)} device arrays (convert on the device first, e.g. x.float())")
    return arr


# ---------------------------------------------------------------- host validation

_CONVERTIBLE_KINDS = "biuf"  # bool, signed, unsigned, float: converted to float32 as NumPy's astype would

# The floating types kernels read as they are, by NumPy dtype name ("bfloat16" is ml_dtypes' dtype,
# recognised by name so that hipsched never needs ml_dtypes itself: whoever holds a bfloat16 array has
# it). Results come back in the inputs' dtype, as PyTorch does; kernels accumulate in float32.
FLOATS = ("float32", "float16", "bfloat16")
HALF = ("float16", "bfloat16")


_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}


def dtype_name(a) -> str:
    """The dtype name of an array (host or device) as the op specs and the scheduler key it. Cached by
    dtype: NumPy builds `dtype.name` in Python (about a microsecond), and validation asks per input."""
    dt = a.dtype
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = np.dtype(dt).name  # a dict: a racing thread writes the same value
    return name


# ---------------------------------------------------------------- other libraries' host arrays

def _is_torch(x) -> bool:
    return type(x).__module__.partition(".")[0] == "torch"


def host_array(x, op: str, arg: str):
    """x as NumPy reads it, without a copy where x is another library's host array: a torch CPU tensor
    (bfloat16 too, which NumPy's DLPack import refuses: its bits are viewed as ml_dtypes' bfloat16), an
    array-API library's array on the CPU (through DLPack). A tensor that requires grad is refused:
    hipsched records no gradients, so autograd would see a result with no history. Anything else goes
    through np.asarray as before."""
    if _is_torch(x) and getattr(x, "device", None) is not None and x.device.type == "cpu":
        if x.requires_grad:
            raise TypeError(f"{op}: argument {arg!r} is a torch tensor that requires grad; hipsched does not record "
                            f"gradients, so autograd could not see through its result: pass {arg}.detach() (the "
                            f"result will not require grad)")
        import torch  # deferred: only a caller who passes a tensor has torch, and it is already loaded
        if x.dtype == torch.bfloat16:
            try:
                import ml_dtypes  # deferred: optional, needed only to hold bfloat16 in NumPy
            except ImportError:
                raise TypeError(f"{op}: argument {arg!r} is a bfloat16 torch tensor; reading it needs ml_dtypes "
                                f"(pip install ml-dtypes)") from None
            return x.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy()
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None and hasattr(x, "__array_namespace__") and not isinstance(x, np.ndarray):
        try:
            on_cpu = dev()[0] == 1   # kDLCPU
        except Exception:
            on_cpu = False
        if on_cpu:
            return np.from_dlpack(x)
    return np.asarray(x)


def _read_host(x, op: str, arg: str):
    """host_array(x), with any failure to read x as an array said as the op's TypeError (host_array's
    own errors, which name the op already, as they are)."""
    try:
        return host_array(x, op, arg)
    except TypeError as e:
        if str(e).startswith(f"{op}: "):
            raise
        raise TypeError(f"{op}: argument {arg!r} cannot be read as an array: {e}") from None
    except Exception as e:
        raise TypeError(f"{op}: argument {arg!r} cannot be read as an array: {e}") from None


def result_converter(args, kwargs):
    """How to give a call's result back in its inputs' library, when its first array of another library
    than NumPy is a host array (a torch CPU tensor: torch tensors out; an array-API library's host array:
    that library's arrays, through its from_dlpack): both ways without a copy. None for NumPy inputs
    (and device arrays, whose results the GPU layer places)."""
    for a in args + tuple(kwargs.values()) if kwargs else args:
        t = type(a)
        if t is np.ndarray or t is float or t is int or t is bool or a is None or isinstance(a, np.ndarray):
            continue
        if _is_torch(a) and getattr(a, "device", None) is not None:
            return _to_torch if a.device.type == "cpu" else None
        dev = getattr(a, "__dlpack_device__", None)
        if dev is not None and hasattr(a, "__array_namespace__"):
            try:
                if dev()[0] != 1:
                    return None
                xp = a.__array_namespace__()
            except Exception:
                return None
            return lambda out: _convert(out, xp.from_dlpack)
    return None


def _to_torch_array(a):
    import torch  # deferred: as in host_array
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _to_torch(out):
    return _convert(out, _to_torch_array)


def _convert(out, fn):
    if isinstance(out, np.ndarray):
        return fn(out)
    if type(out) is tuple:
        return tuple(_convert(o, fn) for o in out)
    return out   # a QuantizedTensor, a scalar: hipsched's own


def as_float(x, op: str, arg: str, dtypes=FLOATS, allow_device: bool = True):
    """Validated floating input in one of `dtypes` (a subset of FLOATS, float32 always in it): a
    C-contiguous aligned native host array, or a device array left in place. A host array whose dtype
    is in `dtypes` keeps it; other real numeric types (float64, integers, bool, and a half type the op
    does not take, which widens exactly) convert to float32 as `np.asarray(x).astype(np.float32)`;
    anything else (complex, object, strings, other extension types) is a TypeError naming the op, the
    argument and the supported dtypes."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned:
        return x  # the common case, checked in a few attribute reads
    if allow_device and is_device_array(x):
        return as_device_array(x, op, arg, dtypes)
    a = _read_host(x, op, arg)
    name = dtype_name(a)
    if not (a.flags.c_contiguous and a.flags.aligned and a.dtype in (np.float32, np.float16)):
        # A copy comes next. A broadcast view can stand for more memory than the machine has, and where
        # Linux overcommits (as on some VMs) the copy would not fail but get the process killed.
        _check_copy_fits(a, op, arg, 2 if (name in HALF and name in dtypes) else 4)
    if name in HALF and name in dtypes:
        if not a.dtype.isnative:  # float16 may come byte-swapped ('>f2'); the kernels read native halves
            a = a.astype(a.dtype.newbyteorder("="))
    elif a.dtype.kind in _CONVERTIBLE_KINDS or name in HALF:
        if a.dtype != np.float32:
            a = converted_once(a, "float32", lambda a: contiguous_aligned(a.astype(np.float32)))
    else:
        raise TypeError(f"{op}: argument {arg!r} has dtype {a.dtype}; {op} takes {', '.join(dtypes)} (other real "
                        f"numeric types are converted to float32)")
    return contiguous_aligned(a)


def contiguous_aligned(a, dtype=None):
    """a as a C-contiguous array whose items are aligned (the kernels' C reads an element by its type),
    converted to `dtype` if given; a that already is one is returned as is. An unaligned buffer is
    common: an array unpickled from inside a larger message (a chunk Dask sent in a task's graph, say)
    starts wherever it fell in that message. np.ascontiguousarray keeps such a buffer as it is, so its
    bytes are copied into a new array (a byte copy: any dtype, NaN payloads untouched)."""
    if dtype is not None and a.dtype != dtype:
        a = a.astype(dtype)
    if a.flags.c_contiguous and a.flags.aligned:
        return a
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
        if a.flags.aligned:
            return a
    out = np.empty(a.shape, a.dtype)
    out.reshape(-1).view(np.uint8)[:] = a.reshape(-1).view(np.uint8)
    return out


# Converted copies of inputs whose bytes cannot change (hipsched.resident.immutable), kept while the input
# lives, within _CONVERTED_MAX_BYTES (least recently used first out). A graph with int64 offsets and int32
# indices, or a float64 corpus, was converted by every call: the copy cost a pass over the data each
# time, and on the GPU, being a new writable array each time, it was never kept resident and every call
# uploaded it (the demo's spread_activation: 64 MB per call, 8 ms of its 14).
_CONVERTED_MAX_BYTES = 1 << 30
_converted = collections.OrderedDict()   # (id(source), key) -> (weakref to source, copy, source's fingerprint)
_converted_bytes = 0
# re-entrant: a source's weakref callback (_forget) can run inside a locked section of the same thread,
# when an allocation there sets off the garbage collector and it frees a source held in a cycle
_converted_lock = threading.RLock()


def _drop_converted(k):
    global _converted_bytes
    e = _converted.pop(k, None)
    if e is not None:
        _converted_bytes -= e[1].nbytes


def converted_once(src, key, convert):
    """convert(src), made once per `src` and `key` (what the conversion does, e.g. a dtype) when src
    cannot change and the copy fits the budget; the copy is read-only. Otherwise convert(src) afresh.
    The source's fingerprint is checked as the resident cache checks it (write access given back,
    bytes rewritten, then taken away again between two calls)."""
    global _converted_bytes
    if not isinstance(src, np.ndarray) or not immutable(src):
        return convert(src)
    k = (id(src), key)
    with _converted_lock:
        e = _converted.get(k)
    stamp = fingerprint(src)
    if e is not None and e[0]() is src and e[2] == stamp:
        with _converted_lock:
            if k in _converted:
                _converted.move_to_end(k)
        return e[1]
    out = convert(src)
    if out is None or out is src or out.nbytes > _CONVERTED_MAX_BYTES:
        return out
    out.flags.writeable = False
    try:
        # the entry goes with its source (an id is reused once its array is gone)
        ref = weakref.ref(src, lambda _, k=k: _forget(k))
    except TypeError:
        return out
    with _converted_lock:
        _drop_converted(k)
        while _converted and _converted_bytes + out.nbytes > _CONVERTED_MAX_BYTES:
            _drop_converted(next(iter(_converted)))
        _converted[k] = (ref, out, stamp)
        _converted_bytes += out.nbytes
    return out


def _forget(k):
    with _converted_lock:
        e = _converted.get(k)
        if e is not None and e[0]() is None:
            _drop_converted(k)


def promote(op: str, **arrays):
    """The common dtype of validated inputs (from as_float) and the inputs converted to it, in the
    order given. Equal dtypes stay; any mix (float16 with float32, bfloat16 with float16, ...) is
    float32, which is NumPy's and PyTorch's promotion for every pair of these three types. Device
    arrays are not converted: a mix that includes one is a TypeError."""
    names = {dtype_name(a) for a in arrays.values()}
    if len(names) <= 1:
        return (names.pop() if names else "float32"), tuple(arrays.values())
    out = []
    for arg, a in arrays.items():
        if dtype_name(a) != "float32":
            if is_device_array(a):
                raise TypeError(f"{op}: device argument {arg!r} is {dtype_name(a)} but the other inputs are "
                                f"{', '.join(sorted(names - {dtype_name(a)}))}; give them one dtype (inputs on a "
                                f"device are not converted)")
            a = a.astype(np.float32)
        out.append(a)
    return "float32", tuple(out)


def as_f32(x, op: str, arg: str, allow_device: bool = True):
    """Validated float32 input: a C-contiguous aligned host array, or a device array left in place.
    Values convertible to float32 by NumPy are converted exactly as `np.asarray(x).astype(np.float32)`;
    anything else (complex, object, strings) is a TypeError naming the op and the argument."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned:
        return x  # the common case, checked in a few attribute reads
    if allow_device and is_device_array(x):
        return as_device_array(x, op, arg)
    a = _read_host(x, op, arg)
    if a.dtype.kind not in _CONVERTIBLE_KINDS:
        raise TypeError(f"{op}: argument {arg!r} has dtype {a.dtype}; expected float32 or a real numeric type "
                        f"convertible to float32")
    if a.dtype != np.float32:
        a = a.astype(np.float32)
    return contiguous_aligned(a)


def check_ndim(x, allowed, op: str, arg: str):
    if x.ndim not in allowed:
        want = " or ".join(f"{n}-d" for n in allowed)
        raise ValueError(f"{op}: argument {arg!r} must be {want}, got shape {tuple(x.shape)}")


def shape_mismatch(op: str, a_name: str, a_shape, b_name: str, b_shape, why: str = "") -> ValueError:
    msg = f"{op}: shapes do not match: {a_name} {tuple(a_shape)} vs {b_name} {tuple(b_shape)}"
    return ValueError(msg + (f" ({why})" if why else ""))


def finite_scalar(value, op: str, name: str, lo=None, hi=None, integer=False):
    """A Python scalar parameter checked for type, finiteness and range."""
    if integer:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{op}: {name} must be an integer, got {value!r}")
        v = int(value)
    else:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{op}: {name} must be a real number, got {value!r}") from None
        if not np.isfinite(v):
            raise ValueError(f"{op}: {name} must be finite, got {value!r}")
    if lo is not None and v < lo:
        raise ValueError(f"{op}: {name} must be >= {lo}, got {value!r}")
    if hi is not None and v > hi:
        raise ValueError(f"{op}: {name} must be <= {hi}, got {value!r}")
    return v


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 62


PHYSICAL_MEMORY = _physical_memory()


def _check_copy_fits(a, op: str, arg: str, itemsize: int) -> None:
    """MemoryError when the copy of input `a` the kernels read (`itemsize` bytes an element) could not be
    held (see check_result_fits)."""
    total = int(a.size) * itemsize
    if total > PHYSICAL_MEMORY:
        raise MemoryError(f"{op}: argument {arg!r} of shape {tuple(a.shape)} needs a contiguous copy of "
                          f"{total / 2**30:.1f} GiB, more than this machine's {PHYSICAL_MEMORY / 2**30:.1f} GiB "
                          f"of memory")


def check_result_fits(op: str, *shape, itemsize: int = 4):
    """MemoryError (never a crash or an OOM kill later) when a result of this shape cannot be held.
    Linux overcommits, so np.empty would succeed and the process die on first touch: check first."""
    total = itemsize
    for s in shape:
        total *= int(s)  # Python ints: no overflow
    if total > PHYSICAL_MEMORY:
        dims = "x".join(str(int(s)) for s in shape)
        raise MemoryError(f"{op}: the result ({dims} x {itemsize} bytes = {total / 2**30:.1f} GiB) would not fit "
                          f"in this machine's {PHYSICAL_MEMORY / 2**30:.1f} GiB of memory")
    return total
