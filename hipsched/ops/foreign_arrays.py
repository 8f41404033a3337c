"""Other libraries' host arrays: read as NumPy arrays without a copy (a torch CPU tensor, bfloat16 too; an
array-API library's array on the CPU, through DLPack), with a failure to read one said as the op's
TypeError; and a call's result given back in its inputs' library."""
from __future__ import annotations

import numpy as np


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
