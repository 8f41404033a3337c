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

A batch collects its calls and, when its block ends, places its independent calls together (`place`:
each side takes the calls it is relatively best at, by their predicted times with copies counted,
balanced so that both sides end together), then runs them with a thread per side, each taking the calls
in the plan's order as it becomes free, so that predictions that were off move the calls in the middle
to the side that runs ahead. A call whose inputs are other calls of the batch cannot be measured before
they have run: it is decided by the backlog rule when its inputs are ready (the batch is not planned as
a graph: HEFT's ranks would need the times of calls whose sizes are not known yet). Each call's
telemetry event carries the plan (its scope's tags: the batch, the side it was planned on and when,
and what it waited for)."""
from __future__ import annotations

import collections
import concurrent.futures as cf
import contextvars
import itertools
import threading
import time
import weakref

import numpy as np

from . import _sched
from .dlpack_devices import GPU_DEVICE_TYPES, dlpack_device, is_device_array
from .errors import HipschedError

# Threads that run submitted calls: two per side (one running, one deciding and waiting for the side),
# so each side has its next call ready; more would only add calls contending for the same side.
THREADS_PER_SIDE = 2

_batch_ids = itertools.count(1)
_local = threading.local()


class SubmittedCallError(HipschedError):
    """A submitted call could not run because one of its inputs failed or was cancelled."""


def _futures_in(args, kwargs):
    """[(argument name, Future)] among a call's inputs (positional ones named by index)."""
    found = [(f"argument {i}", a) for i, a in enumerate(args) if isinstance(a, cf.Future)]
    found += [(f"argument {k!r}", v) for k, v in kwargs.items() if isinstance(v, cf.Future)]
    return found


def _resolved(args, kwargs):
    return (tuple(a.result() if isinstance(a, cf.Future) else a for a in args),
            {k: (v.result() if isinstance(v, cf.Future) else v) for k, v in kwargs.items()})


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

    def __init__(self, op, backend, stream, split, args, kwargs):
        self.op, self.backend, self.stream, self.split = op, backend, stream, split
        self.args, self.kwargs = args, kwargs
        self.future = cf.Future()
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

    def submit(self, op, backend, stream, split, args, kwargs) -> cf.Future:
        batch = getattr(_local, "batch", None)
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
        call = _Pending(op, backend, stream, split, args, kwargs)
        self._track(call)
        if batch is not None and batch.submitter is self:
            batch.calls.append(call)
            return call.future
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
            for name, dep in deps:
                err = "was cancelled" if dep.cancelled() else None
                if err is None and dep.exception() is not None:
                    err = f"failed: {type(dep.exception()).__name__}: {dep.exception()}"
                if err is not None:
                    if call.future.set_running_or_notify_cancel():
                        e = SubmittedCallError(f"{call.op}: its input {name} {err}")
                        e.__cause__ = None if dep.cancelled() else dep.exception()
                        call.future.set_exception(e)
                    return
            self._start(call)
        for _, dep in deps:
            dep.add_done_callback(one_done)

    def _run(self, call, backend=None, scope=None):
        """Runs one call on this thread (a call cancelled before it started does not run)."""
        if not call.future.set_running_or_notify_cancel():
            return
        try:
            args, kwargs = _resolved(call.args, call.kwargs)
            run = self._ex._run_whole if call.split is False else self._ex._run
            b = call.backend if backend is None else backend
            # each submission thread's GPU work on a stream of its own: independent calls' copies and
            # kernels overlap (a call given a stream keeps it; one forced onto the CPU needs none)
            stream = call.stream if call.stream is not None or b == "cpu" else self._ex._thread_stream()
            if scope is None:
                out = call.context.run(run, call.op, b, stream, *args, **kwargs)
            else:
                out = call.context.run(self._scoped, scope, run, call.op, b, stream, args, kwargs)
        except BaseException as e:  # the caller sees it from .result(), as the call would have raised it
            call.future.set_exception(e)
        else:
            call.future.set_result(out)

    def _scoped(self, tags, run, op, backend, stream, args, kwargs):
        with self._ex.scope("batch", **tags):
            return run(op, backend, stream, *args, **kwargs)

    def batch(self):
        return Batch(self)

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


class Batch:
    """`with ex.batch() as b:` collects the calls submitted on this thread (ex.submit, an op's
    wait=False, or b.submit) and places and starts them when the block ends. `b.plan` is then
    [(call index, op, side, predicted start us, predicted finish us)] in the plan's order (the run
    follows its order, and moves the calls in the middle to the side that runs ahead: the events say
    where each ran, and where it was planned)."""

    def __init__(self, submitter):
        self.submitter = submitter
        self.calls = []
        self.plan = []
        self.id = next(_batch_ids)
        self._outer = None

    def submit(self, op, *args, backend="auto", stream=None, split=None, **kwargs):
        return self.submitter._ex.submit(op, *args, backend=backend, stream=stream, split=split, **kwargs)

    def __enter__(self):
        self._outer = getattr(_local, "batch", None)
        _local.batch = self
        return self

    def __exit__(self, exc_type, exc, tb):
        _local.batch = self._outer
        if exc_type is not None:
            for c in self.calls:
                c.future.cancel()
            return False
        self._start()
        return False

    def results(self, timeout=None):
        """Every call's result, in submission order (waits for them)."""
        return [c.future.result(timeout) for c in self.calls]

    # ------------------------------------------------------------------ planning
    def _costs(self, call):
        """(cpu us, gpu us or None): the call's predicted time on each side it may run on, its copies
        counted (the decision core's predictions for the call as it would be decided now)."""
        ex = self.submitter._ex
        spec_prepare = ex._prepare[call.op]
        prepared = spec_prepare(*call.args, **call.kwargs)
        be, reason, pc, pg, _ = ex._fast.decide_call(prepared, call.backend)
        if call.backend == "auto":
            gpu_ok = _REASONS[reason] not in _CPU_ONLY_REASONS
            cpu_ok = True
        else:   # what was asked for, or the CPU where the GPU cannot take it
            gpu_ok = be == _sched.BACKEND_GPU
            cpu_ok = not gpu_ok
        known = [t for t in (pc, pg) if t == t]
        fill = max(known) if known else 1.0
        c = (pc if pc == pc else fill) if cpu_ok else None
        g = (pg if pg == pg else fill) if gpu_ok else None
        if c is None and g is None:
            c = fill
        return c, g

    def _start(self):
        ready, later = [], []
        for c in self.calls:
            (later if _futures_in(c.args, c.kwargs) else ready).append(c)
        # calls on other calls' results: decided by the backlog rule when their inputs are ready
        for c in later:
            self.submitter._when_ready(c)
        if not ready:
            return
        costs = []
        for c in ready:
            try:
                costs.append(self._costs(c))
            except Exception as e:  # a call that cannot be prepared fails alone, as it would run
                if c.future.set_running_or_notify_cancel():
                    c.future.set_exception(e)
                costs.append(None)
        calls = [c for c, x in zip(ready, costs) if x is not None]
        costs = [x for x in costs if x is not None]
        plan = place(costs)
        at = {id(c): n for n, c in enumerate(self.calls)}
        self.plan = [(at[id(calls[j])], calls[j].op, side, start, end) for j, side, start, end in plan]
        planned = {j: (side, start) for j, side, start, end in plan}
        # The plan's sides come from predictions; the run follows its order, not its sides: each side
        # takes the calls only it can run, then pulls from a shared queue ordered by relative advantage
        # (the CPU from the front, the GPU from the back) whenever it is free. Where the predictions
        # are off, the side that runs ahead takes more of the middle: the batch ends within about one
        # call of both sides' actual finish, not the plan's.
        own, both = _by_side(costs)
        shared = collections.deque(both)
        lock = threading.Lock()

        def worker(side):
            t0 = time.perf_counter_ns()
            mine = collections.deque(own[side])
            while True:
                with lock:
                    if mine:
                        j = mine.popleft()
                    elif shared:
                        j = shared.popleft() if side == "cpu" else shared.pop()
                    else:
                        return
                call = calls[j]
                p_side, p_start = planned[j]
                tags = {"batch": self.id, "planned": p_side, "planned_start_us": round(p_start, 1),
                        "waited_us": round((time.perf_counter_ns() - call.submitted_ns) * 1e-3, 1),
                        "side_elapsed_us": round((time.perf_counter_ns() - t0) * 1e-3, 1)}
                self.submitter._run(call, backend=side, scope=tags)
        self.run_sides({side: (lambda side=side: worker(side)) for side in ("cpu", "gpu") if own[side] or both})

    def run_sides(self, workers):
        """Starts a thread per side running its worker (a function of no argument that runs the side's
        calls until none is left); a simulated machine replaces this with its own callers
        (tests/support/virtual_machine.py)."""
        for side, work in workers.items():
            threading.Thread(target=work, daemon=True, name=f"hipsched-batch{self.id}-{side}").start()


# Decisions that leave the GPU out of an automatic call whatever the model says
_CPU_ONLY_REASONS = frozenset(("gpu_unavailable", "gpu_unsupported", "memory_constraint", "gpu_unhealthy",
                               "below_min_batch", "user_preference"))
_REASONS = _sched.REASONS


def _by_side(costs):
    """({"cpu": [...], "gpu": [...]}: the calls only that side can run, longest first; [the others, by their
    CPU time over their GPU time, the CPU's relatively best first]), as indices into `costs`."""
    fixed = {"cpu": [], "gpu": []}
    both = []
    for i, (c, g) in enumerate(costs):
        if g is None:
            fixed["cpu"].append(i)
        elif c is None:
            fixed["gpu"].append(i)
        else:
            both.append(i)
    fixed["cpu"].sort(key=lambda i: -costs[i][0])
    fixed["gpu"].sort(key=lambda i: -costs[i][1])
    both.sort(key=lambda i: (costs[i][0] / costs[i][1] if costs[i][1] > 0 else float("inf"), i))
    return fixed, both


def place(costs):
    """Places independent calls on the CPU and the GPU: [(index, side, start, end)] in the order each
    side runs them. `costs` is [(cpu us or None, gpu us or None)] (None: the side cannot run it).

    Each side takes the calls it is relatively best at: the calls sorted by their CPU time over their GPU
    time, the CPU takes from the front and the GPU from the back, the next call always going to the side
    that would finish it first, until they meet. That is the fluid optimum of two processors rounded to
    whole calls (within one call's time of the bound); an earliest-finish rule alone, in any order, sends
    a call to the side it is poor at whenever that side is idle (a batch of calls of which the GPU is 2x on
    some and 0.5x on others came out 1.2-1.4x its bound). Calls only one side can run go there first."""
    fixed, both = _by_side(costs)
    free = {"cpu": 0.0, "gpu": 0.0}
    out = []

    def put(i, side):
        t = costs[i][0 if side == "cpu" else 1]
        out.append((i, side, free[side], free[side] + t))
        free[side] += t
    for side in ("cpu", "gpu"):
        for i in fixed[side]:
            put(i, side)
    lo, hi = 0, len(both) - 1
    while lo <= hi:
        c, g = costs[both[lo]][0], costs[both[hi]][1]
        if free["cpu"] + c <= free["gpu"] + g:
            put(both[lo], "cpu")
            lo += 1
        else:
            put(both[hi], "gpu")
            hi -= 1
    return out
