"""The input checks each op's `prepare` composes: floating inputs (host arrays converted or kept in their
half type, device arrays wrapped in place), dtype names and promotion, shapes, scalar parameters, and
whether an input's copy or a result fits in memory. A bad input is a TypeError, ValueError or
MemoryError naming the op and the argument, raised before any backend runs."""
from __future__ import annotations

import os

import numpy as np

from ..dlpack_devices import is_device_array
from ..errors import GpuError
from .converted_copies import converted_once
from .foreign_arrays import _read_host

F32 = ("float32",)


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


def out_array(out, op: str, like, inputs):
    """An op's `out=`: None, or a host NumPy array the result is written into, which must be exactly the
    result's array (the shape and dtype of `like`, the converted input that sets them: no casting),
    writable, C-contiguous and aligned. It may be one of `inputs` ((name, array) pairs) itself (in place:
    every element is read before its own result is written), but not overlap one otherwise (a shifted
    view would read elements already written). A device result stays on its device, so out= takes host
    arrays only."""
    if out is None:
        return None
    if is_device_array(like):
        raise TypeError(f"{op}: out= is for host inputs; with device inputs the result is a new array on their "
                        f"device")
    if type(out) is not np.ndarray:
        raise TypeError(f"{op}: out must be a host NumPy array (a device input's result is a new array on its "
                        f"device), got {type(out).__name__}")
    if out.shape != tuple(like.shape):
        raise shape_mismatch(op, "out", out.shape, "the result", tuple(like.shape), "out must be the result's shape")
    if out.dtype != like.dtype:
        raise TypeError(f"{op}: out has dtype {out.dtype}, the result's is {like.dtype} (out= does not cast)")
    if not (out.flags.c_contiguous and out.flags.aligned):
        raise ValueError(f"{op}: out must be C-contiguous and aligned")
    if not out.flags.writeable:
        raise ValueError(f"{op}: out is read-only")
    for name, a in inputs:
        if isinstance(a, np.ndarray) and np.may_share_memory(out, a):
            # both contiguous: overlapping bounds is sharing memory, and only the same array is in place
            if not (a.ctypes.data == out.ctypes.data and a.shape == out.shape and a.strides == out.strides):
                raise ValueError(f"{op}: out overlaps {name} without being it (in place is out={name})")
    return out


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
