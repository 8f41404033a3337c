"""The resident cache: device copies of host arrays reused across calls, kept only for bytes that cannot
change unseen (read-only arrays, and ResidentArray handles whose updates reach the copy), within a
budget (resident_budget); _Pin, a handle's device copy."""
from __future__ import annotations

import collections
import logging
import os
import threading
import weakref

import numpy as np

from ... import resident_array as _resident
from ...resident_array import fingerprint, immutable  # noqa: F401 (fingerprint: also its import path here)
from .device_array import DeviceArray, to_device
from ..bindings.retired_streams import _retired_streams

# Without a configured budget (HybridConfig.resident_bytes, HIPSCHED_RESIDENT_BYTES) the cache may keep
# this share of the device memory that is free when its GPU context is made: on an 80 GB H100 a 768 MB
# corpus then stays, where a fixed 1 GiB default sent it across PCIe on every call (88 ms against 0.54 ms
# resident). The other half is for results, scratch and the other libraries of the process.
DEFAULT_RESIDENT_SHARE = 0.5
# What is kept when the runtime cannot say how much memory is free.
FALLBACK_RESIDENT_BYTES = 1 << 30
# An update of more separate runs of bytes than this copies the span from the first to the last changed
# byte at once: each copy of pageable memory costs about 10 us, the span's bytes usually less.
MAX_ROW_COPIES = 256

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
    __slots__ = ("ref", "stamp", "dev", "kind", "pin", "pack")

    def __init__(self, ref, stamp, dev, kind, pin=None, pack=None):
        self.ref, self.stamp, self.dev, self.kind, self.pin, self.pack = ref, stamp, dev, kind, pin, pack


IMPLICIT, TRUSTED, PINNED = "implicit", "trusted", "pinned"
# is_resident's question: a kept copy in whatever device layout (`get`'s pack) it was made
_ANY_LAYOUT = object()


