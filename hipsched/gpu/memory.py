"""Device memory: DeviceArray (CUDA Array Interface v3 and DLPack, both ways), host<->device helpers
and the resident cache that keeps device copies of host arrays reused across calls (only of bytes that
cannot change unseen: read-only arrays, and ResidentArray handles whose updates reach the copy)."""
from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import math
import os
import sys
import threading
import weakref

import numpy as np

from .. import resident as _resident
from ..device_arrays import GPU_DEVICE_TYPES, dlpack_device, dlpack_stream, is_device_array
from ..errors import GpuError
from ..resident import immutable
from . import _driver, detect, dlpack
from ._driver import DeviceMemory
from .streams import _retired_streams, as_stream_handle, retire_stream, revive_stream  # noqa: F401 (re-exported)

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
    """How DeviceMemory (gpu/_driver.pyx) frees memory of a runtime without C entry points (an emulator,
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
                        "implicitly: use .get() (or hipsched.gpu.memory.to_host) to copy it to the host")

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


def _array_library(obj):
    """The top-level module of a foreign array's type when it can make its own arrays from DLPack
    (`from_dlpack`: torch, cupy), else None (raw pointers, CAI-only objects)."""
    name = type(obj).__module__.partition(".")[0]
    module = sys.modules.get(name)
    return name if callable(getattr(module, "from_dlpack", None)) else None


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
    if library is None:
        return out
    from_dlpack = sys.modules[library].from_dlpack
    try:
        if isinstance(out, tuple):
            return tuple(from_dlpack(o) for o in out)
        return from_dlpack(out)
    except Exception as e:   # the results are right and on the device: a refusal must not lose them
        if library not in _unconvertible:
            _unconvertible.add(library)
            logging.getLogger("hipsched").warning("hipsched: %s.from_dlpack refused a result (%s: %s); results of "
                                                  "%s arrays come back as DeviceArray", library,
                                                  type(e).__name__, e, library)
        return out


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


# --------------------------------------------------------------------------- the resident cache

# Without a configured budget (HybridConfig.resident_bytes, HIPSCHED_RESIDENT_BYTES) the cache may keep
# this share of the device memory that is free when its GPU context is made: on an 80 GB H100 a 768 MB
# corpus then stays, where a fixed 1 GiB default sent it across PCIe on every call (88 ms against 0.54 ms
# resident). The other half is for results, scratch and the other libraries of the process.
DEFAULT_RESIDENT_SHARE = 0.5
# What is kept when the runtime cannot say how much memory is free.
FALLBACK_RESIDENT_BYTES = 1 << 30
# An update of more separate row runs than this copies the span from the first to the last changed row
# at once: each copy of pageable memory costs about 10 us, the span's bytes usually less.
MAX_ROW_COPIES = 256

_SAMPLES = 256


def fingerprint(arr: np.ndarray) -> tuple:
    """Cheap version stamp of a host array: data pointer, shape, dtype, strides and a hash of up to
    256 evenly spaced elements plus the last one. Only a second line of defence for arrays that are
    read-only by declaration (it sees a bulk rewrite after write access came back, not a single element
    between the samples), never what makes a writable array safe to keep."""
    flat = arr.reshape(-1) if arr.flags.c_contiguous else np.ravel(arr)
    step = max(1, flat.size // _SAMPLES)
    sample = flat[::step][:_SAMPLES].tobytes() + (flat[-1:].tobytes() if flat.size else b"")
    return (arr.ctypes.data, arr.shape, arr.dtype.str, arr.strides, hash(sample))


def resident_budget(runtime, configured: int | None = None) -> tuple[int, str]:
    """(bytes the resident cache may hold, where that figure comes from): `configured`, else
    HIPSCHED_RESIDENT_BYTES, else DEFAULT_RESIDENT_SHARE of the device memory free now."""
    if configured is not None:
        return int(configured), "configured"
    raw = os.environ.get("HIPSCHED_RESIDENT_BYTES", "").strip()
    if raw and raw.lower() not in ("auto", "none"):   # the config's spellings of the default
        try:
            return int(raw), "HIPSCHED_RESIDENT_BYTES"
        except ValueError:   # a bad value must not cost the GPU: the config check reports it too
            logging.getLogger("hipsched").warning("hipsched: HIPSCHED_RESIDENT_BYTES=%r is not a byte count; "
                                                  "using the default resident budget", raw)
    try:
        free = int(runtime.mem_info()[0])
    except Exception:   # a runtime that cannot say (a test double, a driver that fails the query)
        return FALLBACK_RESIDENT_BYTES, "default (free device memory unknown)"
    return int(free * DEFAULT_RESIDENT_SHARE), f"{DEFAULT_RESIDENT_SHARE:.0%} of the device memory free at start"


class _Entry:
    __slots__ = ("ref", "stamp", "dev", "kind", "pin")

    def __init__(self, ref, stamp, dev, kind, pin=None):
        self.ref, self.stamp, self.dev, self.kind, self.pin = ref, stamp, dev, kind, pin


IMPLICIT, TRUSTED, PINNED = "implicit", "trusted", "pinned"


class _Pin:
    """The device copy of one ResidentArray (hipsched.resident) in one cache: the handle calls
    write_rows after changing host rows, and release when it is released."""

    def __init__(self, cache, handle, dev):
        self.cache, self.handle, self.dev = cache, handle, dev

    def write_rows(self, runs) -> None:
        """Copy rows [lo, hi) of each run from the (already changed) host array. Returns once the copies
        are done, so every later call, on any stream, reads the new rows. A failed copy drops this
        device copy (the next GPU use uploads it whole): a half-written copy must never be read."""
        host = self.handle._host
        row = host.strides[0] if host.ndim else host.nbytes
        if len(runs) > MAX_ROW_COPIES:
            runs = [(runs[0][0], runs[-1][1])]
        rt = self.cache.runtime
        try:
            _after_readers(rt, self.dev, 0)
            for lo, hi in runs:
                rt.memcpy_htod(self.dev.ptr + lo * row, host.ctypes.data + lo * row, (hi - lo) * row, 0)
            rt.stream_synchronize(0)
        except Exception as e:
            logging.getLogger("hipsched").warning("hipsched: updating a resident array's device copy failed (%s); "
                                                  "the copy is dropped and uploaded again on next use", e)
            self.release()

    def release(self) -> None:
        self.cache._unpin(self)
        self.handle.detach(self)


def _after_readers(rt, dev, stream) -> None:
    """Order `stream` after the work queued on every other stream that read `dev` (its allocation's
    streams, as record_stream noted them), without blocking the host."""
    alloc = dev._allocation()
    for s in (list(alloc.streams) if alloc is not None else ()):
        if s == stream or s in _retired_streams:
            continue
        event = rt.event_create()
        try:
            rt.event_record(event, s)
            rt.stream_wait_event(stream, event)
        finally:
            rt.event_destroy(event)


class ResidentCache:
    """Device copies of host arrays reused across calls (a search corpus, weights).

    A device copy is only ever served for bytes that cannot have changed unseen:
    - implicit entries: host arrays that are `immutable` (read-only down their base chain), kept LRU by
      bytes within `max_bytes`, dropped when the array dies, gets its write access back, or its
      fingerprint changes;
    - trusted entries (`get(..., immutable=True)`): arrays immutable by their owner's contract (the
      block bytes of a QuantizedTensor), kept the same way;
    - pinned entries: ResidentArray handles (hipsched.resident), kept until released whatever the
      budget (they evict the others), their device copy changed row by row by the handle's update.
    A writable host array that is not a handle is uploaded for the call and never kept: a write to it
    cannot be seen short of reading all of it, which costs as much as the upload."""

    def __init__(self, runtime, max_bytes: int | None = None):
        self.runtime = runtime
        self.max_bytes, self.budget_source = resident_budget(runtime, max_bytes)
        self.max_bytes = int(self.max_bytes)
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._lock = threading.Lock()
        # (key, weakref) of entries whose host array died. The collector runs weakref callbacks on
        # whatever thread allocates, which may be inside `with self._lock` here (fingerprint, nbytes
        # and the entries allocate) and the lock is not reentrant: the callback only queues the key (a
        # deque append needs no lock) and the next operation drops it, as CPython's
        # WeakValueDictionary does with _pending_removals.
        self._pending = collections.deque()
        self._bytes = 0
        self._pinned_bytes = 0
        self.hits = 0
        self.misses = 0
        self._tls = threading.local()   # per thread: [bytes uploaded, bytes reused] (transfer_totals)

    @property
    def bytes(self) -> int:
        """Device bytes held now (pinned ones included)."""
        with self._lock:
            dropped = self._purge()
        del dropped
        return self._bytes

    @property
    def pinned_bytes(self) -> int:
        return self._pinned_bytes

    def transfer_totals(self) -> tuple[int, int]:
        """(bytes uploaded, bytes served from kept copies) by `get` on this thread so far: the difference
        over a call is what that call copied and what it reused."""
        t = getattr(self._tls, "t", None)
        return (t[0], t[1]) if t is not None else (0, 0)

    def _count(self, uploaded: int, reused: int) -> None:
        t = getattr(self._tls, "t", None)
        if t is None:
            t = self._tls.t = [0, 0]
        t[0] += uploaded
        t[1] += reused

    def _purge(self) -> list:
        """Drop the entries the collector queued (under the lock). Returns what was dropped, for the
        caller to let go of after releasing the lock: freeing device memory runs finalizers."""
        dropped = []
        while self._pending:
            key, ref = self._pending.popleft()
            entry = self._entries.get(key)
            if entry is not None and entry.ref is ref:   # not a newer entry under a recycled id()
                dropped.append(self._drop(key))
        return dropped

    def _lookup(self, host: np.ndarray, dropped: list, registered: bool):
        entry = self._entries.get(id(host))
        if entry is None:
            return None
        # a registered array changes through its handle's update, which only pinned copies follow: an
        # implicit copy made before the registration (here, or while another context pinned it) goes
        if entry.ref() is not host or (entry.kind == IMPLICIT and not immutable(host)) or \
                (entry.kind != PINNED and (registered or entry.stamp != fingerprint(host))):
            if entry.kind != PINNED:
                dropped.append(self._drop(id(host)))
            return None
        if entry.kind == PINNED and host.flags.writeable:
            return None   # the handle froze it; write access came back behind its back: upload, never trust
        return entry.dev

    def is_resident(self, host) -> bool:
        """True when `get(host)` would reuse a device copy (no transfer)."""
        if not isinstance(host, np.ndarray):
            return False
        registered = _resident.handle_of(host) is not None
        with self._lock:
            dropped = self._purge()
            resident = self._lookup(host, dropped, registered) is not None
        return resident

    def would_keep(self, host: np.ndarray, immutable: bool = False) -> bool:
        """Whether `get(host, immutable=...)` would keep its upload: the rule `get` applies, asked by the
        scheduler before the call (a kept upload is paid once for every later call)."""
        if not isinstance(host, np.ndarray) or not host.flags.c_contiguous:
            return False
        if _resident.handle_of(host) is not None:
            return True
        return host.nbytes <= self.max_bytes - self.pinned_bytes and (immutable or _immutable(host))

    def get(self, host: np.ndarray, stream=0, immutable: bool = False) -> DeviceArray:
        """The device copy of `host`: a kept one if there is one for exactly these bytes, else uploaded
        (and kept when `host` is immutable, or `immutable` says its owner guarantees it, and it fits).
        A ResidentArray's host array is pinned on first use here (uploaded once, then kept in step by
        its updates)."""
        handle = _resident.handle_of(host)
        with self._lock:
            dropped = self._purge()
            dev = self._lookup(host, dropped, handle is not None)
            if dev is not None:
                self._entries.move_to_end(id(host))
                self.hits += 1
        del dropped
        if dev is not None:
            self._count(0, dev.nbytes)
            return dev
        if handle is not None and not host.flags.writeable:
            try:
                dev = self.pin(handle, stream)
            except ValueError:   # released meanwhile: an ordinary array again
                dev = None
            if dev is not None:
                return dev
        with self._lock:
            self.misses += 1
        keep = host.flags.c_contiguous and (immutable or _immutable(host))
        # stamped before the copy: a change made while it runs must not be taken for what was copied
        stamp = fingerprint(host) if keep else None
        dev = to_device(host, self.runtime, stream)
        self._count(dev.nbytes, 0)
        nbytes = dev.nbytes
        if not keep or nbytes > self.max_bytes - self._pinned_bytes:
            return dev
        try:
            ref = weakref.ref(host, self._on_collect(id(host)))
        except TypeError:   # objects without weakref support are never cached
            return dev
        entry = _Entry(ref, stamp, dev, TRUSTED if immutable else IMPLICIT)
        with self._lock:
            dropped = self._purge()
            old = self._entries.get(id(host))
            if old is not None and old.kind == PINNED:
                return dev
            dropped.append(self._drop(id(host)))
            self._evict_for(nbytes, dropped)
            self._entries[id(host)] = entry
            self._bytes += nbytes
        return dev

    def _evict_for(self, nbytes: int, dropped: list) -> None:
        """Drop least recently used unpinned entries until `nbytes` more fit (under the lock)."""
        for key in list(self._entries):
            if self._bytes + nbytes <= self.max_bytes:
                break
            if self._entries[key].kind != PINNED:
                dropped.append(self._drop(key))

    def _pinned(self, host):
        """The pinned copy of `host` (counted as a hit), or None."""
        with self._lock:
            entry = self._entries.get(id(host))
            if entry is None or entry.kind != PINNED or entry.ref() is not host:
                return None
            self.hits += 1
        self._count(0, entry.dev.nbytes)
        return entry.dev

    def pin(self, handle, stream=0) -> DeviceArray:
        """Keep a device copy of a ResidentArray's host array until it is released (uploaded now, once);
        returns it. Pinned copies stay whatever the budget: the handle is the user's explicit word.
        Raises ValueError if the handle was released."""
        host = handle._host
        dev = self._pinned(host)
        if dev is not None:
            return dev
        made = []

        def make():   # under the handle's lock: no update runs between this copy and its attachment
            dev = self._pinned(host)
            if dev is not None:   # another thread pinned it first
                made.append(dev)
                return None
            dev = to_device(host, self.runtime, stream)
            self._count(dev.nbytes, 0)
            pin = _Pin(self, handle, dev)
            ref = weakref.ref(host, self._on_collect(id(host)))
            with self._lock:
                dropped = self._purge()
                dropped.append(self._drop(id(host)))   # an implicit copy made before it was registered
                self.misses += 1
                self._entries[id(host)] = _Entry(ref, None, dev, PINNED, pin)
                self._bytes += dev.nbytes
                self._pinned_bytes += dev.nbytes
                self._evict_for(0, dropped)
            made.append(dev)
            return pin
        handle.attach(make)
        return made[0]

    def _unpin(self, pin) -> None:
        with self._lock:
            entry = self._entries.get(id(pin.handle._host))
            dropped = self._drop(id(pin.handle._host)) if entry is not None and entry.pin is pin else None
        del dropped

    def _on_collect(self, key):
        pending = self._pending   # not the cache: a callback must not keep it alive

        def callback(ref):
            pending.append((key, ref))
        return callback

    def _drop(self, key):
        """Remove an entry (under the lock) and return it: the caller lets go of it after unlocking."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.dev.nbytes
            if entry.kind == PINNED:
                self._pinned_bytes -= entry.dev.nbytes
        return entry

    def invalidate(self, host) -> None:
        """Drop the implicit or trusted copy of `host` (a pinned one goes with its handle's release)."""
        with self._lock:
            dropped = self._purge()
            entry = self._entries.get(id(host))
            if entry is not None and entry.kind != PINNED:
                dropped.append(self._drop(id(host)))

    def trim(self) -> int:
        """Drop every implicit and trusted copy (pinned ones stay: they are the user's word); returns the
        bytes let go. The GPU backend calls it when the device runs out of memory, before the call is
        retried in pieces: kept copies are a cache, the call's own memory is not."""
        with self._lock:
            dropped = self._purge()
            for key in [k for k, e in self._entries.items() if e.kind != PINNED]:
                dropped.append(self._drop(key))
        freed = sum(e.dev.nbytes for e in dropped if e is not None)
        del dropped
        return freed

    def clear(self) -> None:
        """Drop every copy; handles pinned here forget this cache (their next use elsewhere pins anew)."""
        with self._lock:
            dropped, self._entries = self._entries, collections.OrderedDict()
            self._pending.clear()
            self._bytes = self._pinned_bytes = 0
        for entry in dropped.values():
            if entry.pin is not None:
                entry.pin.handle.detach(entry.pin)
        del dropped

    def summary(self) -> dict:
        """What is held now: budget (and where it comes from), bytes, entries by kind."""
        with self._lock:
            dropped = self._purge()
            kinds = collections.Counter(e.kind for e in self._entries.values())
            out = {"budget_bytes": self.max_bytes, "budget_source": self.budget_source, "bytes": self._bytes,
                   "pinned_bytes": self._pinned_bytes, "entries": {k: kinds.get(k, 0) for k in
                                                                   (IMPLICIT, TRUSTED, PINNED)}}
        del dropped
        return out

    def __len__(self):
        with self._lock:
            dropped = self._purge()
            n = len(self._entries)
        del dropped
        return n


_immutable = immutable   # `get` takes a parameter of that name
