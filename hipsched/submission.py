"""Calls submitted without waiting: `Executor.submit` and each op method's `wait=False` return a
`concurrent.futures.Future` (so `as_completed`, `wait` and asyncio's `wrap_future` work), and
`Executor.batch()` places a block of calls together (docs/design/scheduling.md, "Under load").

A submitted call runs on one of the executor's submission threads, through the same dispatch path as a
call that waits (a call on device data whose inputs are ready is dispatched on the caller's thread: a
GPU run of device data leaves its work queued and returns at once): its decision counts the work already
committed to each side (SchedCore's backlog), so calls submitted together spread over the CPU and the
GPU. A Future (or a device result) passed as an input is a dependency: the call is queued once its
inputs are ready, and an input produced on the GPU (a device array) is passed on as it is, so a chain on
device data never copies its intermediates to the host; `.result()` gives what the call that waits would
have returned. A cancelled call that has not started never runs; a failed input fails its dependants
with the op and the argument named.

A batch is planned and run by hipsched/batch.py."""
from __future__ import annotations

import concurrent.futures as cf
import contextvars
import threading
import time
import weakref

import numpy as np

from .dlpack_devices import GPU_DEVICE_TYPES, dlpack_device, is_device_array
from .errors import HipschedError

# Threads that run submitted calls: two per side (one running, one deciding and waiting for the side),
# so each side has its next call ready; more would only add calls contending for the same side.
THREADS_PER_SIDE = 2

# the batch whose block is open here: a context variable, so that a block held across an await collects
# only its own coroutine's calls (a thread-local would take every coroutine's on that thread)
current_batch = contextvars.ContextVar("hipsched_batch", default=None)


class SubmittedCallError(HipschedError):
    """A submitted call could not run because one of its inputs failed or was cancelled."""


def _futures_in(args, kwargs):
    """[(argument name, Future)] among a call's inputs (positional ones named by index)."""
    found = [(f"argument {i}", a) for i, a in enumerate(args) if isinstance(a, cf.Future)]
    found += [(f"argument {k!r}", v) for k, v in kwargs.items() if isinstance(v, cf.Future)]
    return found


def _resolved(args, kwargs, raw=False):
    """(args, kwargs) with each Future replaced by its result; `raw`: a batch call's result as it was
    made (a device array where the batch kept it on the GPU), for the batch's own calls."""
    if raw:
        return (tuple(_raw_result(a) if isinstance(a, cf.Future) else a for a in args),
                {k: (_raw_result(v) if isinstance(v, cf.Future) else v) for k, v in kwargs.items()})
    return (tuple(a.result() if isinstance(a, cf.Future) else a for a in args),
            {k: (v.result() if isinstance(v, cf.Future) else v) for k, v in kwargs.items()})


def _raw_result(f):
    return f.raw_result() if isinstance(f, _BatchFuture) else f.result()


def _to_host(x):
    """x with each device array among it (a tuple's too) copied to a host array."""
    if isinstance(x, tuple):
        return tuple(_to_host(a) for a in x)
    if not isinstance(x, np.ndarray) and _on_device(x) and hasattr(x, "get"):
        return x.get()
    return x


class _BatchFuture(cf.Future):
    """A batch call's Future. A chain of host data that the batch kept on the GPU passes device arrays
    from call to call; `result()` gives the caller what the call that waits would have given, a host
    array (copied once, when first asked for), and the batch's own calls take the device array
    (raw_result)."""

    def __init__(self):
        super().__init__()
        self.to_host = False
        self._host = None
        self.batch = None   # the Batch it belongs to (set when it joins one)

    def _not_inside_its_block(self):
        # the batch starts its calls when its block ends: waiting for one inside the block, on the thread
        # that holds it open, would wait forever
        b = self.batch
        if b is not None and not b.started and current_batch.get() is b:
            raise HipschedError("a batch's call has no result inside its `with ex.batch()` block: the "
                                "batch starts its calls when the block ends")

    def raw_result(self, timeout=None):
        self._not_inside_its_block()
        return super().result(timeout)

    def exception(self, timeout=None):
        self._not_inside_its_block()
        return super().exception(timeout)

    def result(self, timeout=None):
        self._not_inside_its_block()
        out = super().result(timeout)
        if not self.to_host:
            return out
        with self._condition:
            if self._host is None:
                self._host = (_to_host(out),)
            return self._host[0]


