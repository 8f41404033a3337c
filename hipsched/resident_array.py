"""ResidentArray: a host array registered to stay on the GPU for the long run, whose only way to change
is `update`, which writes the host array and every device copy of it together.

A leaf (imports nothing of hipsched): the op specs accept a handle wherever they accept a host array
(it converts to its host array through `__array__`), the GPU memory layer keeps the device copies
(`hipsched.gpu.memory.resident_cache.ResidentCache.pin` attaches one per GPU context) and the Executor hands out
handles (`Executor.resident`). Without a GPU a handle is just its host array, so the CPU side runs the
same op on the same bytes either way. `immutable` and `fingerprint` say which host arrays may be kept
(on a device, or as a converted copy: hipsched.ops.converted_copies.converted_once) and when a kept one changed.

Why updates go through the handle: a device copy cannot see a write to host memory. A handle makes
its host array read-only, so `T[i] = v` raises instead of leaving the GPU on the old corpus, and
`update` writes the host entries and copies the same bytes to each device copy before it returns."""
from __future__ import annotations

import math
import mmap
import operator
import sys
import threading

import numpy as np

# id(host array) -> its live handle: registering the same array twice (from two Executors, say) gives
# the one handle, so one update reaches every device copy. Strong references: a handle is explicit and
# lasts until release().
_handles: dict = {}
_registry_lock = threading.Lock()


def handle_of(x):
    """The live ResidentArray of `x` (a handle, or the host array a handle registered), else None."""
    if isinstance(x, ResidentArray):
        return None if x.released else x
    if isinstance(x, np.ndarray):
        h = _handles.get(id(x))
        if h is not None and h._host is x:
            return h
    return None


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


def immutable(arr) -> bool:
    """Whether `arr`'s bytes can be written through nothing hipsched can see: the array and every array
    in its base chain are read-only, and the chain ends at memory that is read-only itself (the array's
    own, bytes, a read-only buffer such as a read-only memory map). A read-only view of a writable
    array is not: its base can still change. What no flag shows (a writable view made before the base
    was frozen, another process rewriting a mapped file) is outside what this can know. Nor is an array
    whose chain holds a registered array: that one is read-only but changes through its handle's
    `update`, which rewrites its own device copies and no copy of a view of it."""
    x = arr
    while isinstance(x, np.ndarray):
        if x.flags.writeable or (x is not arr and handle_of(x) is not None):
            return False
        x = x.base
    while isinstance(x, memoryview):
        if not x.readonly:
            return False
        x = x.obj
    if x is None or isinstance(x, bytes):
        return True
    if isinstance(x, mmap.mmap):
        try:
            with memoryview(x) as view:
                return view.readonly
        except (ValueError, TypeError):   # a closed map
            return False
    return False   # another buffer owner: nothing says it cannot change


def _owns_its_memory(a: np.ndarray) -> bool:
    """Whether `a` is the only way to its bytes that hipsched can know of: it owns them, or it is a view
    (`np.load(f).reshape(n, d)`, say) whose chain of bases ends at an array that owns them and holds
    nothing but the chain itself (CPython reference counts), so that nothing else can write through
    them. Views made of it before it is frozen keep their own write access, which no flag can take
    back: that is documented, not detectable."""
    x = a
    while isinstance(x.base, np.ndarray):
        # one reference from x, one from the temporary that getrefcount is given: anything more holds it
        if sys.getrefcount(x.base) > 2:
            return False
        x = x.base
    return x.base is None


def _changed_bytes(host: np.ndarray, axis: int, changed: np.ndarray) -> list:
    """(byte offset, byte count) of each contiguous run of host's C-contiguous memory that the sorted,
    distinct indices `changed` along `axis` cover: consecutive indices make one run, and each index
    range is one run per position of the axes before `axis` (batch * heads runs for a KV cache's seq
    axis), in address order."""
    breaks = np.flatnonzero(np.diff(changed) != 1) + 1
    los = changed[np.concatenate(([0], breaks))]
    his = changed[np.concatenate((breaks - 1, [changed.size - 1]))] + 1
    shape = host.shape or (1,)
    inner = host.itemsize * math.prod(shape[axis + 1:])   # bytes per step along axis
    stride = inner * shape[axis]                           # bytes per position of the axes before it
    return [(o * stride + lo * inner, (hi - lo) * inner)
            for o in range(math.prod(shape[:axis])) for lo, hi in zip(los.tolist(), his.tolist())]


