# cython: language_level=3, boundscheck=False, wraparound=False
"""Telemetry.record compiled (see recorder.py for what an event holds and where it goes).

A record runs under the GIL and calls no Python code of its own (tuple, list, dict and deque
operations on built-in types), so other threads cannot interleave with it: the counters are exact
without a lock, and sequence numbers are unique and in ring order. What is left of its cost is the
event tuple itself (its floats and ints), one dict lookup when the (op, backend) changes from the
previous record, and the ring and queue stores; the ring reuses the tuple it evicts when nothing
else holds it (the writer has written it), as CPython's own iterators reuse their result tuples."""
from cpython.contextvars cimport get_value
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.list cimport PyList_GET_ITEM, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_New, PyTuple_SET_ITEM
from libc.math cimport NAN, isfinite
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from hipsched._clock cimport now_ns

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(PyObject *o)
    bint PyTuple_CheckExact(PyObject *o)

DEF NFIELDS = 18   # the layout of events.py (TS, SEQ, OP, ... DETAIL, RESIDENT, SPLIT, GPU_DEVICE)
cdef double INF = float("inf")


cdef inline double wall_time() noexcept nogil:
    # what time.time() reads (CLOCK_REALTIME), without a Python call
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


# How long the wall time of an event may be taken from the monotonic clock reading its call already
# made, from one reading of both clocks: a clock read is a fifth of a tiny call's telemetry. In 100 ms
# NTP's slew (500 ppm) parts the clocks by 50 us; a step of the wall clock or a suspend (the monotonic
# clock stops) shows up to 100 ms late, where events read the wall clock themselves on other paths
DEF ANCHOR_NS = 100000000


