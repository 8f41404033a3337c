# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The driver entry points of the compiled GPU call path, and the device memory it owns.

`driver_for(runtime)` takes launch, asynchronous copies and allocation, events and stream waits as C
function pointers, once, from the library the ctypes binding (gpu/bindings/ctypes_api.py) or hip-python already
loaded (`Runtime.c_entry_points`): a launch then costs what the driver costs (cuLaunchKernel: about 1.6 us from C against 3 us from
cuda-python and more through ctypes). The Python bindings stay the way the library is found and
initialised, and the path for everything this table does not cover.

`DeviceMemory` owns one device allocation and frees it, when its last reference goes, in stream order
after the work of every stream it was used on (see its docstring)."""
from libc.stdint cimport uintptr_t


from .retired_streams import _retired_streams
from .status import gpu_error


cdef extern from *:
    """
    #include <pthread.h>
    /* Bumped in a forked child: CUDA and HIP state does not survive fork(), and a child that calls the
       parent's driver gets CUDA_ERROR_NOT_INITIALIZED or, on ROCm, may hang. A C counter, so that the
       check costs a load on every call (runtime.fork_generation is the Python side's). */
    static int hs_fork_gen = 0;
    static void hs_after_fork_child(void) { hs_fork_gen++; }
    static int hs_fork_registered = 0;
    static void hs_register_fork(void) {
        if (!hs_fork_registered) { hs_fork_registered = 1; pthread_atfork(NULL, NULL, hs_after_fork_child); }
    }
    static inline int hs_fork_generation(void) { return hs_fork_gen; }
    """
    void hs_register_fork() nogil
    int hs_fork_generation() nogil

hs_register_fork()

cdef int fork_generation() noexcept nogil:
    return hs_fork_generation()


def driver_for(runtime):
    """The Driver of `runtime` (made once and kept on it), or None when it has no C entry points."""
    if runtime is None:
        return None
    try:
        found = runtime.__dict__.get("_c_driver", False)
    except AttributeError:
        return None
    if found is not False:
        return found
    drv = None
    try:
        points = runtime.c_entry_points()
    except Exception:   # a library without one of the symbols: the Python path serves this runtime
        points = None
    if points is not None:
        drv = Driver.__new__(Driver)
        drv._fill(runtime, *points)
    try:
        runtime._c_driver = drv
    except AttributeError:
        pass
    return drv


cdef class Driver:
    """C function pointers into one runtime's library, bound to one device. Made by `driver_for`."""

    def _fill(self, runtime, dict table, str vendor, uintptr_t context, int device):
        """`table`: {Runtime.C_ENTRY_POINTS name: function address} (see Runtime.c_entry_points)."""
        self.runtime = runtime
        self.vendor = vendor
        self.cuda = vendor == "cuda"
        self.context = <void *>context
        self.device = device
        self.fork_gen = hs_fork_generation()
        self.nevents = 0
        self.launch = <fn_launch_t><uintptr_t>table["launch"]
        self.alloc_async = <fn_alloc_async_t><uintptr_t>table["malloc_async"]
        self.free_async = <fn_free_async_t><uintptr_t>table["free_async"]
        self.htod = <fn_memcpy_t><uintptr_t>table["memcpy_htod"]
        self.dtoh = <fn_memcpy_t><uintptr_t>table["memcpy_dtoh"]
        self.event_create = <fn_event_create_t><uintptr_t>table["event_create"]
        self.event_destroy = <fn_event_t><uintptr_t>table["event_destroy"]
        self.event_query = <fn_event_t><uintptr_t>table["event_query"]
        self.event_sync = <fn_event_t><uintptr_t>table["event_synchronize"]
        self.event_record = <fn_event_record_t><uintptr_t>table["event_record"]
        self.event_elapsed = <fn_event_elapsed_t><uintptr_t>table["event_elapsed"]
        self.stream_wait = <fn_stream_wait_t><uintptr_t>table["stream_wait_event"]
        self.stream_sync = <fn_stream_t><uintptr_t>table["stream_synchronize"]
        self.mem_info = <fn_mem_info_t><uintptr_t>table["mem_info"]
        self.has_host = "host_alloc" in table and "host_free" in table
        if self.has_host:
            if self.cuda:
                self.host_alloc_cuda = <fn_host_alloc_t><uintptr_t>table["host_alloc"]
            else:
                self.host_alloc_hip = <fn_host_alloc_flags_t><uintptr_t>table["host_alloc"]
            self.host_free = <fn_host_free_t><uintptr_t>table["host_free"]
        if self.cuda:
            self.get_ctx = <fn_get_ctx_t><uintptr_t>table["get_current"]
            self.set_ctx = <fn_set_ctx_t><uintptr_t>table["set_current"]
        else:
            self.get_device = <fn_get_device_t><uintptr_t>table["get_current"]
            self.set_device = <fn_set_device_t><uintptr_t>table["set_current"]

    cdef bint usable(self) noexcept nogil:
        return self.fork_gen == hs_fork_generation()

    cdef int current(self) noexcept nogil:
        """Make this device current on the calling thread. What is current is per thread and anyone may
        change it between two of our calls (PyTorch or CuPy on the same thread, another backend on
        another device), so the driver is asked each time (a few nanoseconds from C) rather than a cache
        of what we last set: launching with this device's pointers into another context is
        CUDA_ERROR_ILLEGAL_ADDRESS, which kills that context."""
        cdef void *cur = NULL
        cdef int dev = -1, status
        if self.cuda:
            status = self.get_ctx(&cur)
            if status != 0 or cur != self.context:
                return self.set_ctx(self.context)
            return 0
        status = self.get_device(&dev)
        if status != 0 or dev != self.device:
            return self.set_device(self.device)
        return 0

    cdef void *event(self) noexcept nogil:
        """A spare event from the pool, or a new one (NULL if none can be made). Callers hold the GIL, so
        the pool needs no lock of its own."""
        cdef void *e = NULL
        if self.nevents > 0:
            self.nevents -= 1
            return self.events[self.nevents]
        if self.event_create(&e, 0) != 0:
            return NULL
        return e

    cdef void spare(self, void *event) noexcept nogil:
        """Give an event back: recorded ones may be re-recorded at once (a stream wait took the state it
        had when the wait was queued, and an elapsed time is read before this)."""
        if event == NULL:
            return
        if self.nevents < EVENT_POOL:
            self.events[self.nevents] = event
            self.nevents += 1
        else:
            self.event_destroy(event)

    cdef int order_after(self, void *producer, void *consumer) noexcept nogil:
        """Order `consumer` after the work queued on `producer` so far, without blocking the host."""
        cdef void *e
        cdef int status
        if producer == consumer:
            return 0
        e = self.event()
        if e == NULL:
            return self.stream_sync(producer)
        status = self.event_record(e, producer)
        if status == 0:
            status = self.stream_wait(consumer, e, 0)
        self.spare(e)
        return status

    cdef int alloc_host(self, void **ptr, size_t nbytes) noexcept nogil:
        """Page-locked host memory (the copies from it run asynchronously, at the link's full speed)."""
        if self.cuda:
            return self.host_alloc_cuda(ptr, nbytes)
        return self.host_alloc_hip(ptr, nbytes, 0)

    cdef object fail(self, int status, str what):
        """Raise the GpuError the Python binding would have raised for `status` from `what`."""
        name = None
        try:
            name = self.runtime._error_name(status)
        except Exception:
            pass
        raise gpu_error(name, what, status)

    def free_bytes(self):
        """Free device memory in bytes, asked of the driver."""
        cdef size_t free = 0, total = 0
        cdef int status
        if not self.usable():
            return 0
        status = self.current()
        if status == 0:
            status = self.mem_info(&free, &total)
        if status != 0:
            self.fail(status, "mem_info")
        return free

    def __dealloc__(self):
        cdef int i
        if self.usable() and self.current() == 0:
            for i in range(self.nevents):
                self.event_destroy(self.events[i])
        self.nevents = 0