class ResidentArray:
    """A registered host array (see the module docstring); made by `Executor.resident(array)`.

    The host array is `host` (read-only while registered). Pass the handle, or `host` itself, as an op's
    argument: on the GPU the registered device copy is read (no upload), on the CPU the host array.
    `update(index, values, axis=0)` changes entries along an axis of both. `release()` (or leaving a `with`
    block) drops the device copies and gives the host array its write access back."""

    def __init__(self, host: np.ndarray, restore_writeable: bool):
        self._host = host
        self._restore = restore_writeable
        self._mirrors = []            # device copies: objects with write_bytes(offset_count_runs) and release()
        self._lock = threading.RLock()
        self.released = False
        self.version = 0              # bumped by every update

    # ------------------------------------------------------------------ registration
    @classmethod
    def register(cls, array, copy: bool = False) -> "ResidentArray":
        """The handle of `array`, made on first registration. `array` itself is registered (made
        read-only in place) when it is a C-contiguous aligned NumPy array that owns its memory, or is
        `immutable` already; anything else (a view of a writable buffer, read-only or not, a strided
        view, a list), or any
        array with `copy=True`, is copied once into an array the handle owns, and only that copy (the
        handle's `host`) is resident."""
        existing = handle_of(array)
        if existing is not None and not copy:
            return existing
        if isinstance(array, ResidentArray) and array.released:
            raise ValueError("resident: this ResidentArray was released; register its array again")
        a = array if isinstance(array, np.ndarray) else np.asarray(array)
        in_place = (not copy and a is array and a.flags.c_contiguous and a.flags.aligned
                    and (_owns_its_memory(a) or immutable(a)))
        with _registry_lock:
            if in_place:
                h = _handles.get(id(a))
                if h is not None and h._host is a:
                    return h
                restore = bool(a.flags.writeable)
                a.flags.writeable = False
            else:
                a = np.array(a, order="C", copy=True)
                a.flags.writeable = False
                restore = False
            h = cls(a, restore)
            _handles[id(a)] = h
        return h

    def attach(self, make):
        """A device copy to keep in step (the GPU memory layer's side of a pin): `make()` copies the host
        array and returns the mirror (or None), with updates held off meanwhile, so the copy misses none."""
        with self._lock:
            self._check()
            mirror = make()
            if mirror is not None:   # None: the maker found a copy already made
                self._mirrors.append(mirror)
            return mirror

    def detach(self, mirror) -> None:
        """That device copy went (its GPU context closed, or it was dropped)."""
        with self._lock:
            try:
                self._mirrors.remove(mirror)
            except ValueError:
                pass

    @property
    def mirrors(self) -> tuple:
        with self._lock:
            return tuple(self._mirrors)

    # ------------------------------------------------------------------ the array
    @property
    def host(self) -> np.ndarray:
        self._check()
        return self._host

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)

    def __len__(self):
        return len(self._host)

    def __array__(self, dtype=None, copy=None):
        """The host array itself (no copy), so an op takes the handle where it takes an array; NumPy's
        rules for dtype and copy otherwise."""
        self._check()
        if copy or (dtype is not None and np.dtype(dtype) != self._host.dtype):
            if copy is False:
                raise ValueError("resident: a copy is needed for that dtype")
            return np.array(self._host, dtype=dtype, copy=True)
        return self._host

    def _check(self):
        if self.released:
            raise ValueError("resident: this ResidentArray was released; use its array (or register it again)")

    # ------------------------------------------------------------------ changes
    def update(self, index, values, axis: int = 0) -> None:
        """Set the entries at `index` along `axis` to `values` (`host[index] = values` for axis 0,
        `host[:, index] = values` for axis 1, ...) and the same bytes of every device copy, before
        returning. A KV cache (batch, heads, max_seq, head_dim) takes each step's new position with
        `update(pos, k_new, axis=2)`: its device copy gets the batch * heads rows of head_dim that changed,
        never the whole cache again.

        `index`: an integer or a 1-d sequence of integers along `axis` (negative ones count from the end;
        a repeated index takes its last value, as NumPy's assignment does); `values`: what that
        assignment accepts. Not atomic with respect to ops running at the same time in other threads on
        this array, as with any write to an array; order them as you would those."""
        self._check()
        host = self._host
        try:
            axis = operator.index(axis)
        except TypeError:
            raise TypeError(f"resident.update: axis must be an integer, got {axis!r}") from None
        nd = max(host.ndim, 1)
        if not -nd <= axis < nd:
            raise ValueError(f"resident.update: axis {axis} is out of range for a {host.ndim}-d array")
        axis %= nd
        idx = np.asarray(index)
        scalar = idx.ndim == 0   # host[..., i] = values drops the axis, as NumPy's assignment does
        if idx.ndim > 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"resident.update: index must be an integer or a 1-d sequence of integers, got {index!r}")
        idx = idx.reshape(-1).astype(np.int64, copy=False)
        n = host.shape[axis] if host.ndim else 1
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"resident.update: an index is out of range for {n} entries along axis {axis}")
        idx = np.where(idx < 0, idx + n, idx)
        with self._lock:
            self._check()
            try:
                host.flags.writeable = True
            except ValueError:
                raise ValueError("resident.update: the registered array is read-only at its source (a "
                                 "read-only memory map or buffer); register a copy (copy=True)") from None
            try:
                host[(slice(None),) * axis + (int(idx[0]) if scalar else idx,)] = values
            finally:
                host.flags.writeable = False
            self.version += 1
            if not idx.size or not host.size:
                return
            runs = _changed_bytes(host, axis, np.unique(idx))
            for mirror in list(self._mirrors):
                mirror.write_bytes(runs)

    # ------------------------------------------------------------------ end
    def release(self) -> None:
        """Drop every device copy and give the host array back its write access (if it had it).
        Idempotent; the handle cannot be used afterwards (its array can)."""
        with self._lock:
            if self.released:
                return
            self.released = True
            mirrors, self._mirrors = self._mirrors, []
        for mirror in mirrors:
            mirror.release()
        with _registry_lock:
            if _handles.get(id(self._host)) is self:
                del _handles[id(self._host)]
        if self._restore:
            self._host.flags.writeable = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __repr__(self):
        state = "released" if self.released else f"on {len(self._mirrors)} device(s)"
        return f"ResidentArray(shape={self._host.shape}, dtype={self._host.dtype}, {state})"
