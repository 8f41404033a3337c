"""DeviceArray, an array in device memory (CUDA Array Interface v3 and DLPack, both ways), the host<->device
copies (to_device, to_host), results handed back as the caller's library's arrays (callers_arrays), and
the stream a call reads foreign arrays on (consumer_stream). The resident cache, which keeps device
copies across calls, is resident_cache.py."""
from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import sys

import numpy as np

from ...device_arrays import GPU_DEVICE_TYPES, dlpack_device, dlpack_stream, is_device_array
from ...errors import GpuError
from ..bindings import _driver, detect
from ..bindings._driver import DeviceMemory
from . import dlpack
from ..bindings.retired_streams import _retired_streams
from .streams import as_stream_handle

# The stream the current call will read foreign arrays on (see consumer_stream); None: not known.
_consumer = contextvars.ContextVar("hipsched_consumer_stream", default=None)


@contextlib.contextmanager
def consumer_stream(stream):
    """Within the block, DeviceArray.from_external takes foreign arrays for reading on `stream` (any
    object as_stream_handle accepts): the Executor sets it for a call given a stream, so a DLPack
    producer orders exactly that stream after its pending writes."""
    token = _consumer.set(as_stream_handle(stream))
    try:
        yield
    finally:
        _consumer.reset(token)


def _runtime_or_default(runtime):
    if runtime is not None:
        return runtime
    rt = detect.get_runtime()
    if rt is None:
        raise GpuError("unavailable", f"no GPU runtime: {detect.unavailable_reason()}", name="no-runtime")
    return rt


def _c_strides(shape, itemsize):
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def _is_c_contiguous(shape, strides_bytes, itemsize) -> bool:
    if strides_bytes is None:
        return True
    expected = _c_strides(shape, itemsize)
    # Strides of length-1 axes are meaningless (producers put anything there).
    return all(n <= 1 or s == e for n, s, e in zip(shape, strides_bytes, expected))


def _release(runtime, ptr, streams):
    """How DeviceMemory (gpu/bindings/_driver.pyx) frees memory of a runtime without C entry points (an emulator,
    a test double): stream-ordered as there, through the runtime's Python methods."""
    if not ptr:
        return
    try:
        free_async = getattr(runtime, "free_async", None)
        if free_async is None:   # a runtime without the interface's stream-ordered free
            runtime.free(ptr)
            return
        live = [s for s in list(streams) if s not in _retired_streams] or [0]
        home = live[0]
        for s in live[1:]:
            event = runtime.event_create()
            try:
                runtime.event_record(event, s)
                runtime.stream_wait_event(home, event)
            finally:
                runtime.event_destroy(event)   # the wait holds what it needs
        free_async(ptr, home)
    except Exception:
        pass


_driver.python_release = _release