cdef class Recorder:
    def __init__(self, Py_ssize_t ring_size, queue, Py_ssize_t queue_size, drops, dict cells, add_error,
                 scope_var):
        if ring_size < 0:
            raise ValueError(f"telemetry ring_size must be >= 0, got {ring_size!r}")
        self.enabled = True
        self.cap = ring_size
        self.ring = [None] * ring_size
        self.pos = self.count = 0
        self.queue = queue
        self.queue_append = queue.append if queue is not None else None
        self.queue_size = queue_size
        self.drops = drops
        self.cells = cells
        self.add_error = add_error
        self.scope_var = scope_var
        self.seq = 0
        self.anchor_mono = -ANCHOR_NS - 1
        self.anchor_wall = 0.0

    def detach_queue(self):
        """Later records stay in memory only (the writer is closed)."""
        self.queue = None
        self.queue_append = None

    def recent(self):
        """The events in the ring, oldest first."""
        if self.count < self.cap:
            return self.ring[:self.count]
        return self.ring[self.pos:] + self.ring[:self.pos]

    def clear(self):
        """Empties the ring (the counters are store.Counters')."""
        self.ring = [None] * self.cap
        self.pos = self.count = 0
        self.last_op = self.last_backend = self.last_cell = None

    def time_record(self, long long n):
        """Nanoseconds per record() as the compiled dispatcher pays it (a C call; its floats made per
        event), over n events into a scratch recorder like this one (same ring size, no writer)."""
        cdef Recorder r = Recorder(self.cap, None, 0, None, {}, self.add_error, self.scope_var)
        cdef long long i
        cdef double t0, t1
        op, backend, reason, dtype = "add", "cpu", "below_min_batch", "float32"
        if n <= 0:
            return 0.0
        t0 = wall_time()
        for i in range(n):
            r.record(op, backend, reason, 8, dtype, 96, 1.5 + (i & 7), 2.0 + (i & 3), NAN, None, None, None)
        t1 = wall_time()
        return (t1 - t0) * 1e9 / n

    cpdef record(self, op, backend, reason, size, dtype, nbytes, duration_us, pred_cpu_us, pred_gpu_us,
                 stream=None, fallback=None, detail=None, resident=None, split=None, gpu_device=None):
        """See Telemetry.record."""
        if not self.enabled:
            return None
        return self._put(wall_time(), op, backend, reason, size, dtype, nbytes, duration_us, pred_cpu_us,
                         pred_gpu_us, stream, fallback, detail, resident, split, gpu_device)

    cdef object record_ended(self, long long end_ns, op, backend, reason, size, dtype, nbytes, duration_us,
                             pred_cpu_us, pred_gpu_us, stream, detail):
        """record, for a call whose end the caller read from the monotonic clock (`end_ns`, now_ns()'s):
        its wall time follows from the last reading of both clocks, taken again every 100 ms."""
        cdef long long d
        if not self.enabled:
            return None
        d = end_ns - self.anchor_mono
        if d < 0 or d > ANCHOR_NS:
            # (one clock after the other: the pair is a few ns apart, the order of an event's own skew)
            self.anchor_mono = now_ns()
            self.anchor_wall = wall_time()
            d = end_ns - self.anchor_mono
        return self._put(self.anchor_wall + d * 1e-9, op, backend, reason, size, dtype, nbytes, duration_us,
                         pred_cpu_us, pred_gpu_us, stream, None, detail, None, None, None)

    cdef object _put(self, double wall, op, backend, reason, size, dtype, nbytes, duration_us, pred_cpu_us,
                     pred_gpu_us, stream, fallback, detail, resident, split, gpu_device):
        cdef PyObject *new[NFIELDS]
        cdef PyObject *old[NFIELDS]
        cdef PyObject *slot = NULL
        cdef Py_ssize_t i
        cdef tuple rec
        cdef object ts = wall
        cdef object seq = self.seq
        self.seq += 1
        cdef object scope = get_value(self.scope_var)
        new[0] = <PyObject *>ts; new[1] = <PyObject *>seq; new[2] = <PyObject *>op
        new[3] = <PyObject *>backend; new[4] = <PyObject *>reason; new[5] = <PyObject *>size
        new[6] = <PyObject *>dtype; new[7] = <PyObject *>nbytes; new[8] = <PyObject *>duration_us
        new[9] = <PyObject *>pred_cpu_us; new[10] = <PyObject *>pred_gpu_us; new[11] = <PyObject *>stream
        new[12] = <PyObject *>scope; new[13] = <PyObject *>fallback; new[14] = <PyObject *>detail
        new[15] = <PyObject *>resident; new[16] = <PyObject *>split; new[17] = <PyObject *>gpu_device
        for i in range(NFIELDS):
            Py_INCREF(<object>new[i])
        if self.cap > 0:
            slot = PyList_GET_ITEM(self.ring, self.pos)
        if slot != NULL and Py_REFCNT(slot) == 1 and PyTuple_CheckExact(slot):
            # only the ring holds the evicted event: refill it. Its old items are released after the
            # tuple is whole again, since a release can run a finalizer that reads the ring.
            rec = <tuple>slot
            for i in range(NFIELDS):
                old[i] = PyTuple_GET_ITEM(rec, i)
                PyTuple_SET_ITEM(rec, i, <object>new[i])
            for i in range(NFIELDS):
                Py_XDECREF(old[i])
        else:
            rec = PyTuple_New(NFIELDS)
            for i in range(NFIELDS):
                PyTuple_SET_ITEM(rec, i, <object>new[i])
            if self.cap > 0:
                Py_INCREF(rec)
                PyList_SET_ITEM(self.ring, self.pos, rec)
                Py_XDECREF(slot)
        if self.cap > 0:
            self.pos += 1
            if self.pos == self.cap:
                self.pos = 0
            if self.count < self.cap:
                self.count += 1

        cdef list c
        cdef PyObject *found
        if op is self.last_op and backend is self.last_backend:
            c = <list>self.last_cell
        else:
            key = (op, backend)
            found = PyDict_GetItem(self.cells, key)
            if found == NULL:
                c = [0, 0.0, 0]
                PyDict_SetItem(self.cells, key, c)
            else:
                c = <list>found
            self.last_op, self.last_backend, self.last_cell = op, backend, c
        c[0] += 1
        cdef double t
        if PyFloat_CheckExact(duration_us):
            t = PyFloat_AS_DOUBLE(duration_us)
            if isfinite(t):   # NaN and inf add no time
                c[1] += t
        elif duration_us is not None:   # ints, NumPy scalars: as a Python comparison takes them
            try:
                if -INF < duration_us < INF:
                    c[1] += duration_us
            except TypeError:
                pass
        if fallback is not None:
            c[2] += 1
            self.add_error(op, fallback)
        if self.queue_append is not None:
            # the length check may overshoot by a few when the writer thread drains at the same time
            if len(self.queue) < self.queue_size:
                self.queue_append(rec)
            else:
                next(self.drops)
        return None
