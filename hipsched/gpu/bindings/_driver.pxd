# The driver entry points the compiled GPU call path uses, as C function pointers resolved once from the
# library the ctypes binding already loaded (hipsched/gpu/bindings/ctypes_api.py). HIP's module API mirrors the
# CUDA driver API argument for argument, so one table serves both; only "make this device current"
# differs (a context on CUDA, a device index on HIP).

ctypedef int (*fn_launch_t)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shared, void *stream, void **params, void **extra) noexcept nogil
ctypedef int (*fn_alloc_async_t)(void **ptr, size_t nbytes, void *stream) noexcept nogil
ctypedef int (*fn_free_async_t)(void *ptr, void *stream) noexcept nogil
ctypedef int (*fn_memcpy_t)(void *dst, void *src, size_t nbytes, void *stream) noexcept nogil
ctypedef int (*fn_event_create_t)(void **event, unsigned flags) noexcept nogil
ctypedef int (*fn_event_t)(void *event) noexcept nogil
ctypedef int (*fn_event_record_t)(void *event, void *stream) noexcept nogil
ctypedef int (*fn_event_elapsed_t)(float *ms, void *start, void *end) noexcept nogil
ctypedef int (*fn_stream_wait_t)(void *stream, void *event, unsigned flags) noexcept nogil
ctypedef int (*fn_stream_t)(void *stream) noexcept nogil
ctypedef int (*fn_mem_info_t)(size_t *free, size_t *total) noexcept nogil
ctypedef int (*fn_get_ctx_t)(void **ctx) noexcept nogil
ctypedef int (*fn_set_ctx_t)(void *ctx) noexcept nogil
ctypedef int (*fn_get_device_t)(int *device) noexcept nogil
ctypedef int (*fn_set_device_t)(int device) noexcept nogil
ctypedef int (*fn_host_alloc_t)(void **ptr, size_t nbytes) noexcept nogil
ctypedef int (*fn_host_alloc_flags_t)(void **ptr, size_t nbytes, unsigned flags) noexcept nogil
ctypedef int (*fn_host_free_t)(void *ptr) noexcept nogil

cdef enum:
    NOT_READY = 600        # hipErrorNotReady == CUDA_ERROR_NOT_READY
    EVENT_POOL = 256       # spare events kept per driver view


cdef class Driver:
    cdef fn_launch_t launch
    cdef fn_alloc_async_t alloc_async
    cdef fn_free_async_t free_async
    cdef fn_memcpy_t htod, dtoh
    cdef fn_event_create_t event_create
    cdef fn_event_t event_destroy, event_query, event_sync
    cdef fn_event_record_t event_record
    cdef fn_event_elapsed_t event_elapsed
    cdef fn_stream_wait_t stream_wait
    cdef fn_stream_t stream_sync
    cdef fn_mem_info_t mem_info
    cdef fn_get_ctx_t get_ctx
    cdef fn_set_ctx_t set_ctx
    cdef fn_get_device_t get_device
    cdef fn_set_device_t set_device
    cdef fn_host_alloc_t host_alloc_cuda
    cdef fn_host_alloc_flags_t host_alloc_hip
    cdef fn_host_free_t host_free
    cdef readonly bint has_host    # page-locked staging can be made (host_alloc/host_free given)
    cdef bint cuda
    cdef void *context     # CUDA: the device's primary context
    cdef int device        # HIP: the device index
    cdef int fork_gen      # the process image this table was made in
    cdef void *events[EVENT_POOL]
    cdef int nevents
    cdef readonly object runtime   # the Python binding: error names, and everything off the fast path
    cdef readonly str vendor

    cdef bint usable(self) noexcept nogil
    cdef int current(self) noexcept nogil
    cdef void *event(self) noexcept nogil
    cdef void spare(self, void *event) noexcept nogil
    cdef int order_after(self, void *producer, void *consumer) noexcept nogil
    cdef int alloc_host(self, void **ptr, size_t nbytes) noexcept nogil
    cdef object fail(self, int status, str what)


cdef int fork_generation() noexcept nogil


cdef class DeviceMemory:
    cdef readonly size_t ptr
    cdef readonly size_t nbytes
    cdef public list streams
    cdef readonly object runtime
    cdef object drv            # its Driver, or None: freed through the runtime's Python methods


cdef DeviceMemory adopt(Driver drv, void *ptr, size_t nbytes, size_t stream)