def _on_device(a) -> bool:
    # the DLPack device first: is_device_array's __cuda_array_interface__ builds a dict on every read
    if isinstance(a, (int, float, str, np.ndarray)) or a is None:
        return False
    dev = dlpack_device(a)
    return dev[0] in GPU_DEVICE_TYPES if dev is not None else is_device_array(a)


def _ready_on_device(args, kwargs):
    """(args, kwargs) with each Future replaced by its result, when every Future among them is done and
    succeeded and some input is a device array; else None."""
    device = False
    futures = False
    for a in (*args, *kwargs.values()):
        if isinstance(a, cf.Future):
            if not a.done() or a.cancelled() or a.exception() is not None:
                return None
            futures = True
            a = a.result()
        if not device and _on_device(a):
            device = True
    if not device:
        return None
    return _resolved(args, kwargs) if futures else (args, kwargs)


class _Pending:
    """One submitted call: what to run, its future, and the context (telemetry scope) it was made in."""
    __slots__ = ("op", "backend", "stream", "split", "args", "kwargs", "future", "context", "submitted_ns")

    def __init__(self, op, backend, stream, split, args, kwargs, future=cf.Future):
        self.op, self.backend, self.stream, self.split = op, backend, stream, split
        self.args, self.kwargs = args, kwargs
        self.future = future()
        self.context = contextvars.copy_context()
        self.submitted_ns = time.perf_counter_ns()


