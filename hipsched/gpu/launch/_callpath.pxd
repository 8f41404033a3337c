# The compiled GPU call path: a call's device arguments read in C, and replayable launch plans
# (hipsched/gpu/launch/_callpath.pyx). hipsched._dispatch cimports it.
from hipsched.gpu.bindings._driver cimport Driver

cdef enum:
    MAX_INPUTS = 8         # device arrays one call may pass to the compiled path
    MAX_OUTPUTS = 8
    MAX_SLOTS = 128        # kernel parameters of all of a plan's launches together
    MAX_LAUNCHES = 32
    NO_STREAM = -1
    STAGE_MAX = 1 << 20    # a host array the compiled path stages (larger ones may be kept resident: the glue)

ctypedef struct Inputs:
    int n
    size_t ptr[MAX_INPUTS]
    size_t nbytes[MAX_INPUTS]
    long long producer[MAX_INPUTS]   # the stream it was last written on (NO_STREAM: complete)
    int host[MAX_INPUTS]             # a host array, staged up for the call

ctypedef struct LaunchSpec:
    void *fn
    unsigned grid[3]
    unsigned block[3]
    unsigned shared
    int first                        # its parameters: slots [first, first + count)
    int count

ctypedef struct Patch:                # a pointer parameter, set per call
    int slot
    int kind                         # 0 an input, 1 an output, 2 the scratch block
    int index
    long long delta                  # bytes into that buffer


cdef class Plan:
    cdef int nin, nout, nlaunch, nslots, npatch
    cdef size_t out_bytes[MAX_OUTPUTS]
    cdef size_t scratch_bytes
    cdef LaunchSpec launches[MAX_LAUNCHES]
    cdef unsigned long long slots[MAX_SLOTS]
    cdef Patch patches[MAX_SLOTS]
    cdef tuple results               # ((output, delta, shape, dtype, strides, staged offset, bytes), ...),
                                     # in the result's order
    cdef bint single                 # the result is one array, not a tuple
    cdef bint to_host                # results are copied to host arrays (no device input)
    cdef int nhost                   # host inputs, staged up
    cdef size_t in_off[MAX_INPUTS]   # where each host input sits in the staging buffer and its device copy
    cdef size_t staged_in            # bytes of host inputs staged (256-byte aligned parts)
    cdef size_t staged_out           # bytes of results staged down
    cdef readonly long long device_bytes   # what a run allocates: outputs and scratch


cdef class GpuPath:
    cdef Driver drv                  # None: the runtime has no C entry points (plans are not replayed)
    cdef public bint enabled
    cdef readonly object runtime
    cdef int device_type, device_index
    cdef object device               # (DLPack device type, index) of the results
    cdef list held                   # [(event address, inputs)] of calls whose work may still read them
    cdef object tls                  # per thread: the recording a general-path call asked for
    cdef long long free_at_ns
    cdef double free_bytes_cached
    cdef list spare_events           # events of a runtime without C entry points, for reuse
    cdef object timings              # deque of (ticket, start mark, end mark) of timed glue runs
    cdef object timings_lock
    cdef long long next_ticket

    cdef object read_args(self, str op, tuple args, dict kwargs, size_t reader, Inputs *ins, list keep)
    cdef object _part(self, a, size_t reader, Inputs *ins, list keep)
    cdef object _device_array(self, a, Inputs *ins, list keep)
    cdef object _dlpack(self, a, t, size_t reader, Inputs *ins, list keep)
    cdef size_t _event(self) noexcept
    cdef int _record(self, size_t e, size_t stream) noexcept
    cdef int _query(self, size_t e, bint wait) noexcept
    cdef int _elapsed(self, float *ms, size_t start, size_t end) noexcept
    cdef void _spare(self, size_t e) noexcept
    cdef int _stream_sync(self, size_t stream) noexcept
    cdef int _current(self) noexcept
    cdef void _hold(self, list keep, size_t stream)
    cdef void _reap(self, bint wait_oldest)
    cdef object _host_array(self, a, Inputs *ins)
    cdef void *_staging(self, size_t nbytes) except? NULL
    cdef object _download(self, Plan plan, void **outp, void *stage, size_t stream)
    cdef void _mark_busy(self, void *stage, size_t stream)
    cdef object replay(self, Plan plan, Inputs *ins, list keep, size_t stream)
    cdef double _read_free(self) except -1.0
    cdef double free_bytes(self)
    cdef void *time_mark(self, size_t stream) noexcept
    cdef double elapsed_us(self, void *start, void *end) noexcept
    cdef void release_event(self, void *event) noexcept
