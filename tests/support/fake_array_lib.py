"""A stand-in for a device-array library (PyTorch, CuPy) on machines without CUDA: PyTorch here is a
CPU build and refuses CUDA DLPack capsules. Its arrays live in the kernel emulator's device memory,
export DLPack only (as torch tensors do) and are made from other libraries' arrays by `from_dlpack`,
which, as torch's and CuPy's do, passes the stream its consumer reads on (`current_stream`: the
protocol's 1 for the legacy default stream) to the producer's __dlpack__ and consumes the capsule
without copying. `install()` registers it as the top-level module `fakearraylib`, the name hipsched
finds a foreign array's library by; every from_dlpack call is kept in `calls`."""
from __future__ import annotations

import sys
import types

import numpy as np

from hipsched.gpu.memory import dlpack
from hipsched.gpu.memory._dlpack_import import consume
from hipsched.gpu.memory.device_array import DeviceArray, to_device

NAME = "fakearraylib"


class Tensor:
    """An array of the fake library: device memory it keeps alive through `keep` (the DeviceArray it was
    made from, or a consumed DLPack tensor)."""

    def __init__(self, ptr, shape, dtype, device, keep, runtime):
        self.ptr, self.shape, self.dtype, self.device = int(ptr), tuple(shape), np.dtype(dtype), tuple(device)
        self._keep, self._runtime = keep, runtime

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return dlpack.make_capsule(self.ptr, self.shape, None, self.dtype, self.device, owner=self)

    def numpy(self) -> np.ndarray:
        """A host copy (as tensor.cpu().numpy()): waits for the work queued on the legacy default stream."""
        return DeviceArray(self.ptr, self.shape, self.dtype, self._runtime, owner=self, stream=0).get()


Tensor.__module__ = NAME


class _Library(types.ModuleType):
    def __init__(self, runtime):
        super().__init__(NAME)
        self.Tensor = Tensor
        self.runtime = runtime
        self.current_stream = 0   # the stream this library's next kernels (and from_dlpack's reads) run on
        self.calls = []           # (object converted, the stream passed to its __dlpack__)

    def from_dlpack(self, x):
        stream = 1 if self.current_stream == 0 else self.current_stream
        capsule = x.__dlpack__(stream=stream)
        t = consume(capsule, x)
        self.calls.append((x, stream))
        return Tensor(t.ptr, t.shape, t.dtype, t.device, t, self.runtime)

    def tensor(self, host: np.ndarray) -> Tensor:
        dev = to_device(host, runtime=self.runtime)
        return Tensor(dev.ptr, dev.shape, dev.dtype, dev.device, dev, self.runtime)


def install(runtime) -> _Library:
    """Register the fake library (its device memory on `runtime`) as `fakearraylib`; uninstall() removes it."""
    lib = _Library(runtime)
    sys.modules[NAME] = lib
    return lib


def uninstall() -> None:
    sys.modules.pop(NAME, None)
