"""C entry points for the kernel emulator (tests/support/gpu_emulator.py), so the compiled GPU call path
(hipsched/gpu/bindings/_driver.pyx's Driver, gpu/launch/_callpath.pyx's plan replay) runs in CI with kernels that really run.

`attach(rt)` gives an EmuRuntime (synchronous or asynchronous) what a real binding's
`Runtime.c_entry_points` gives: C function pointers with the CUDA driver API's signatures (cuLaunchKernel,
cuMemAllocAsync, cuEventQuery, ...; the typedefs at the top of hipsched/gpu/bindings/_driver.pxd), here ctypes
callbacks into the emulator's Python methods. Each returns 0, or a CUDA-like code for the GpuError the
method raised (600 for an event not ready); nothing raises through C. `rt._error_name` names the codes
back as the driver does, so a failure replayed through the Driver is classified as the Python
binding's would be.

`attach(rt, vendor="hip")` gives HIP's table instead (the same codes, named hipError*, hipGetDevice /
hipSetDevice for what is current, hipHostMalloc with its flags), which takes _driver.pyx's HIP branch.
Each device of an EmuRuntime(devices=n) gets its own table (`rt.for_device(i).c_entry_points()`: its
index and, on CUDA, its own context), and the driver keeps the rules that tell devices apart, as a real
one does: a call needs a current context (CUDA_ERROR_INVALID_CONTEXT); a kernel launches only where its
module was loaded, and a stream is used only on the device that made it (INVALID_HANDLE); a kernel
argument or a free of another device's memory is refused (ILLEGAL_ADDRESS: without peer access the
kernel would fault; INVALID_VALUE for the free); and a destroyed stream is refused (INVALID_HANDLE), as
a driver answers a handle it no longer knows, before the emulator's memcheck sees the work.

The launch callback gets `void **kernelParams` without types: it reads each parameter with the type the
kernel's build recorded (EmuRuntime.param_types), copying the values at once (they live on the caller's
C stack), and launches through `rt.launch`.

Attach before anything asks `driver_for(rt)` (a GpuBackend, a DeviceArray made on rt): the answer is
cached on the runtime. `fail_next(rt, name)` makes the next call(s) of one entry point fail, and
`calls(rt)` counts what each entry point was asked."""
from __future__ import annotations

import collections
import ctypes
import threading
import weakref

from hipsched.errors import GpuError
from hipsched.gpu.bindings.runtime import Runtime
from hipsched.gpu.bindings.status import classify

c_int, c_uint, c_size_t, c_float, c_void_p = (ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_float,
                                              ctypes.c_void_p)
P = ctypes.POINTER

NOT_READY = 600
INVALID_VALUE, INVALID_CONTEXT, INVALID_HANDLE, ILLEGAL_ADDRESS = 1, 201, 400, 700

# The CUDA driver's codes for the errors that matter to hipsched (status.classify reads their names);
# another error is picked by its GpuError kind below.
CUDA_NAMES = {
    1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
    200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT", 400: "CUDA_ERROR_INVALID_HANDLE",
    600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT", 719: "CUDA_ERROR_LAUNCH_FAILED", 999: "CUDA_ERROR_UNKNOWN",
}
# HIP's runtime uses the same numbers for these (hip_runtime_api.h's hipError_t)
HIP_NAMES = {
    1: "hipErrorInvalidValue", 2: "hipErrorOutOfMemory", 3: "hipErrorNotInitialized",
    200: "hipErrorInvalidImage", 201: "hipErrorInvalidContext", 400: "hipErrorInvalidHandle",
    600: "hipErrorNotReady", 700: "hipErrorIllegalAddress", 701: "hipErrorLaunchOutOfResources",
    702: "hipErrorLaunchTimeOut", 719: "hipErrorLaunchFailure", 999: "hipErrorUnknown",
}
_BY_KIND = {"oom": 2, "unavailable": 3, "compile": 200, "launch": 701, "timeout": 702, "lost": 700, "runtime": 1}
_BY_NAME = {"hipErrorNotReady": NOT_READY, "hipErrorInvalidValue": 1, "hipErrorOutOfMemory": 2,
            "hipErrorIllegalAddress": 700, "hipErrorInvalidHandle": 400}