class _Pin:
    """The device copy of one ResidentArray (hipsched.resident_array) in one cache: the handle calls
    write_bytes after changing host entries, and release when it is released."""

    def __init__(self, cache, handle, dev):
        self.cache, self.handle, self.dev = cache, handle, dev

    def write_bytes(self, runs) -> None:
        """Copy each (byte offset, byte count) run from the (already changed) host array. Returns once the
        copies are done, so every later call, on any stream, reads the new bytes. A failed copy drops
        this device copy (the next GPU use uploads it whole): a half-written copy must never be read."""
        host = self.handle._host
        if len(runs) > MAX_ROW_COPIES:
            runs = [(runs[0][0], runs[-1][0] + runs[-1][1] - runs[0][0])]
        rt = self.cache.runtime
        try:
            _after_readers(rt, self.dev, 0)
            for off, count in runs:
                rt.memcpy_htod(self.dev.ptr + off, host.ctypes.data + off, count, 0)
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
    - pinned entries: ResidentArray handles (hipsched.resident_array), kept until released whatever the
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

    def _lookup(self, host: np.ndarray, dropped: list, registered: bool, pack=None):
        entry = self._entries.get(id(host))
        if entry is None:
            return None
        if entry.pack is not pack and pack is not _ANY_LAYOUT:   # the bytes in another device layout
            if entry.kind != PINNED:
                dropped.append(self._drop(id(host)))
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

    def _view_of_kept(self, host: np.ndarray, dropped: list, pack=None):
        """A device view into a kept copy for a read-only C-contiguous host array whose bytes lie inside a
        kept array's (a row range of a kept corpus or of kept weights: the GPU's part of a call split
        across processors, hipsched/splitting.py), or None. A copy in the raw layout serves any such
        range at its byte offset; one in a `pack`'s layout only a whole-row range of a 2-d array, and only
        when that pack is row-wise (it has `device_row_bytes(host row bytes)`) and is the one asked for.
        The view needs no stamp of its own: read-only, its bytes are those of the kept array, which
        `_lookup` checks as for the array itself. Caller holds the lock."""
        if host.base is None or host.flags.writeable or not host.flags.c_contiguous or not host.nbytes:
            return None
        lo = host.ctypes.data
        hi = lo + host.nbytes
        for entry in list(self._entries.values()):
            kept, layout = entry.ref(), entry.pack
            # a copy in another layout than the one asked for does not hold these bytes where they are
            # (_ANY_LAYOUT: is_resident's question, whatever the layout)
            if kept is None or (layout is not pack and pack is not _ANY_LAYOUT):
                continue
            start = kept.ctypes.data
            if not (start <= lo and hi <= start + kept.nbytes):
                continue
            if layout is not None:
                row = kept.strides[0] if kept.ndim == 2 and host.ndim == 2 else 0
                if not row or not hasattr(layout, "device_row_bytes") or kept.shape[1:] != host.shape[1:] \
                        or (lo - start) % row:
                    return None
                dev_row = layout.device_row_bytes(row)
                offset, shape = (lo - start) // row * dev_row, (host.shape[0] * dev_row,)
            else:
                offset, shape = lo - start, host.shape
            dev = self._lookup(kept, dropped, _resident.handle_of(kept) is not None, layout)
            if dev is None:
                return None
            return DeviceArray(dev.ptr + offset, shape, dev.dtype if layout is not None else host.dtype,
                               self.runtime, owner=dev, stream=dev.stream, device=dev.device)
        return None

    def is_resident(self, host) -> bool:
        """True when `get(host)` would reuse a device copy (no transfer): its own, or a view into a kept
        array that holds its bytes."""
        if not isinstance(host, np.ndarray):
            return False
        registered = _resident.handle_of(host) is not None
        with self._lock:
            dropped = self._purge()
            resident = self._lookup(host, dropped, registered, _ANY_LAYOUT) is not None or (
                not registered and self._view_of_kept(host, dropped, _ANY_LAYOUT) is not None)
        return resident

    def would_keep(self, host: np.ndarray, immutable: bool = False) -> bool:
        """Whether `get(host, immutable=...)` would keep its upload: the rule `get` applies, asked by the
        scheduler before the call (a kept upload is paid once for every later call)."""
        if not isinstance(host, np.ndarray) or not host.flags.c_contiguous:
            return False
        if _resident.handle_of(host) is not None:
            return True
        return host.nbytes <= self.max_bytes - self.pinned_bytes and (immutable or _immutable(host))

    def get(self, host: np.ndarray, stream=0, immutable: bool = False, pack=None) -> DeviceArray:
        """The device copy of `host`: a kept one if there is one for exactly these bytes (or a view into a
        kept array holding them, for a read-only row range of it: see _view_of_kept), else uploaded
        (and kept when `host` is immutable, or `immutable` says its owner guarantees it, and it fits).
        A ResidentArray's host array is pinned on first use here (uploaded once, then kept in step by
        its updates). `pack`, a function of the host array giving the array to upload instead (a
        device layout of the same bytes, e.g. quantized weights repacked for the kernels): the kept
        copy is of pack(host), stamped and invalidated as host's, and served only to gets with the
        same `pack`."""
        handle = _resident.handle_of(host) if pack is None else None
        with self._lock:
            dropped = self._purge()
            dev = self._lookup(host, dropped, handle is not None, pack)
            if dev is not None:
                self._entries.move_to_end(id(host))
                self.hits += 1
            elif handle is None:
                dev = self._view_of_kept(host, dropped, pack)
                if dev is not None:
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
        dev = to_device(host if pack is None else pack(host), self.runtime, stream)
        self._count(dev.nbytes, 0)
        nbytes = dev.nbytes
        if not keep or nbytes > self.max_bytes - self._pinned_bytes:
            return dev
        try:
            ref = weakref.ref(host, self._on_collect(id(host)))
        except TypeError:   # objects without weakref support are never cached
            return dev
        entry = _Entry(ref, stamp, dev, TRUSTED if immutable else IMPLICIT, pack=pack)
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