class Submitter:
    """The submission threads of one Executor (started on the first submitted call), and the calls
    submitted and not yet done, which close() waits for."""

    def __init__(self, executor, sides: int):
        self._ex = executor
        self._threads = max(2, THREADS_PER_SIDE * sides)
        self._pool = None
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._outstanding = 0            # calls submitted (not inline) whose futures are not done
        self._waiting = {}               # id(call) -> call, for calls waiting for their inputs
        self._ours = weakref.WeakSet()   # the futures of those calls (a dependency on one of them is ours)
        self._closed = False

    def _pool_now(self):
        with self._lock:
            if self._pool is None and self._closed and not self._outstanding:
                return None
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self._threads, thread_name_prefix="hipsched-submit")
            return self._pool

    def _track(self, call):
        with self._lock:
            if self._closed:
                raise HipschedError(f"{call.op}: the executor is closed")
            self._outstanding += 1
            self._ours.add(call.future)
        call.future.add_done_callback(self._untrack)

    def _untrack(self, _):
        with self._lock:
            self._outstanding -= 1
            self._done.notify_all()

    def submit(self, op, backend, stream, split, args, kwargs, batch=None) -> cf.Future:
        """`batch`: the Batch the call joins (b.submit's own); else the one whose block is open here, if
        it is this submitter's and has not started."""
        if batch is None:
            batch = current_batch.get()
            if batch is not None and batch.started:
                batch = None
        if self._closed:
            raise HipschedError(f"{op}: the executor is closed")
        if backend != "cpu" and (batch is None or batch.submitter is not self):
            ready = _ready_on_device(args, kwargs)
            if ready is not None:
                # device data with every input ready: a GPU run leaves its work queued on the stream and
                # returns at once, so the call is dispatched here, without a thread hand-off (a device
                # chain costs about what its calls that wait cost), and the Future is done while the device
                # may still be working; a decision for the CPU (copies down and back) waits here. (Nobody
                # else holds the Future yet: nothing can cancel it.)
                fut = cf.Future()
                try:
                    run = self._ex._run_whole if split is False else self._ex._run
                    fut.set_result(run(op, backend, stream, *ready[0], **ready[1]))
                except BaseException as e:  # the caller sees it from .result(), as with any submitted call
                    fut.set_exception(e)
                return fut
        mine = batch is not None and batch.submitter is self
        call = _Pending(op, backend, stream, split, args, kwargs, _BatchFuture if mine else cf.Future)
        if mine:
            with batch.lock:
                if batch.started:   # (b.submit from another thread as the block ended)
                    raise HipschedError(f"{op}: the batch has started: submit to a new one, or to the executor")
                call.future.batch = batch
                self._track(call)
                batch.calls.append(call)
            return call.future
        self._track(call)
        self._when_ready(call)
        return call.future

    def _start(self, call):
        pool = self._pool_now()
        if pool is not None:   # (None: closed, and every call left was cancelled at close)
            pool.submit(self._run, call)

    def _when_ready(self, call):
        """Queues the call once every Future among its inputs is done (at once when none is); an input
        that failed fails the call instead, naming it."""
        deps = _futures_in(call.args, call.kwargs)
        if not deps:
            self._start(call)
            return
        left = [len(deps)]
        lock = threading.Lock()
        with self._lock:
            self._waiting[id(call)] = call

        def one_done(_):
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            with self._lock:
                self._waiting.pop(id(call), None)
            err = _input_error(call)
            if err is not None:
                if call.future.set_running_or_notify_cancel():
                    call.future.set_exception(err)
                return
            self._start(call)
        for _, dep in deps:
            dep.add_done_callback(one_done)

    def _run(self, call, backend=None, scope=None, planned=False, keep=False):
        """Runs one call on this thread (a call cancelled before it started does not run). `planned`: a
        call of a batch's graph, which takes the batch's results as they were made (device arrays where
        the batch kept them on the GPU); `keep`: its host inputs are uploaded first, so that its result
        stays on the device for the calls after it."""
        try:
            if not call.future.set_running_or_notify_cancel():
                return
        except RuntimeError:   # already running or done (failed with the rest of its batch): not again
            return
        try:
            args, kwargs = _resolved(call.args, call.kwargs, raw=planned)
            if planned and any(isinstance(f, _BatchFuture) and f.to_host for _, f in _futures_in(call.args, call.kwargs)):
                # an input the batch kept on the GPU is a device array, which not every op takes where the
                # call that waits takes a host array (a device input of another dtype than the rest, a
                # host-only argument): such a call takes the host copies, as it would have
                try:
                    self._ex._prepare[call.op](*args, **kwargs)
                except Exception:
                    args, kwargs = _resolved(call.args, call.kwargs)
            run = self._ex._run_whole if call.split is False else self._ex._run
            b = call.backend if backend is None else backend
            # each submission thread's GPU work on a stream of its own: independent calls' copies and
            # kernels overlap (a call given a stream keeps it; one forced onto the CPU needs none)
            stream = call.stream if call.stream is not None or b == "cpu" else self._ex._thread_stream()
            if keep:
                args, kwargs = self._uploaded(call.op, args, kwargs, stream)
            if scope is None:
                out = call.context.run(run, call.op, b, stream, *args, **kwargs)
            else:
                out = call.context.run(self._scoped, scope, run, call.op, b, stream, args, kwargs)
        except BaseException as e:  # the caller sees it from .result(), as the call would have raised it
            call.future.set_exception(e)
        else:
            call.future.set_result(out)

    def _uploaded(self, op, args, kwargs, stream):
        """(args, kwargs) with their float host arrays replaced by device copies, where the backend can
        make them and the op takes them so (its preparation on the copies succeeds); else as they were."""
        gpu = self._ex._gpu

        def up(a):
            if type(a) is np.ndarray and (a.dtype.kind == "f" or a.dtype.name == "bfloat16"):
                d = gpu.upload(a, stream)
                if d is None:
                    raise LookupError("no device copy")
                return d
            return a
        try:
            dargs = tuple(up(a) for a in args)
            dkwargs = {k: up(v) for k, v in kwargs.items()}
            self._ex._prepare[op](*dargs, **dkwargs)
        except Exception:   # an op that refuses a device array there (CSR parts, positions): as it was
            return args, kwargs
        return dargs, dkwargs

    def _scoped(self, tags, run, op, backend, stream, args, kwargs):
        with self._ex.scope("batch", **tags):
            return run(op, backend, stream, *args, **kwargs)

    def close(self):
        """Takes no more calls and waits for the submitted ones: a call waiting for an input that is not
        one of them (a Future the caller made) is cancelled, since nothing here will finish it; the rest,
        their dependants included, run to the end."""
        with self._lock:
            self._closed = True
            stuck = [c for c in self._waiting.values()
                     if any(not f.done() and f not in self._ours for _, f in _futures_in(c.args, c.kwargs))]
        for c in stuck:
            c.future.cancel()
        with self._lock:
            self._done.wait_for(lambda: self._outstanding == 0)
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _input_error(call):
    """The SubmittedCallError of a call whose input failed or was cancelled (naming the op and the
    argument), or None."""
    for name, dep in _futures_in(call.args, call.kwargs):
        err = "was cancelled" if dep.cancelled() else None
        if err is None and dep.exception() is not None:
            err = f"failed: {type(dep.exception()).__name__}: {dep.exception()}"
        if err is not None:
            e = SubmittedCallError(f"{call.op}: its input {name} {err}")
            e.__cause__ = None if dep.cancelled() else dep.exception()
            return e
    return None