# cuLaunchKernel(f, grid xyz, block xyz, sharedMemBytes, hStream, kernelParams, extra)
LAUNCH_T = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p,
                            P(c_void_p), P(c_void_p))
SIGNATURES = {
    "launch": LAUNCH_T,
    "malloc_async": ctypes.CFUNCTYPE(c_int, P(c_void_p), c_size_t, c_void_p),   # cuMemAllocAsync
    "free_async": ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p),                   # cuMemFreeAsync
    "memcpy_htod": ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p),
    "memcpy_dtoh": ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p),
    "event_create": ctypes.CFUNCTYPE(c_int, P(c_void_p), c_uint),
    "event_destroy": ctypes.CFUNCTYPE(c_int, c_void_p),
    "event_query": ctypes.CFUNCTYPE(c_int, c_void_p),
    "event_synchronize": ctypes.CFUNCTYPE(c_int, c_void_p),
    "event_record": ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p),
    "event_elapsed": ctypes.CFUNCTYPE(c_int, P(c_float), c_void_p, c_void_p),
    "stream_wait_event": ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_uint),
    "stream_synchronize": ctypes.CFUNCTYPE(c_int, c_void_p),
    "mem_info": ctypes.CFUNCTYPE(c_int, P(c_size_t), P(c_size_t)),
    "get_current": ctypes.CFUNCTYPE(c_int, P(c_void_p)),                        # cuCtxGetCurrent
    "set_current": ctypes.CFUNCTYPE(c_int, c_void_p),                           # cuCtxSetCurrent
    "host_alloc": ctypes.CFUNCTYPE(c_int, P(c_void_p), c_size_t),                # cuMemAllocHost_v2
    "host_free": ctypes.CFUNCTYPE(c_int, c_void_p),                             # cuMemFreeHost
}
assert set(SIGNATURES) == set(Runtime.C_ENTRY_POINTS) | {"get_current", "set_current", "host_alloc", "host_free"}
HIP_SIGNATURES = dict(SIGNATURES, **{
    "get_current": ctypes.CFUNCTYPE(c_int, P(c_int)),                           # hipGetDevice
    "set_current": ctypes.CFUNCTYPE(c_int, c_int),                              # hipSetDevice
    "host_alloc": ctypes.CFUNCTYPE(c_int, P(c_void_p), c_size_t, c_uint),       # hipHostMalloc
})


def error_code(e: BaseException) -> int:
    """The CUDA-like code a callback returns for `e`: by the GpuError's name where it has a code of its
    own, else by its kind; 1 (invalid value) for anything that is not a GpuError."""
    if not isinstance(e, GpuError):
        return 1
    code = _BY_NAME.get(e.name or "")
    if code is None and e.name:
        code = _BY_KIND.get(classify(e.name))
    return code if code is not None else _BY_KIND.get(e.kind, 1)


class _State:
    """What attach() keeps on the runtime: the callbacks (never freed: see attach), the thread-local
    current context, call counts, scripted failures and the exceptions callbacks turned into codes."""

    def __init__(self, rt, vendor):
        self.vendor = vendor
        # one context per device: nonzero, distinct per runtime and device, never a real pointer
        self.contexts = [(id(rt) << 8) | (d << 4) | 0xC for d in range(rt.device_count())]
        self.tls = threading.local()
        self.calls = collections.Counter()
        self.fail = collections.defaultdict(collections.deque)   # name -> codes to return, in order
        self.errors = []                                         # (name, exception) of failed calls
        self.lock = threading.Lock()
        self.callbacks = {}
        self.pinned = {}                                         # page-locked host memory: address -> bytes
        self.table = {}

    def entry_points(self, device):
        """What Runtime.c_entry_points gives for `device`: (table, vendor, context, device)."""
        return dict(self.table), self.vendor, self.contexts[device] if self.vendor == "cuda" else 0, device

    def current_device(self):
        """The calling thread's current device, or None (CUDA: no context made current yet). A HIP
        thread starts on device 0, a CUDA thread with no context."""
        if self.vendor == "hip":
            return getattr(self.tls, "device", 0)
        ctx = getattr(self.tls, "context", None)
        return self.contexts.index(ctx) if ctx in self.contexts else None


