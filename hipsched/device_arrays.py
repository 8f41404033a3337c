"""Which arrays live on a GPU: the DLPack device types and the one `is_device_array` test.

A leaf: it imports nothing of hipsched, so the op specs (ops/validation.py), the GPU layer
(gpu/memory/device_array.py, gpu/memory/dlpack.py) and the executor all ask the same question the same way
without pointing at each other.

"A device array" here means: hand it to a GPU kernel as it is, and copy it to the host before a CPU
kernel reads it. That decides the set:
- kDLCUDA, kDLROCM: device memory; the host cannot read it at all.
- kDLCUDAManaged (cudaMallocManaged): the host could read it, but only once the producer's stream has
  finished writing it. Taking it as a device array routes it through DeviceArray.from_external, whose
  DLPack handshake orders our reads after the producer's pending kernels, and the CPU path copies it
  back with a synchronising copy; read in place by NumPy it could be read half-written.
- kDLCUDAHost, kDLROCMHost (pinned host memory) and kDLCPU are host memory: the CPU reads them in
  place, and a GPU call uploads them like any host array. They are not device arrays.
Objects with __cuda_array_interface__ are device arrays whatever else they offer: the interface only
describes memory a GPU kernel can address."""
from __future__ import annotations

import numpy as np

# DLDeviceType values of dlpack.h (only those hipsched meets).
kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLROCM = 10
kDLROCMHost = 11
kDLCUDAManaged = 13

GPU_DEVICE_TYPES = (kDLCUDA, kDLROCM, kDLCUDAManaged)


def dlpack_stream(stream: int, device_type: int) -> int:
    """The `stream` argument of `__dlpack__(stream=...)` for a consumer reading on `stream` (a handle; 0
    is our null stream, the legacy default stream). The protocol spells CUDA's legacy default stream 1
    (0 is not allowed there) and ROCm's 0; None would tell the producer not to synchronise at all
    (PyTorch then orders nothing, and a tensor written on a side stream could be read half-written)."""
    if stream:
        return stream
    return 0 if device_type in (kDLROCM,) else 1


def dlpack_device(x):
    """`x.__dlpack_device__()` as a tuple, or None when x has none or it fails (a producer that cannot
    say where its data is gets no zero-copy path)."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return None
    try:
        return tuple(dev())
    except Exception:
        return None


def is_device_array(x) -> bool:
    """True for arrays in GPU memory (CuPy, PyTorch on CUDA/ROCm, hipsched's DeviceArray): objects with
    __cuda_array_interface__, or whose DLPack device is one of GPU_DEVICE_TYPES."""
    if isinstance(x, np.ndarray):
        return False  # the common case, without touching any attribute
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return True
    except Exception:  # a property that raises something other than AttributeError: not one we can use
        return False
    dev = dlpack_device(x)
    return dev is not None and bool(dev) and dev[0] in GPU_DEVICE_TYPES


def device_indices(args, out=None) -> set:
    """The device indices of hipsched's device arrays (DeviceArray: `ptr` and `device` = (type, index))
    among `args`, nested tuples and lists too: where a call's device inputs live. Foreign arrays are
    wrapped in DeviceArrays by the op specs before any backend sees them."""
    out = set() if out is None else out
    for a in args:
        if isinstance(a, (tuple, list)):
            device_indices(a, out)
            continue
        device = getattr(a, "device", None)
        if isinstance(device, tuple) and len(device) == 2 and hasattr(a, "ptr"):
            out.add(device[1])
    return out