# The Python finalizer for memory of runtimes without a Driver (gpu/memory/device_array.py sets it: this
# module cannot import that one, which imports this)
python_release = None


cdef class DeviceMemory:
    """One device allocation, freed when its last reference goes. cuMemFree/hipFree give no promise
    about kernels still queued that read the memory (and where they wait, they stall the whole device,
    here from a finalizer), so the free is stream-ordered: on the stream the memory was made for, after
    events that order it behind the work of every other stream it was used on (`used_on`). Nothing
    blocks and no lock is taken.

    `DeviceMemory(runtime, nbytes, stream)` allocates through the runtime: made for a stream, in that
    stream's order from the device's pool (microseconds, where a synchronous malloc costs 100 us or
    more); made for no stream (None), usable by anyone at once. The compiled call path makes its
    results with `adopt`, without entering Python."""

    def __cinit__(self):
        self.ptr = 0
        self.nbytes = 0
        self.streams = [0]
        self.runtime = None
        self.drv = None

    def __init__(self, runtime, nbytes, stream=None):
        self.runtime = runtime
        self.nbytes = int(nbytes)
        if not self.nbytes:
            ptr = 0
        elif stream is None or not hasattr(runtime, "malloc_async"):
            ptr = runtime.malloc(self.nbytes)
        else:
            ptr = runtime.malloc_async(self.nbytes, int(stream))
        self.ptr = ptr
        self.streams = [int(stream or 0)]
        _retired_streams.discard(self.streams[0])   # in use again: see used_on
        self.drv = driver_for(runtime)

    def used_on(self, stream) -> None:
        """Work on `stream` uses this memory: the free is ordered after it too. A handle that a retired
        stream once had is in use again (drivers reuse handles, and a stream made outside a StreamPool
        never says so): it is live from here on, or the free would skip it."""
        s = int(stream or 0)
        if s not in self.streams:
            self.streams.append(s)
        _retired_streams.discard(s)

    def __dealloc__(self):
        cdef uintptr_t home, s
        cdef int i
        cdef Driver drv
        if self.ptr == 0:
            return
        try:
            if self.drv is None or not (<Driver>self.drv).usable():
                if python_release is not None:
                    python_release(self.runtime, self.ptr, self.streams)
                return
            drv = <Driver>self.drv
            live = [s for s in self.streams if s not in _retired_streams] or [0]
            home = live[0]
            if drv.current() != 0:
                return
            for i in range(1, len(live)):
                s = live[i]
                drv.order_after(<void *>s, <void *>home)
            drv.free_async(<void *>self.ptr, <void *>home)
        except Exception:   # a finalizer never raises; the driver reclaims the memory at exit anyway
            pass


cdef DeviceMemory adopt(Driver drv, void *ptr, size_t nbytes, size_t stream):
    """DeviceMemory owning `ptr`, allocated on `stream` through `drv`."""
    cdef DeviceMemory m = DeviceMemory.__new__(DeviceMemory)
    m.ptr = <uintptr_t>ptr
    m.nbytes = nbytes
    m.runtime = drv.runtime
    m.drv = drv
    if stream:
        m.streams = [stream]
    return m