def _launch_args(rt, function, params):
    """The launch's arguments as fresh ctypes scalars, read now from the caller's kernelParams."""
    types = rt.param_types(function)
    return tuple(t(t.from_address(params[i]).value) for i, t in enumerate(types))


def attach(rt, vendor: str = "cuda"):
    """Give `rt` (an EmuRuntime) C entry points, CUDA's or HIP's (`vendor`); returns the table
    {name: address}. Its for_device views get their device's (EmuRuntime.c_entry_points)."""
    if vendor not in ("cuda", "hip"):
        raise ValueError(vendor)
    got = rt.__dict__.get("_c_driver", None)
    if got is not None:
        raise RuntimeError("emu_c_driver.attach: this runtime already has a Driver; attach before anything "
                           "asks driver_for(rt)")
    rt.__dict__.pop("_c_driver", None)   # an earlier "no C entry points" answer
    st = _State(rt, vendor)
    signatures = SIGNATURES if vendor == "cuda" else HIP_SIGNATURES
    # The callbacks reach the runtime weakly and are never freed: the Driver calls them from its
    # finalizer (and DeviceMemory from theirs), which the collector may run after the runtime and this
    # state are gone, and a freed ctypes thunk is a jump into freed memory. A call after the runtime
    # went fails with CUDA_ERROR_NOT_INITIALIZED.
    ref = weakref.ref(rt)
    del rt

    def guarded(name, body):
        def cb(*a):
            rt = ref()
            if rt is None:
                return 3
            try:
                with st.lock:
                    st.calls[name] += 1
                    scripted = st.fail[name].popleft() if st.fail[name] else None
                if scripted is not None:
                    return scripted
                if name not in ("get_current", "set_current") and st.current_device() is None:
                    return INVALID_CONTEXT
                return body(rt, *a) or 0
            except BaseException as e:   # never through C: a code, and the exception kept for the test
                try:
                    st.errors.append((name, e.with_traceback(None)))   # its frames would hold the runtime
                    return error_code(e)
                except BaseException:
                    return 999
        cb.__name__ = f"emu_c_{name}"
        return signatures[name](cb)

    def refused_stream(rt, stream):
        """INVALID_HANDLE for a destroyed stream or another device's, else 0."""
        stream = stream or 0
        if stream in rt._destroyed:
            return INVALID_HANDLE
        made_on = rt._stream_device.get(stream)
        return INVALID_HANDLE if made_on is not None and made_on != st.current_device() else 0

    def launch(rt, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        here = st.current_device()
        if rt._fn_device.get(f, here) != here:
            return INVALID_HANDLE   # a function of a module another device's context loaded
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        args = _launch_args(rt, f, params)
        for a in args:
            if isinstance(a, ctypes.c_void_p) and a.value and rt.device_of(a.value) not in (None, here):
                return ILLEGAL_ADDRESS
        rt.launch(f, (gx, gy, gz), (bx, by, bz), args, shared, stream or 0)

    def malloc_async(rt, out, nbytes, stream):
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        ptr = rt.malloc_async(nbytes, stream or 0)
        with rt._lock:
            rt._owner[ptr] = st.current_device()   # the root runtime made it: the current device owns it
        out[0] = ptr

    def free_async(rt, ptr, stream):
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        if ptr and rt.device_of(ptr) not in (None, st.current_device()):
            return INVALID_VALUE
        rt.free_async(ptr or 0, stream or 0)

    def memcpy_htod(rt, dst, src, nbytes, stream):
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        if any(p <= (src or 0) < p + n for p, n in list(st.pinned.items())):
            # from page-locked memory a driver reads the source when the copy runs, not when it is
            # queued (the emulator's own copy stages pageable memory at once): a buffer written again
            # before the copy ran would send the new bytes
            def run():
                ctypes.memmove(dst, src, nbytes)
            rt.enqueue(stream or 0, run, "memcpy_htod from page-locked memory")
            return
        rt.memcpy_htod(dst or 0, src or 0, nbytes, stream or 0)

    def memcpy_dtoh(rt, dst, src, nbytes, stream):
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        rt.memcpy_dtoh(dst or 0, src or 0, nbytes, stream or 0)

    def event_create(rt, out, flags):
        out[0] = rt.event_create()

    def event_destroy(rt, event):
        rt.event_destroy(event or 0)

    def event_query(rt, event):
        return 0 if rt.event_query(event or 0) else NOT_READY

    def event_synchronize(rt, event):
        rt.event_synchronize(event or 0)

    def event_record(rt, event, stream):
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        rt.event_record(event or 0, stream or 0)

    def event_elapsed(rt, ms, start, end):
        ms[0] = float(rt.event_elapsed_ms(start or 0, end or 0))

    def stream_wait_event(rt, stream, event, flags):
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        rt.stream_wait_event(stream or 0, event or 0)

    def stream_synchronize(rt, stream):
        refused = refused_stream(rt, stream)
        if refused:
            return refused
        rt.stream_synchronize(stream or 0)

    def mem_info(rt, free, total):
        f, t = rt.mem_info()
        free[0], total[0] = f, t

    def get_current(rt, out):
        if vendor == "hip":
            out[0] = getattr(st.tls, "device", 0)
        else:
            out[0] = getattr(st.tls, "context", None)

    def set_current(rt, context):
        if vendor == "hip":
            if not 0 <= context < len(st.contexts):
                return 101   # hipErrorInvalidDevice
            st.tls.device = context
        elif context and context not in st.contexts:
            return INVALID_CONTEXT
        else:
            st.tls.context = context

    # page-locked staging is plain host memory here (the emulator's copies read any host pointer)
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = c_void_p, [c_size_t]
    libc.free.restype, libc.free.argtypes = None, [c_void_p]

    def host_alloc(rt, out, nbytes, flags=0):
        out[0] = libc.malloc(max(int(nbytes), 1))
        if not out[0]:
            return 2
        st.pinned[out[0]] = max(int(nbytes), 1)

    def host_free(rt, ptr):
        st.pinned.pop(ptr, None)
        libc.free(ptr)

    bodies = dict(launch=launch, malloc_async=malloc_async, free_async=free_async, memcpy_htod=memcpy_htod,
                  memcpy_dtoh=memcpy_dtoh, event_create=event_create, event_destroy=event_destroy,
                  event_query=event_query, event_synchronize=event_synchronize, event_record=event_record,
                  event_elapsed=event_elapsed, stream_wait_event=stream_wait_event,
                  stream_synchronize=stream_synchronize, mem_info=mem_info, get_current=get_current,
                  set_current=set_current, host_alloc=host_alloc, host_free=host_free)
    for name, body in bodies.items():
        cb = st.callbacks[name] = guarded(name, body)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(cb))   # immortal: see above
        st.table[name] = ctypes.cast(cb, c_void_p).value
    rt = ref()
    rt._emu_c = st   # EmuRuntime.c_entry_points reads it, for each view's device
    names = CUDA_NAMES if vendor == "cuda" else HIP_NAMES
    rt._error_name = names.get
    return dict(st.table)


def calls(rt) -> collections.Counter:
    """How often each entry point was called (a live Counter: copy it to compare later)."""
    return rt._emu_c.calls


def fail_next(rt, name: str, code: int = 1, times: int = 1, after: int = 0) -> None:
    """After `after` calls that go through, the next `times` calls of entry point `name` return `code`
    without reaching the emulator."""
    if name not in SIGNATURES:
        raise KeyError(name)
    with rt._emu_c.lock:
        rt._emu_c.fail[name].extend([None] * after + [code] * times)


def take_errors(rt) -> list:
    """(entry point, exception) of the calls that failed in the emulator since the last take, cleared."""
    st = rt._emu_c
    errors, st.errors = st.errors, []
    return errors
