# The telemetry's per-call record, compiled: the dispatcher (hipsched._sched) calls it through C.

cdef class Recorder:
    cdef public bint enabled
    cdef list ring               # the most recent events, a circular list of `cap` entries (None: empty)
    cdef Py_ssize_t cap, pos, count
    cdef object queue            # the JSONL writer's queue (a deque), or None
    cdef object queue_append
    cdef Py_ssize_t queue_size
    cdef object drops            # the writer's drop counter (itertools.count), or None
    cdef long long seq
    cdef dict cells              # (op, backend) -> [count, time_us, fallbacks], shared with store.Counters
    cdef object last_op, last_backend, last_cell   # the cell of the previous record's (op, backend)
    cdef object add_error        # Counters.add_error, for the rare fallback
    cdef object scope_var        # the ContextVar of the current scope
    cdef long long anchor_mono   # a reading of the monotonic clock (ns) and of the wall clock (s) taken
    cdef double anchor_wall      # together: record_ended's events' wall times count from them

    cpdef record(self, op, backend, reason, size, dtype, nbytes, duration_us, pred_cpu_us, pred_gpu_us,
                 stream=*, fallback=*, detail=*, resident=*, split=*, gpu_device=*)
    cdef object record_ended(self, long long end_ns, op, backend, reason, size, dtype, nbytes, duration_us,
                             pred_cpu_us, pred_gpu_us, stream, detail)
    cdef object _put(self, double wall, op, backend, reason, size, dtype, nbytes, duration_us, pred_cpu_us,
                     pred_gpu_us, stream, fallback, detail, resident, split, gpu_device)
