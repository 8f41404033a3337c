# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled GPU call path: what a GPU call on device data does after its first time, in C. One
concept over 500 lines: the GPU call engine (GpuPath), the one owner of carrying out a call beyond its
kernels (arguments, lifetimes, timing, free memory, replay) for the glue's runs and replayed ones.

A call's first GPU run with given arguments goes through the op's Python launch glue
(hipsched/gpu/glue/<family>.py) with a `PlanRecorder` (gpu/launch/recording.py) in place of the GpuContext: the glue
runs as always and the recorder writes down its kernels, grids, parameters, outputs and scratch as a
`Plan`. A later call whose arguments have the same key (op; each device array's type, shape, dtype,
strides and 16-byte alignment; each scalar's type and value; which inputs overlap) is one the glue
would plan the same way, so the dispatcher (hipsched/_dispatch.pyx) replays the plan here: the
arguments are read in C (a hipsched DeviceArray's attributes, or a DLPack capsule's DLTensor through
gpu/memory/_dlpack_import.pyx, the stream handshake done once), outputs and scratch come from the device's stream-ordered pool, and the
launches go straight to the driver through `Driver`'s function pointers. No Python function runs
between the Executor's method and the driver.

Lifetimes without per-call Python work: hipsched's own inputs are marked as used on the call's stream
(their frees are ordered after it); foreign ones (a consumed DLPack tensor, a DeviceArray over foreign
memory) are held with a pooled event until their work has run, and let go in batches by later calls."""
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cimport numpy as cnp

import collections
import sys
import threading

import numpy as np

from hipsched.gpu.bindings._driver cimport Driver, DeviceMemory, adopt, NOT_READY
from hipsched.gpu.memory._dlpack_import cimport DLPackHold, take
from ...dlpack_devices import GPU_DEVICE_TYPES, dlpack_stream, kDLCUDA, kDLROCM
from ...errors import GpuError
from ..bindings.retired_streams import _retired_streams

cnp.import_array()

# Calls whose foreign inputs are held before the oldest is waited for: a caller that never
# synchronises must not make the list grow without bound.
cdef int MAX_HELD = 256
# Timed glue runs whose marks have not been read yet. Past this many the device is far behind the host:
# later runs go untimed rather than holding more events, until readings are taken.
MAX_PENDING_TIMINGS = 64
# Free device memory is re-read at most every 10 ms.
cdef long long FREE_TTL_NS = 10000000

cdef object _NONE_PART = ("none",)
# gpu/memory/device_array.py's DeviceArray, bound when the first GpuPath is made: importing this module
# (the dispatcher cimports it) loads no more of the GPU layer than the driver table
DeviceArray = library_of_type = to_library = None
cdef object _new = object.__new__


cdef inline long long _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1000000000LL + ts.tv_nsec


cdef void _device_inputs(args, list found):
    """The device arrays among a call's arguments (nested tuples and lists too): what may need holding."""
    for a in args:
        if isinstance(a, (tuple, list)):
            _device_inputs(a, found)
        elif not isinstance(a, np.ndarray) and hasattr(a, "ptr"):
            found.append(a)


cdef class Pinned:
    """Page-locked host memory, freed with this object. `busy`: an event recorded after the last copy
    out of it that the call did not wait for (a call whose results stay on the device returns with its
    upload queued), waited for before the memory is written again."""
    cdef void *ptr
    cdef size_t nbytes
    cdef Driver drv
    cdef void *busy

    cdef int settle(self) noexcept:
        """Wait until no queued copy reads this memory."""
        cdef int status = 0
        if self.busy != NULL:
            status = self.drv.event_sync(self.busy)
            self.drv.spare(self.busy)
            self.busy = NULL
        return status

    def __dealloc__(self):
        if self.ptr != NULL and self.drv is not None and self.drv.usable():
            if self.drv.current() == 0:
                self.settle()
            self.drv.host_free(self.ptr)
        self.ptr = NULL


cdef class Plan:
    """One glue run's launches, replayable for calls with the same key. Built by `Plan.build` from a
    PlanRecorder's record."""

    @staticmethod
    def build(inputs, outputs, scratch, launches, results, bint single, bint to_host):
        """inputs: [(bytes, is a host array)] in the key's order; outputs: [nbytes]; scratch: [nbytes] of
        distinct buffers; launches: [(function handle, grid, block, shared, params)], each parameter
        ('value', 8 bytes) or ('ptr', kind, index, delta) with kind 0 input, 1 output, 2 scratch;
        results: [(output, delta, shape, dtype, strides)]; to_host: results are copied to host arrays.
        None when it does not fit the plan's fixed limits (the glue then serves those calls)."""
        cdef Plan p = Plan.__new__(Plan)
        cdef int i, k
        cdef size_t off = 0, nbytes
        offsets = []
        if len(outputs) > MAX_OUTPUTS or len(launches) > MAX_LAUNCHES or len(inputs) > MAX_INPUTS:
            return None
        p.nin, p.nout = len(inputs), len(outputs)
        p.nhost = 0
        for i, (nbytes, host) in enumerate(inputs):   # staged one after the other, 256-byte aligned
            p.in_off[i] = off
            if host:
                p.nhost += 1
                off += (nbytes + 255) & ~(<size_t>255)
        p.staged_in = off
        off = 0
        for i in range(p.nout):
            p.out_bytes[i] = outputs[i]
        for nbytes in scratch:   # one block, each buffer 256-byte aligned as the allocator's are
            offsets.append(off)
            off += (<size_t>nbytes + 255) & ~(<size_t>255)
        p.scratch_bytes = off
        p.device_bytes = sum(outputs) + off
        p.nslots = p.npatch = 0
        p.nlaunch = len(launches)
        for i, (fn, grid, block, shared, params) in enumerate(launches):
            if p.nslots + len(params) > MAX_SLOTS:
                return None
            p.launches[i].fn = <void *><uintptr_t>fn
            for k in range(3):
                p.launches[i].grid[k] = grid[k]
                p.launches[i].block[k] = block[k]
            p.launches[i].shared = shared
            p.launches[i].first = p.nslots
            p.launches[i].count = len(params)
            for param in params:
                if param[0] == "value":
                    p.slots[p.nslots] = int.from_bytes(param[1], "little")
                else:
                    p.slots[p.nslots] = 0
                    p.patches[p.npatch].slot = p.nslots
                    p.patches[p.npatch].kind = param[1]
                    p.patches[p.npatch].index = param[2]
                    p.patches[p.npatch].delta = param[3] + (offsets[param[2]] if param[1] == 2 else 0)
                    p.npatch += 1
                p.nslots += 1
        p.to_host = to_host
        p.staged_out = 0
        rs = []
        for r in results:
            nbytes = r[3].itemsize
            for n in r[2]:
                nbytes *= n
            rs.append(tuple(r) + (p.staged_out, nbytes))
            p.staged_out += (nbytes + 255) & ~(<size_t>255)
        p.results = tuple(rs)
        p.single = single
        if (p.nhost or to_host) and p.staged_in + p.staged_out > 16 * STAGE_MAX:
            return None
        return p


cdef class GpuPath:
    """The GPU call engine of one device, the one owner of what carrying out a call needs beyond its
    kernels: it reads a call's arguments and replays plans (through C entry points only), holds foreign
    inputs while their work runs, orders a stream after an input's producer, times runs with events,
    and keeps the device's free memory (re-read at most every 10 ms). Every GpuContext makes one; the
    glue's runs (gpu/launch/context.py) use its holding, timing and memory reading, so both ways of
    running a call follow one set of rules."""

    def __init__(self, Driver drv, runtime, int device_index, str platform):
        """`drv`: the runtime's Driver (`_driver.driver_for`), or None where it has no C entry points."""
        global DeviceArray, library_of_type, to_library
        # deferred: see the module-level binding
        from ..memory.device_array import DeviceArray, library_of_type, to_library
        self.drv = drv
        self.runtime = runtime
        # plans are replayed only through C entry points; without them (the kernel emulator) the engine
        # still holds inputs, times runs and reads free memory for the glue, through the runtime
        self.enabled = drv is not None
        self.spare_events = []
        self.timings = collections.deque()
        self.timings_lock = threading.Lock()
        self.next_ticket = 0
        self.device_type = kDLROCM if platform == "amd" else kDLCUDA
        self.device_index = device_index
        self.device = (self.device_type, device_index)
        self.held = []
        self.tls = threading.local()
        self.free_at_ns = 0
        self.free_bytes_cached = 0.0

    # ------------------------------------------------------------------ arguments
    cdef object read_args(self, str op, tuple args, dict kwargs, size_t reader, Inputs *ins, list keep):
        """The call's plan key, or None when the compiled path does not take it (no device array, a host
        array, another device's array, an argument of another kind). Fills `ins` with the device inputs
        in order and `keep` with what holds each (the DeviceArray, or the DLPackHold of a consumed
        tensor)."""
        cdef Py_ssize_t i, j
        ins.n = 0
        parts = [op]
        for a in args:
            part = self._part(a, reader, ins, keep)
            if part is None:
                return None
            parts.append(part)
        if kwargs:
            for k, v in kwargs.items():
                part = self._part(v, reader, ins, keep)
                if part is None:
                    return None
                parts.append(k)
                parts.append(part)
        if ins.n == 0:
            return None
        for i in range(ins.n):   # inputs that overlap: a plan knows only the pattern it was made with
            for j in range(i):
                if ins.ptr[i] < ins.ptr[j] + ins.nbytes[j] and ins.ptr[j] < ins.ptr[i] + ins.nbytes[i]:
                    parts.append((i, j, <long long>ins.ptr[i] - <long long>ins.ptr[j]))
        return tuple(parts)

    cdef object _part(self, a, size_t reader, Inputs *ins, list keep):
        t = type(a)
        if t is float or t is int or t is bool or t is str:
            return (t, a)
        if a is None:
            return _NONE_PART
        if isinstance(a, DeviceArray):
            return self._device_array(a, ins, keep)
        if t is np.ndarray:
            return self._host_array(a, ins)
        if ins.n >= MAX_INPUTS or not hasattr(t, "__dlpack__"):
            return None
        return self._dlpack(a, t, reader, ins, keep)

    cdef object _device_array(self, a, Inputs *ins, list keep):
        cdef Py_ssize_t n
        cdef size_t nbytes
        if ins.n >= MAX_INPUTS:
            return None
        device = a.device
        if device[1] != self.device_index:
            return None   # another device's memory: the general path refuses it by name
        shape = a.shape
        dtype = a.dtype
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        ptr = a.ptr
        stream = a.stream
        ins.ptr[ins.n] = ptr
        ins.nbytes[ins.n] = nbytes
        ins.producer[ins.n] = NO_STREAM if stream is None else stream
        ins.host[ins.n] = 0
        ins.n += 1
        keep.append(a)
        return (DeviceArray, shape, dtype, a.strides, (ptr & 15) == 0)

    cdef object _dlpack(self, a, t, size_t reader, Inputs *ins, list keep):
        cdef DLPackHold hold
        try:
            dev = a.__dlpack_device__()
        except Exception:
            return None
        if dev[0] not in GPU_DEVICE_TYPES or dev[1] != self.device_index:
            return None
        # the protocol's handshake, once: the producer orders the reading stream after its pending writes
        try:
            capsule = a.__dlpack__(stream=dlpack_stream(reader, dev[0]))
        except TypeError:   # a producer that predates the stream argument orders the legacy stream
            if reader:
                return None
            capsule = a.__dlpack__()
        hold = take(capsule, a)   # gpu/memory's one DLPack consumer, in C
        if hold is None:
            return None
        hold.library = library_of_type(t)
        if hold.lanes != 1 or hold.ndim > 32:
            return None
        ins.ptr[ins.n] = hold.ptr
        ins.nbytes[ins.n] = hold.nbytes
        ins.producer[ins.n] = NO_STREAM   # the handshake made it ready for the reader
        ins.host[ins.n] = 0
        ins.n += 1
        keep.append(hold)
        return (t, hold.shape, (hold.code, hold.bits), hold.strides, (hold.ptr & 15) == 0)

    cdef object _host_array(self, a, Inputs *ins):
        """A small writable host array, staged up on each call. Read-only (and registered) arrays may be
        kept resident on the device, and larger ones have their uploads shared across calls: those take
        the glue, which asks the resident cache."""
        cdef size_t nbytes
        if ins.n >= MAX_INPUTS or not self.drv.has_host:
            return None
        if not cnp.PyArray_ISWRITEABLE(a) or not cnp.PyArray_ISCARRAY(a):
            return None
        nbytes = cnp.PyArray_NBYTES(a)
        if nbytes >= STAGE_MAX:
            return None
        ins.ptr[ins.n] = <size_t>cnp.PyArray_DATA(a)
        ins.nbytes[ins.n] = nbytes
        ins.producer[ins.n] = NO_STREAM   # host memory: nothing to wait for
        ins.host[ins.n] = 1
        ins.n += 1
        return (np.ndarray, a.shape, a.dtype)

    cdef void *_staging(self, size_t nbytes) except? NULL:
        """This thread's page-locked staging buffer, at least `nbytes`, once no copy queued by an earlier
        call reads it any more (see Pinned.busy)."""
        cdef Pinned pin = self.tls.__dict__.get("staging")
        if pin is not None and pin.settle() != 0:
            self.tls.staging = pin = None   # a failed device: a new buffer rather than one a copy may read
        if pin is None or pin.nbytes < nbytes:
            pin = Pinned.__new__(Pinned)
            pin.drv = self.drv
            pin.nbytes = max(nbytes, <size_t>65536)
            if self.drv.alloc_host(&pin.ptr, pin.nbytes) != 0:
                pin.ptr = NULL
                raise GpuError("oom", f"cannot allocate {pin.nbytes} bytes of page-locked staging memory")
            self.tls.staging = pin
        return pin.ptr

    # ------------------------------------------------------------------ replay
    cdef object replay(self, Plan plan, Inputs *ins, list keep, size_t stream):
        """Run `plan` on `ins` on `stream`: the results, as DeviceArrays or, when the first device input
        came from a library that makes its arrays from DLPack, as that library's arrays."""
        cdef Driver drv = self.drv
        cdef void *outp[MAX_OUTPUTS]
        cdef void *scratch = NULL
        cdef unsigned long long buf[MAX_SLOTS]
        cdef void *kp[MAX_SLOTS]
        cdef size_t base
        cdef int i, status = 0
        cdef LaunchSpec *l
        cdef Patch *p
        cdef void *s = <void *>stream
        cdef void *stage = NULL
        cdef void *dev_in = NULL
        cdef char *src
        cdef size_t in_ptr[MAX_INPUTS]
        if not drv.usable():
            self.enabled = False
            raise GpuError("unavailable", "forked child: the GPU driver cannot be used after fork()",
                           name="forked-child")
        status = drv.current()
        if status != 0:
            drv.fail(status, "make the device current")
        for i in range(ins.n):
            if ins.producer[i] >= 0 and <size_t>ins.producer[i] != stream:
                status = drv.order_after(<void *><size_t>ins.producer[i], s)
                if status != 0:
                    drv.fail(status, "stream_wait_event")
        if stream:
            # work is queued on it now: a retired stream's handle in use again (see DeviceMemory.used_on)
            _retired_streams.discard(stream)
        for i in range(ins.n):
            in_ptr[i] = ins.ptr[i]
        if plan.nhost or plan.to_host:
            stage = self._staging(plan.staged_in + plan.staged_out)
        if plan.nhost:
            # every host input into the staging buffer, then one asynchronous copy of them all
            for i in range(ins.n):
                if ins.host[i]:
                    memcpy(<char *>stage + plan.in_off[i], <void *>ins.ptr[i], ins.nbytes[i])
            status = drv.alloc_async(&dev_in, plan.staged_in, s)
            if status != 0:
                drv.fail(status, "malloc_async")
            status = drv.htod(dev_in, stage, plan.staged_in, s)
            if status != 0:
                drv.free_async(dev_in, s)
                drv.fail(status, "memcpy_htod")
            if not plan.to_host:
                # the call returns with the upload queued: the next call on this thread waits for it
                # before it writes the staging buffer again
                self._mark_busy(stage, stream)
            for i in range(ins.n):
                if ins.host[i]:
                    in_ptr[i] = <size_t>dev_in + plan.in_off[i]
        mems = []
        for i in range(plan.nout):
            outp[i] = NULL
            status = drv.alloc_async(&outp[i], plan.out_bytes[i] if plan.out_bytes[i] else 1, s)
            if status != 0:
                if dev_in != NULL:
                    drv.free_async(dev_in, s)
                drv.fail(status, "malloc_async")
            mems.append(adopt(drv, outp[i], plan.out_bytes[i], stream))
        if plan.scratch_bytes:
            status = drv.alloc_async(&scratch, plan.scratch_bytes, s)
            if status != 0:
                if dev_in != NULL:
                    drv.free_async(dev_in, s)
                drv.fail(status, "malloc_async")
        memcpy(buf, plan.slots, plan.nslots * sizeof(unsigned long long))
        for i in range(plan.npatch):
            p = &plan.patches[i]
            if p.kind == 0:
                base = in_ptr[p.index]
            elif p.kind == 1:
                base = <size_t>outp[p.index]
            else:
                base = <size_t>scratch
            buf[p.slot] = base + p.delta
        for i in range(plan.nslots):
            kp[i] = &buf[i]
        for i in range(plan.nlaunch):
            l = &plan.launches[i]
            status = drv.launch(l.fn, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                                l.shared, s, &kp[l.first], NULL)
            if status != 0:
                break
        if scratch != NULL:
            drv.free_async(scratch, s)   # in stream order: after the launches that use it
        if dev_in != NULL:
            drv.free_async(dev_in, s)
        if status != 0:
            if dev_in != NULL and plan.to_host:
                self._mark_busy(stage, stream)   # the upload may still be queued: see _staging
            drv.fail(status, "launch")
        if plan.to_host:
            return self._download(plan, outp, stage, stream)
        self._hold(keep, stream)
        out = []
        for r in plan.results:
            a = _new(DeviceArray)
            a.ptr = <size_t>outp[<int>r[0]] + <size_t>r[1]
            a.shape = r[2]
            a.dtype = r[3]
            a.strides = r[4]
            a.runtime = self.runtime
            a.owner = mems[<int>r[0]]
            a.stream = stream
            a.device = self.device
            out.append(a)
        out = out[0] if plan.single else tuple(out)
        library = keep[0].library if type(keep[0]) is DLPackHold else keep[0].origin
        return out if library is None else to_library(library, out)

    cdef void _mark_busy(self, void *stage, size_t stream):
        cdef Pinned pin = self.tls.__dict__.get("staging")
        cdef void *e
        if pin is None or pin.ptr != stage:
            return
        e = self.drv.event()
        if e == NULL or self.drv.event_record(e, <void *>stream) != 0:
            self.drv.spare(e)
            self.drv.stream_sync(<void *>stream)   # no event: wait now
            return
        pin.settle()
        pin.busy = e

    cdef object _download(self, Plan plan, void **outp, void *stage, size_t stream):
        """Host results: every output copied into the staging buffer, one wait for the stream, then into
        new NumPy arrays. The device outputs are let go at once (their frees are in stream order)."""
        cdef Driver drv = self.drv
        cdef void *s = <void *>stream
        cdef int status = 0
        cdef size_t nbytes
        for r in plan.results:
            nbytes = r[6]
            if nbytes and status == 0:
                status = drv.dtoh(<char *>stage + <size_t>r[5], <char *>outp[<int>r[0]] + <size_t>r[1], nbytes, s)
        if status == 0:
            status = drv.stream_sync(s)
        if status != 0:
            self._mark_busy(stage, stream)   # copies into it may still be queued: see _staging
            drv.fail(status, "memcpy_dtoh")
        out = []
        for r in plan.results:
            a = np.empty(r[2], r[3])
            nbytes = cnp.PyArray_NBYTES(a)
            if nbytes:
                memcpy(cnp.PyArray_DATA(a), <char *>stage + <size_t>r[5], nbytes)
            out.append(a)
        return out[0] if plan.single else tuple(out)

    # ------------------------------------------------------------------ events: the driver's or the runtime's
    # Every event this engine records goes through these: the Driver's C function pointers where the
    # runtime gave them, else the runtime's Python methods (the kernel emulator without C entry points).
    # The rules above them (what is held and for how long, what a timing reads) are written once.
    cdef size_t _event(self) noexcept:
        """A fresh or spare event (0: none could be made)."""
        if self.drv is not None:
            return <size_t>self.drv.event()
        try:
            return self.spare_events.pop() if self.spare_events else <size_t>self.runtime.event_create()
        except Exception:
            return 0

    cdef int _record(self, size_t e, size_t stream) noexcept:
        if self.drv is not None:
            return self.drv.event_record(<void *>e, <void *>stream)
        try:
            self.runtime.event_record(e, stream)
            return 0
        except Exception:
            return 1

    cdef int _query(self, size_t e, bint wait) noexcept:
        """0 once the work before `e` has run (after waiting for it with `wait`), NOT_READY while it is
        queued, another status when it cannot be told."""
        if self.drv is not None:
            return self.drv.event_sync(<void *>e) if wait else self.drv.event_query(<void *>e)
        try:
            if wait:
                self.runtime.event_synchronize(e)
                return 0
            return 0 if self.runtime.event_query(e) else NOT_READY
        except Exception:
            return 1

    cdef int _elapsed(self, float *ms, size_t start, size_t end) noexcept:
        if self.drv is not None:
            return self.drv.event_elapsed(ms, <void *>start, <void *>end)
        try:
            ms[0] = self.runtime.event_elapsed_ms(start, end)
            return 0
        except Exception:
            return 1

    cdef void _spare(self, size_t e) noexcept:
        if e == 0:
            return
        if self.drv is not None:
            self.drv.spare(<void *>e)
        else:
            self.spare_events.append(e)

    cdef int _stream_sync(self, size_t stream) noexcept:
        if self.drv is not None:
            return self.drv.stream_sync(<void *>stream)
        try:
            self.runtime.stream_synchronize(stream)
            return 0
        except Exception:
            return 1

    cdef int _current(self) noexcept:
        """0 when this device's context is current on the calling thread (made so if need be)."""
        return self.drv.current() if self.drv is not None else 0

    # ------------------------------------------------------------------ inputs' lifetimes
    cdef void _hold(self, list keep, size_t stream):
        """Inputs' lifetimes: hipsched's own memory is marked as used on `stream` (its free waits for
        it); anything else is held, with an event, until the work queued so far has run."""
        cdef size_t e
        foreign = None
        for a in keep:
            if type(a) is not DLPackHold:
                owner = getattr(a, "owner", None)
                while isinstance(owner, DeviceArray):
                    owner = owner.owner
                if isinstance(owner, DeviceMemory):
                    streams = (<DeviceMemory>owner).streams
                    if stream not in streams:
                        streams.append(stream)
                    continue
                if hasattr(owner, "used_on"):
                    owner.used_on(stream)
                    continue
            if foreign is None:
                foreign = []
            foreign.append(a)
        self._reap(False)
        if foreign is None:
            return
        e = self._event()
        if e == 0 or self._record(e, stream) != 0:
            self._spare(e)
            self._stream_sync(stream)   # no event: wait now rather than let go of memory in use
            return
        self.held.append((e, foreign))
        if len(self.held) > MAX_HELD:
            self._reap(True)

    def hold_inputs(self, args, size_t stream):
        """Hold a call's device inputs (`args`, nested tuples and lists too) until the work queued on
        `stream` so far has run, as a replayed call's are (`_hold`): the glue's calls return with kernels
        that read them still queued, and the caller may drop its last reference at once (its library's
        caching allocator would then hand the memory to its next kernel while ours still reads it)."""
        found = []
        _device_inputs(args, found)
        if found:
            self._hold(found, stream)
        else:
            self._reap(False)

    cdef void _reap(self, bint wait_oldest):
        """Let go of held inputs whose work has run (oldest first: one stream's work runs in order, so
        this stops at the first still queued)."""
        cdef size_t e
        cdef int status
        held = self.held
        while held:
            entry = held[0]
            e = <size_t>entry[0]
            status = self._query(e, wait_oldest)
            wait_oldest = False
            if status == NOT_READY:
                return
            # another thread may have let it go while the driver was asked (a driver reached through
            # Python lets one in): then held[0] is a later call's, whose work may still be queued
            if held and held[0] is entry:
                del held[0]
                self._spare(e)

    def reap(self):
        """Let go of held inputs whose work has run, without waiting."""
        self._reap(False)

    def release_held(self, bint wait=True):
        """Let go of every held input (waiting for its work when `wait`); the backend's close calls it."""
        if (self.drv is not None and not self.drv.usable()) or self._current() != 0:
            self.held = []
            return
        while self.held:
            e, _ = self.held.pop(0)
            if wait:
                self._query(<size_t>e, True)
            self._spare(<size_t>e)

    def order_after(self, size_t producer, size_t consumer):
        """Order `consumer` after the work queued on `producer` so far, with an event (the host does
        not block): a device input last written on another stream."""
        cdef int status
        if producer == consumer:
            return
        if self.drv is not None:
            status = self.drv.order_after(<void *>producer, <void *>consumer)
            if status != 0:
                self.drv.fail(status, "stream_wait_event")
            return
        event = self.runtime.event_create()
        try:
            self.runtime.event_record(event, producer)
            self.runtime.stream_wait_event(consumer, event)
        finally:
            self.runtime.event_destroy(event)   # released once the wait has been satisfied

    # ------------------------------------------------------------------ memory and timing
    cdef double _read_free(self) except -1.0:
        return self.drv.free_bytes() if self.drv is not None else float(self.runtime.mem_info()[0])

    cdef double free_bytes(self):
        """The device's free memory, re-read at most every FREE_TTL_NS (a decision must not cost a driver
        query); 0 when it cannot be read."""
        cdef long long now = _now_ns()
        if now - self.free_at_ns > FREE_TTL_NS or self.free_at_ns == 0:
            self.free_at_ns = now
            try:
                self.free_bytes_cached = self._read_free()
            except Exception:
                self.free_bytes_cached = 0.0
        return self.free_bytes_cached

    def device_free_bytes(self):
        """free_bytes, for the backend's judge: a reading that fails raises (a dead driver is often met
        first here; the backend decides what that means) and reads as 0 until the next one."""
        cdef long long now = _now_ns()
        if now - self.free_at_ns > FREE_TTL_NS or self.free_at_ns == 0:
            self.free_at_ns = now
            self.free_bytes_cached = 0.0
            self.free_bytes_cached = self._read_free()
        return self.free_bytes_cached

    def forget_free_memory(self):
        """The device ran out of memory: the next decision reads the free memory anew."""
        self.free_at_ns = 0

    cdef void *time_mark(self, size_t stream) noexcept:
        """An event recorded on `stream` now (NULL: none could be)."""
        cdef size_t e
        if self._current() != 0:   # (the first call on a thread may find another context current)
            return NULL
        e = self._event()
        if e != 0 and self._record(e, stream) != 0:
            self._spare(e)
            return NULL
        return <void *>e

    cdef double elapsed_us(self, void *start, void *end) noexcept:
        """Microseconds between two marks once `end` has run; -1 while it has not, -2 if lost."""
        cdef float ms = 0
        cdef int status = self._current()
        if status != 0:
            return -2.0
        status = self._query(<size_t>end, False)
        if status == NOT_READY:
            return -1.0
        if status != 0 or self._elapsed(&ms, <size_t>start, <size_t>end) != 0:
            return -2.0
        return ms * 1e3

    cdef void release_event(self, void *event) noexcept:
        self._spare(<size_t>event)

    def start_timing(self, size_t stream):
        """A mark recorded on `stream` before a glue run's work, for stop_timing; 0 (untimed) when
        MAX_PENDING_TIMINGS readings are pending or no event can be recorded."""
        if len(self.timings) >= MAX_PENDING_TIMINGS:
            return 0
        return <size_t>self.time_mark(stream)

    def stop_timing(self, size_t start, size_t stream):
        """Record the end mark after the run's work on `stream`; returns the ticket `read_timings()` gives
        back with the device time between the two marks once that work has run (None: untimed)."""
        cdef void *end = self.time_mark(stream)
        if end == NULL:
            self._spare(start)
            return None
        with self.timings_lock:
            self.next_ticket += 1
            ticket = self.next_ticket
            self.timings.append((ticket, start, <size_t>end))
        return ticket

    def cancel_timing(self, size_t start):
        """The run whose start mark this is failed: no reading will be taken."""
        self._spare(start)

    def read_timings(self):
        """[(ticket, device us or None)] of timed glue runs whose work has run, oldest first, without
        waiting: it stops at the first one still queued (one stream's work finishes in order). None: the
        reading could not be taken (a failed device, an event another context recorded)."""
        cdef double us
        if not self.timings:
            return []
        done = []
        with self.timings_lock:
            while self.timings:
                ticket, start, end = self.timings[0]
                us = self.elapsed_us(<void *><size_t>start, <void *><size_t>end)
                if us == -1.0:
                    break
                self.timings.popleft()
                self._spare(<size_t>start)
                self._spare(<size_t>end)
                done.append((ticket, us if us >= 0 else None))
        return done

    def close(self):
        """Let go of held inputs once their work has run, drop unread timings and the spare events of a
        runtime without C entry points (the Driver keeps its own pool); the runtime stays usable."""
        self.release_held(True)
        with self.timings_lock:
            for _, start, end in self.timings:   # unread: destroying a recorded event is allowed
                self._spare(<size_t>start)
                self._spare(<size_t>end)
            self.timings.clear()
        events, self.spare_events = self.spare_events, []
        for e in events:
            try:
                self.runtime.event_destroy(e)
            except Exception:
                pass

    # ------------------------------------------------------------------ recording
    def request_recording(self, inputs):
        """The next glue run on this thread is recorded: `inputs` are the call's device inputs as
        (pointer, bytes), in the key's order."""
        self.tls.request = inputs
        self.tls.plan = None

    def recording_request(self):
        """What the glue run about to start should record for (taken once), or None."""
        d = self.tls.__dict__
        return d.pop("request", None)

    def recorded(self, plan, refused=None):
        """A recorded glue run's plan; or None, and why the recorder refused the run (`refused`)."""
        self.tls.plan = plan
        self.tls.refused = refused

    def take_recorded(self):
        """(plan, why refused) of the last recorded glue run on this thread (taken once): the plan, or
        None and the recorder's reason, or (None, None) where no glue run was recorded (a run that failed
        before its glue, or was cut into pieces); a request no glue run took goes too."""
        d = self.tls.__dict__
        d.pop("request", None)
        return d.pop("plan", None), d.pop("refused", None)