class DeviceArray:
    """A C-contiguous (or explicitly strided) array in device memory.

    `owner` keeps whatever backs `ptr` alive: an owned allocation (freed with the last reference), a
    consumed DLPack tensor, or a foreign object such as a CuPy array. `stream` is the stream the data
    was last written on (None: already complete); it is what __cuda_array_interface__ reports.
    `origin` names the library a wrapped foreign array came from when its results can go back to it
    as its own arrays (see callers_arrays), else None."""

    origin = None

    def __init__(self, ptr, shape, dtype, runtime, owner=None, strides=None, stream=None, device=None):
        self.ptr = int(ptr)
        self.shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        self.dtype = np.dtype(dtype)
        self.runtime = runtime
        self.owner = owner
        self.strides = tuple(int(s) for s in strides) if strides is not None else \
            _c_strides(self.shape, self.dtype.itemsize)     # bytes, like NumPy
        self.stream = stream
        if device is None:
            platform = getattr(runtime, "platform", "nvidia")
            device = (dlpack.kDLROCM if platform == "amd" else dlpack.kDLCUDA,
                      runtime.current_device() if runtime is not None else 0)
        self.device = tuple(device)

    # ------------------------------------------------------------------ construction
    @classmethod
    def empty(cls, shape, dtype="float32", runtime=None, stream=None) -> "DeviceArray":
        runtime = _runtime_or_default(runtime)
        shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        alloc = DeviceMemory(runtime, nbytes, stream)
        return cls(alloc.ptr, shape, dtype, runtime, owner=alloc, stream=stream)

    @classmethod
    def from_external(cls, obj, runtime=None, stream=None) -> "DeviceArray":
        """Zero-copy view of a GPU array from another library (DLPack or CAI v2/v3); keeps `obj` alive.
        Raises GpuError("unsupported") for host arrays and non-contiguous layouts.

        `stream` is the stream that will read the array (None: the one consumer_stream set, else the
        legacy default stream). DLPack comes first where the object offers it on a GPU, because its
        handshake, `__dlpack__(stream=...)`, is where the producer orders the reading stream after its
        own pending writes; __cuda_array_interface__ only names the producer's stream in version 3, and
        PyTorch exports version 2, without one, so nothing would order our reads after its kernels."""
        if isinstance(obj, DeviceArray):
            return obj
        if stream is None:
            stream = _consumer.get()
        dev = _dlpack_device(obj)
        if dev is not None and dev[0] in GPU_DEVICE_TYPES:
            arr = cls._from_dlpack(obj, runtime, stream, dev[0])
        else:
            cai = getattr(obj, "__cuda_array_interface__", None)
            if cai is None:
                if dev is not None:
                    raise GpuError("unsupported", f"DLPack object lives on device type {dev[0]}, not a GPU "
                                                  f"(use a host array instead)")
                raise GpuError("unsupported", f"{type(obj).__name__} exposes neither __cuda_array_interface__ "
                                              f"nor DLPack on a GPU")
            arr = cls._from_cai(obj, cai, runtime)
        arr.origin = _array_library(obj)
        return arr

    @classmethod
    def _from_dlpack(cls, obj, runtime, stream, device_type):
        # The stream is passed as the protocol spells it (dlpack_stream: our null stream, the legacy
        # default stream, is CUDA's 1 and ROCm's 0), else the handle.
        reader = None if stream is None else int(stream)
        try:
            capsule = obj.__dlpack__(stream=dlpack_stream(reader or 0, device_type))
        except TypeError:   # a producer that predates the stream argument orders the legacy stream
            capsule, reader = obj.__dlpack__(), None
        tensor = dlpack.ConsumedTensor(capsule)
        # The data is ready for `reader` (without one, for the legacy default stream, the null stream
        # 0): other streams must be ordered after it, which is what `stream` tells GpuContext.upload.
        return cls._checked(tensor.ptr, tensor.shape, tensor.dtype,
                            None if tensor.strides is None else
                            tuple(s * tensor.dtype.itemsize for s in tensor.strides),
                            runtime, owner=(tensor, obj), stream=reader or 0, device=tensor.device)

    @classmethod
    def _from_cai(cls, obj, cai, runtime):
        if cai.get("version", 0) < 2:
            raise GpuError("unsupported", "__cuda_array_interface__ version < 2 is not supported")
        if cai.get("mask") is not None:
            raise GpuError("unsupported", "masked __cuda_array_interface__ arrays are not supported")
        dtype = np.dtype(cai["typestr"])
        if dtype.kind == "V":
            # bfloat16 has no typestr of its own (a producer could only say '<V2', which is any 2 bytes):
            # the element type cannot be known, so it is not guessed
            raise GpuError("unsupported", f"__cuda_array_interface__ typestr {cai['typestr']!r} names no element "
                                          f"type; pass bfloat16 device arrays through DLPack")
        ptr = cai["data"][0] or 0
        # CAI's stream 1 is CUDA's legacy default stream, which is the null stream (0) of the driver
        # API; on HIP 1 is no stream handle at all (2, the per-thread stream, is valid on both).
        stream = cai.get("stream")
        if stream == 1:
            stream = 0
        # CAI carries no device id: _checked asks the driver which device the pointer belongs to.
        return cls._checked(ptr, tuple(cai["shape"]), dtype, cai.get("strides"), runtime, owner=obj,
                            stream=stream, device=None)

    @classmethod
    def _checked(cls, ptr, shape, dtype, strides_bytes, runtime, owner, stream, device):
        if not _is_c_contiguous(shape, strides_bytes, dtype.itemsize):
            raise GpuError("unsupported", f"non-contiguous device array (shape {tuple(shape)}, strides "
                                          f"{tuple(strides_bytes)} bytes): make it contiguous first")
        if runtime is None:
            runtime = detect.get_runtime()
        runtime, device = _on_own_device(runtime, ptr, device)
        return cls(ptr, shape, dtype, runtime, owner=owner, stream=stream, device=device)

    # ------------------------------------------------------------------ properties
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_c_contiguous(self) -> bool:
        return _is_c_contiguous(self.shape, self.strides, self.itemsize)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self):
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x}, "
                f"device={self.device})")

    def record_stream(self, stream) -> None:
        """Work on `stream` uses this memory (as torch.Tensor.record_stream): when hipsched's allocation
        behind it is freed, the free is ordered after the work queued on `stream` by then too. Memory
        hipsched does not own (a foreign array) is the owner's to keep alive."""
        alloc = self._allocation()
        if alloc is not None:
            alloc.used_on(stream)

    def _allocation(self):
        """hipsched's allocation behind this array (through views), or None for foreign memory."""
        owner = self.owner
        while isinstance(owner, DeviceArray):
            owner = owner.owner
        return owner if isinstance(owner, DeviceMemory) else None

    @property
    def owns_memory(self) -> bool:
        """True when hipsched allocated the memory (so frees it, in stream order); False for foreign
        memory, which its owner frees whenever the last reference to it goes."""
        return self._allocation() is not None

    def reshape(self, *shape) -> "DeviceArray":
        """A view with another shape (same element count, contiguous only)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if -1 in shape:
            known = math.prod([n for n in shape if n != -1])
            shape = tuple(self.size // max(known, 1) if n == -1 else n for n in shape)
        if math.prod(shape) != self.size or not self.is_c_contiguous:
            raise GpuError("unsupported", f"cannot reshape {self.shape} to {shape}")
        return DeviceArray(self.ptr, shape, self.dtype, self.runtime, owner=self, stream=self.stream,
                           device=self.device)

    # ------------------------------------------------------------------ interop
    @property
    def __cuda_array_interface__(self) -> dict:
        if self.dtype.kind == "V":
            # no CAI typestr means bfloat16 (ml_dtypes' dtype.str is '<V2', opaque bytes): such an array
            # has no CAI at all, so hasattr() is False and consumers (PyTorch, CuPy) take DLPack instead
            raise AttributeError(f"a {self.dtype} DeviceArray has no __cuda_array_interface__ (the interface has "
                                 f"no bfloat16 typestr); use DLPack (__dlpack__)")
        # CAI v3: "stream" is the stream consumers must wait on before reading; None means the data
        # is already complete. The null stream (0) is not allowed by the spec, so it maps to 1
        # (the legacy default stream).
        stream = self.stream
        if stream == 0:
            stream = 1
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None if self.is_c_contiguous else self.strides, "stream": stream}

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("DeviceArray.__dlpack__ does not copy")
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"DeviceArray lives on {self.device}, cannot export to {tuple(dl_device)}")
        # Make the data complete for a consumer on another stream: its stream waits for ours (an event,
        # so neither the host nor other streams wait), as the DLPack protocol asks of a producer.
        # The consumer's None (and CUDA's 1) is the legacy default stream, i.e. our null stream 0;
        # work queued on the null stream is not ordered before a non-blocking consumer stream.
        consumer = 0 if stream in (None, 1) else stream
        if (self.stream is not None and stream != -1 and int(self.stream) != consumer
                and self.runtime is not None):
            _order_after(self.runtime, int(self.stream), int(consumer))
        if stream != -1:
            # the consumer's kernels read this memory on its stream, queued after the capsule goes and
            # maybe after its last reference: the free must be ordered after them too (a torch side
            # stream's queued read of a freed result would see the next allocation's data)
            self.record_stream(consumer)
        strides = None if self.is_c_contiguous else tuple(s // self.itemsize for s in self.strides)
        return dlpack.make_capsule(self.ptr, self.shape, strides, self.dtype, self.device, owner=self)

    def __array__(self, dtype=None, copy=None):
        # As CuPy does: np.asarray would otherwise make a 0-d object array of this one, silently; a
        # copy to the host is a device synchronisation, so it is asked for by name
        raise TypeError("a DeviceArray lives in device memory and is not converted to a NumPy array "
                        "implicitly: use .get() (or hipsched.gpu.memory.device_array.to_host) to copy it to the host")

    # ------------------------------------------------------------------ copies
    def get(self, stream=None) -> np.ndarray:
        """Copy to a new host NumPy array (synchronous)."""
        if not self.is_c_contiguous:
            raise GpuError("unsupported", "cannot copy a non-contiguous DeviceArray to the host")
        runtime = _runtime_or_default(self.runtime)
        out = np.empty(self.shape, dtype=self.dtype)
        if out.nbytes:
            s = _stream_int(stream if stream is not None else self.stream)
            runtime.memcpy_dtoh(out.ctypes.data, self.ptr, out.nbytes, s)
            runtime.stream_synchronize(s)
        return out

    def wait(self, stream=None) -> None:
        """Wait (the host) for the work queued on the stream a copy to the host (get) would run on."""
        _runtime_or_default(self.runtime).stream_synchronize(_stream_int(stream if stream is not None else self.stream))

    def set(self, host: np.ndarray, stream=None) -> None:
        """Overwrite with the contents of a host array of the same shape and dtype (synchronous)."""
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.shape != self.shape:
            raise GpuError("unsupported", f"shape {host.shape} does not match DeviceArray {self.shape}")
        runtime = _runtime_or_default(self.runtime)
        s = _stream_int(stream if stream is not None else self.stream)
        if host.nbytes:
            runtime.memcpy_htod(self.ptr, host.ctypes.data, host.nbytes, s)
            runtime.stream_synchronize(s)


def _order_after(runtime, producer: int, consumer: int) -> None:
    """Order `consumer` after the work queued on `producer` so far, without blocking the host; where no
    event can be recorded, wait for `producer` instead."""
    try:
        event = runtime.event_create()
    except GpuError:
        runtime.stream_synchronize(producer)
        return
    try:
        runtime.event_record(event, producer)
        runtime.stream_wait_event(consumer, event)
    except GpuError:
        runtime.stream_synchronize(producer)
    finally:
        runtime.event_destroy(event)   # released once the wait has been satisfied


_libraries: dict = {}   # array type -> the library its results go back to, or None (see library_of_type)


def library_of_type(t):
    """The top-level module of a foreign array type when it can make its own arrays from DLPack
    (`from_dlpack`: torch, cupy), else None (raw pointers, CAI-only objects). The one lookup, for the
    glue's results (callers_arrays) and the compiled call path's (gpu/launch/_callpath.pyx): cached per
    type."""
    lib = _libraries.get(t, False)
    if lib is False:
        name = t.__module__.partition(".")[0]
        module = sys.modules.get(name)
        lib = _libraries[t] = name if callable(getattr(module, "from_dlpack", None)) else None
    return lib


def _array_library(obj):
    return library_of_type(type(obj))


def to_library(library, out):
    """Device results (a DeviceArray or a tuple of them) as arrays of `library`, zero copy through its
    `from_dlpack`, which passes its current stream to DeviceArray.__dlpack__ (ordering that stream after
    the call's work). A refusal keeps them as DeviceArray (the results are right and on the device: they
    must not be lost) and is warned about once per library."""
    from_dlpack = sys.modules[library].from_dlpack
    try:
        if isinstance(out, tuple):
            return tuple(from_dlpack(o) for o in out)
        return from_dlpack(out)
    except Exception as e:
        if library not in _unconvertible:
            _unconvertible.add(library)
            logging.getLogger("hipsched").warning("hipsched: %s.from_dlpack refused a result (%s: %s); results of "
                                                  "%s arrays come back as DeviceArray", library,
                                                  type(e).__name__, e, library)
        return out


def _first_device_array(args):
    for a in args:
        if isinstance(a, DeviceArray):
            return a
        if isinstance(a, (tuple, list)):
            found = _first_device_array(a)
            if found is not None:
                return found
    return None


def callers_arrays(out, args):
    """Results of a call on device data as arrays of the library its first device input came from (a
    torch tensor gives torch tensors, a CuPy array CuPy arrays), zero copy through that library's
    `from_dlpack`; DeviceArray results of DeviceArray or raw-pointer inputs stay as they are. A tuple
    (top_k's indices and scores) is converted item by item. The library's from_dlpack passes its
    current stream to DeviceArray.__dlpack__, which orders that stream after the call's work."""
    first = _first_device_array(args)
    library = first.origin if first is not None else None
    return out if library is None else to_library(library, out)


_unconvertible: set = set()   # libraries whose from_dlpack refused a result (warned once each)


def _on_own_device(runtime, ptr, device):
    """(runtime bound to the array's device, DLPack device) for a foreign array: DLPack states its device
    id, a CAI pointer's is asked of the driver (None when it cannot say: the runtime's device). Copies
    of the array then run in its own device's context, and a GPU backend of another device can tell
    that the array is not its own (GpuBackend refuses it, naming both)."""
    if runtime is None:
        return runtime, device
    index = device[1] if device is not None else getattr(runtime, "pointer_device", lambda p: None)(ptr)
    if index is None or index == runtime.current_device():
        return runtime, device
    try:
        runtime = runtime.for_device(index)
    except (GpuError, AttributeError):
        pass   # a device this runtime cannot bind: the id is still recorded, so the backend refuses it
    if device is None:
        device = (dlpack.kDLROCM if getattr(runtime, "platform", "nvidia") == "amd" else dlpack.kDLCUDA, index)
    return runtime, device


def _dlpack_device(obj):
    """The DLPack device of an object that can also export (`__dlpack__`), else None."""
    return dlpack_device(obj) if hasattr(obj, "__dlpack__") else None


def _stream_int(stream) -> int:
    return as_stream_handle(stream)


def to_device(np_array, runtime=None, stream=0, dtype=None) -> DeviceArray:
    """Copy a host array to a new device array (made C-contiguous first); returns when the copy is
    done, so the host array may change afterwards."""
    runtime = _runtime_or_default(runtime)
    host = np.ascontiguousarray(np_array, dtype=dtype)
    s = _stream_int(stream)
    alloc = DeviceMemory(runtime, host.nbytes, s)   # complete when returned (stream None), made on s
    out = DeviceArray(alloc.ptr, host.shape, host.dtype, runtime, owner=alloc)
    if host.nbytes:
        runtime.memcpy_htod(out.ptr, host.ctypes.data, host.nbytes, s)
        runtime.stream_synchronize(s)
    return out


def to_host(x) -> np.ndarray:
    """NumPy view/copy of anything: host arrays pass through, device arrays are copied back."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, DeviceArray):
        return x.get()
    if is_device_array(x):
        return DeviceArray.from_external(x).get()
    return np.asarray(x)
