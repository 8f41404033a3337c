"""What every operation shares: the validated `Call` a backend runs, the registry of op specs, and the
input checks (dtype, shape, memory) each op's `prepare` composes. Validation happens once, here,
before any scheduling decision, so both backends receive identical, well-formed inputs."""
from __future__ import annotations

import os
from enum import Enum

import numpy as np

from ..errors import GpuError


class OpType(str, Enum):
    ADD = "add"
    SCALE = "scale"
    SOFTMAX = "softmax"
    COSINE_SIMILARITY = "cosine_similarity"
    TOP_K = "top_k"
    MATMUL = "matmul"
    DEQUANTIZE = "dequantize"
    QMATMUL = "qmatmul"
    ATTENTION = "attention"
    SPREAD_ACTIVATION = "spread_activation"


class Call:
    """One validated invocation. `args` hold float32 C-contiguous host arrays, device arrays (objects
    with __cuda_array_interface__), or op-specific objects (QuantizedTensor, CSR parts); `params` the
    scalars. `size` is the op's work measure (what the cost model buckets by), `nbytes` what it reads
    and writes (what transfers cost), `on_device` whether the inputs already live on a GPU."""

    __slots__ = ("op", "args", "params", "size", "nbytes", "dtype", "on_device")

    def __init__(self, op, args, params, size, nbytes, dtype="float32", on_device=False):
        self.op = op
        self.args = args
        self.params = params
        self.size = size
        self.nbytes = nbytes
        self.dtype = dtype
        self.on_device = on_device

    def __repr__(self):
        return f"Call({self.op}, size={self.size}, nbytes={self.nbytes}, dtype={self.dtype}, on_device={self.on_device})"


class OpSpec:
    __slots__ = ("name", "prepare")

    def __init__(self, name, prepare):
        self.name = name
        self.prepare = prepare


OPS: dict[str, OpSpec] = {}


def register(name):
    """Decorator for an op's prepare(*args, **kwargs) -> Call."""
    def deco(fn):
        OPS[name] = OpSpec(name, fn)
        return fn
    return deco


# ---------------------------------------------------------------- device arrays

_DLPACK_GPU_DEVICES = (2, 10)  # kDLCUDA, kDLROCM


def is_device_array(x) -> bool:
    """True for arrays that live in GPU memory (CuPy, PyTorch on CUDA/ROCm, our DeviceArray)."""
    if isinstance(x, np.ndarray):
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        try:
            return dev()[0] in _DLPACK_GPU_DEVICES
        except Exception:
            return False
    return False


def any_on_device(*arrays) -> bool:
    """True when any validated argument lives on a GPU (host arrays are checked by type alone: this runs
    on every call)."""
    for a in arrays:
        if type(a) is not np.ndarray and is_device_array(a):
            return True
    return False


def as_device_array(x, op, arg):
    """Wrap a foreign device array without copying (lazy import: the GPU layer is optional)."""
    try:
        from ..gpu.memory import DeviceArray
    except ImportError as e:  # pragma: no cover - only when the GPU layer is broken
        raise GpuError("unavailable", f"{op}: argument {arg!r} is a device array but hipsched's GPU layer cannot load: {e}")
    arr = DeviceArray.from_external(x)
    if arr.dtype != np.float32:
        raise TypeError(f"{op}: argument {arg!r} is a device array of dtype {arr.dtype}; hipsched ops take float32 "
                        f"device arrays (convert on the device first, e.g. x.float())")
    return arr


# ---------------------------------------------------------------- host validation

_CONVERTIBLE_KINDS = "biuf"  # bool, signed, unsigned, float: converted to float32 as NumPy's astype would


def as_f32(x, op: str, arg: str, allow_device: bool = True):
    """Validated float32 input: a C-contiguous aligned host array, or a device array left in place.
    Values convertible to float32 by NumPy are converted exactly as `np.asarray(x).astype(np.float32)`;
    anything else (complex, object, strings) is a TypeError naming the op and the argument."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned:
        return x  # the common case, checked in a few attribute reads
    if allow_device and is_device_array(x):
        return as_device_array(x, op, arg)
    try:
        a = np.asarray(x)
    except Exception as e:
        raise TypeError(f"{op}: argument {arg!r} cannot be read as an array: {e}") from None
    if a.dtype.kind not in _CONVERTIBLE_KINDS:
        raise TypeError(f"{op}: argument {arg!r} has dtype {a.dtype}; expected float32 or a real numeric type "
                        f"convertible to float32")
    if a.dtype != np.float32:
        a = a.astype(np.float32)
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = np.ascontiguousarray(a)
        if not a.flags.aligned:  # ascontiguousarray keeps an unaligned contiguous buffer as is
            a = a.copy()
    return a


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
