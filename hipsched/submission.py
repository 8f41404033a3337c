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

A batch collects its calls and, when its block ends, plans them together. A call whose inputs are other
calls of the batch is predicted on stand-ins of those results (the shape and dtype its op declares:
OpSpec.result), and the calls with edges are placed as a graph (`plan_graph`, `heft`: the longest
remaining path first, each call to the side where it finishes earliest, copies counted); the
independent ones after them (`place`: each side takes the calls it is relatively best at, balanced so
that both sides end together). A thread per side runs the plan: its graph calls in order as their
inputs are done (a wait filled by an independent call that fits, or by the other side's next call when
that side runs late), then the independent calls, each side taking the next as it becomes free, so that
predictions that were off move the calls in the middle to the side that runs ahead. Where the GPU makes
device arrays, a chain planned on it keeps its intermediates there. Each call's telemetry event carries
the plan (its scope's tags: the batch, the side it was planned on and when, what it waited for and how
long)."""
from __future__ import annotations

import bisect
import collections
import concurrent.futures as cf
import contextvars
import itertools
import threading
import time
import weakref

import numpy as np

from . import _dispatch, _sched
from .dlpack_devices import GPU_DEVICE_TYPES, dlpack_device, is_device_array
from .errors import HipschedError
from .ops.base import OPS, stand_in

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

    def raw_result(self, timeout=None):
        return super().result(timeout)

    def result(self, timeout=None):
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
        mine = batch is not None and batch.submitter is self
        call = _Pending(op, backend, stream, split, args, kwargs, _BatchFuture if mine else cf.Future)
        self._track(call)
        if mine:
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
        if not call.future.set_running_or_notify_cancel():
            return
        try:
            args, kwargs = _resolved(call.args, call.kwargs, raw=planned)
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
    [(call index, op, side, predicted start us, predicted finish us)] in the plan's order: the graph's
    calls by their start, then the independent ones (the run follows its order, and moves calls to the
    side that runs ahead: the events say where each ran, and where it was planned). Calls not planned
    ahead (Batch._graph says which) are not in it."""

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
        try:
            self._start()
        except BaseException as e:   # a planning bug must not leave the batch's futures waiting forever
            for c in self.calls:
                if c.future.running() or c.future.done():
                    continue
                if c.future.set_running_or_notify_cancel():
                    c.future.set_exception(e)
            raise
        return False

    def results(self, timeout=None):
        """Every call's result, in submission order (waits for them)."""
        return [c.future.result(timeout) for c in self.calls]

    # ------------------------------------------------------------------ planning
    def _costs(self, call, prepared=None):
        """(cpu us, gpu us or None): the call's predicted time on each side it may run on, its copies
        counted (the decision core's predictions for the call as it would be decided now). `prepared`:
        the call's validated Call, when it was prepared already (on stand-ins of its inputs)."""
        ex = self.submitter._ex
        if prepared is None:
            prepared = ex._prepare[call.op](*call.args, **call.kwargs)
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

    def _graph(self):
        """(costs, preds, unplanned): each call's (cpu us, gpu us) or None where it is not planned ahead,
        [the indices of the batch calls whose results it takes], and the calls left to the backlog rule.

        A call on another batch call's result is prepared on a stand-in of that result (zeros of the
        shape and dtype its op declares: OpSpec.result), so its size and bytes, and so its times, are
        known before the result is. Not planned ahead, and decided when their inputs are ready instead:
        a call on a Future from outside the batch, on the result of an op that declares none, on a
        device result (a device-data call's: a stand-in on the host would price the wrong copies), or on
        a call not planned; and a call whose preparation on stand-ins fails (its real run says why)."""
        ex = self.submitter._ex
        index = {id(c.future): n for n, c in enumerate(self.calls)}
        costs, preds, unplanned = [], [], []
        self._copies = {}   # planned call -> (bytes of the batch's results it takes, bytes of its own)
        self._host_data = set()   # planned calls on host data (a device input keeps its result there anyway)
        made = {}        # index -> the stand-in of its result (None: it has none)
        device = set()   # indices of calls on device data (their results stay on the device)
        for n, c in enumerate(self.calls):
            deps = _futures_in(c.args, c.kwargs)
            mine = [index.get(id(f)) for _, f in deps]
            if any(j is None or made.get(j) is None or j in device for j in mine):
                costs.append(None)
                preds.append([])
                unplanned.append(c)
                made[n] = None
                continue
            try:
                if deps:
                    args = tuple(made[index[id(a)]] if isinstance(a, cf.Future) else a for a in c.args)
                    kwargs = {k: (made[index[id(v)]] if isinstance(v, cf.Future) else v) for k, v in c.kwargs.items()}
                else:
                    args, kwargs = c.args, c.kwargs
                prepared = ex._prepare[c.op](*args, **kwargs)
                cost = self._costs(c, prepared)
            except Exception as e:
                if deps:   # left to run: its run on the real inputs raises what it raises
                    costs.append(None)
                    preds.append([])
                    unplanned.append(c)
                    made[n] = None
                    continue
                # an independent call that cannot be prepared fails alone, as it would run
                if c.future.set_running_or_notify_cancel():
                    c.future.set_exception(e)
                costs.append(None)
                preds.append([])
                made[n] = None
                continue
            costs.append(cost)
            preds.append(sorted(set(mine)))
            if prepared.on_device:
                device.add(n)
            else:
                self._host_data.add(n)
            try:
                made[n] = _declared_stand_in(c.op, prepared)
            except Exception:   # a declaration that fails: its dependants are decided when it is done
                made[n] = None
            self._copies[n] = (sum(_nbytes(made[j]) for j in set(mine)), _nbytes(made[n]))
        return costs, preds, unplanned

    def _start(self):
        costs, preds, unplanned = self._graph()
        for c in unplanned:
            self.submitter._when_ready(c)
        planned = [n for n, x in enumerate(costs) if x is not None]
        if not planned:
            return
        succs = {n: [] for n in planned}
        for n in planned:
            for p in preds[n]:
                succs[p].append(n)
        in_graph = [n for n in planned if preds[n] or succs[n]]
        alone = [n for n in planned if not preds[n] and not succs[n]]
        ex = self.submitter._ex
        # a GPU that makes device arrays of its own keeps a chain's intermediates there: copies then move
        # only along edges between the sides, and a last result to the caller
        keeps = bool(ex._gpu_present and getattr(ex._gpu, "uploads", False))
        graph_costs, copy_us = {n: costs[n] for n in in_graph}, None
        if keeps:
            graph_costs, copy_us = self._kept_costs(graph_costs, succs)
        # the graph first (its longest paths decide the makespan), then the independent calls placed
        # after it, each side taking the ones it is relatively best at
        gplan, free = plan_graph(graph_costs, {n: preds[n] for n in in_graph}, {n: succs[n] for n in in_graph},
                                 copy_us)
        iplan = place([costs[n] for n in alone], free)
        plan = gplan + [(alone[j], side, start, end) for j, side, start, end in iplan]
        self.plan = [(n, self.calls[n].op, side, start, end) for n, side, start, end in plan]
        at = {n: (side, start) for n, side, start, end in plan}
        graph_order = {"cpu": collections.deque(), "gpu": collections.deque()}
        for n, side, start, end in gplan:
            graph_order[side].append(n)
        # Independent calls: the run follows the plan's order, not its sides: each side takes the calls
        # only it can run, then pulls from a shared queue ordered by relative advantage (the CPU from the
        # front, the GPU from the back) whenever it is free. Where the predictions are off, the side that
        # runs ahead takes more of the middle: the batch ends within about one call of both sides'
        # actual finish, not the plan's. Graph calls keep their side's order (HEFT's); a side that would
        # wait takes the other side's next call instead when its inputs are ready and it would end here
        # before it could end there (the other side running late on its own calls).
        own, both = _by_side([costs[n] for n in alone])
        kept = set()
        if keeps:
            kept = {n for n, side, _, _ in gplan
                    if side == "gpu" and succs[n] and all(at[m][0] == "gpu" for m in succs[n])}
            for n in in_graph:
                if n in self._host_data:
                    self.calls[n].future.to_host = True
        run_costs = [graph_costs.get(n, x) for n, x in enumerate(costs)]
        run = _PlanRun(self, run_costs, preds, at, graph_order, kept,
                       {side: collections.deque(alone[j] for j in own[side]) for side in own},
                       collections.deque(alone[j] for j in both))
        for n in in_graph:
            self.calls[n].future.add_done_callback(run.one_done)
        self.run_sides({side: (lambda side=side: run.worker(side)) for side in ("cpu", "gpu")
                        if graph_order[side] or run.own[side] or run.shared})

    def _kept_costs(self, costs, succs):
        """(costs, copy_us) for heft() where the GPU keeps intermediates: a call's predicted GPU time counts
        its copies as a call on host data makes them (its inputs up, its result down); kept on the device,
        the batch's results it takes come up only from a CPU call (an edge between the sides), and its
        own result goes down only to a CPU call or, for a last call, to the caller."""
        core = self.submitter._ex._core
        link = core.transfer_model()

        def up(nbytes):
            return core.upload_us(nbytes) if nbytes else 0.0

        def down(nbytes):
            return link["d2h_latency_us"] + nbytes / (link["d2h_gbps"] * 1e3) if nbytes else 0.0
        out = {}
        for n, (c, g) in costs.items():
            if g is not None and n in self._host_data:
                taken, made = self._copies[n]
                g = max(g - up(taken) - (down(made) if succs[n] else 0.0), 0.0)
            out[n] = (c, g)

        def copy_us(p, p_side, n, side):
            made = self._copies[p][1]
            return down(made) if p_side == "gpu" else up(made)
        return out, copy_us

    def wait_until(self, ready):
        """Blocks the calling side's worker until `ready()` (its next call's inputs done, or another
        side's call it may take); a simulated machine replaces this with its own wait
        (tests/support/virtual_machine.py)."""
        cv = self._run_cv
        with cv:
            while not ready():
                # a completion notifies; a call running past its prediction changes what may be taken
                # without one, so the wait also looks again every millisecond
                cv.wait(0.001)

    def run_sides(self, workers):
        """Starts a thread per side running its worker (a function of no argument that runs the side's
        calls until none is left); a simulated machine replaces this with its own callers
        (tests/support/virtual_machine.py)."""
        for side, work in workers.items():
            threading.Thread(target=work, daemon=True, name=f"hipsched-batch{self.id}-{side}").start()


_SIDE = {"cpu": 0, "gpu": 1}
_OTHER = {"cpu": "gpu", "gpu": "cpu"}


class _PlanRun:
    """A batch's plan being run: each side's worker (Batch.run_sides) takes its next call here."""

    def __init__(self, batch, costs, preds, at, graph, kept, own, shared):
        self.batch, self.costs, self.preds, self.at, self.kept = batch, costs, preds, at, kept
        self.graph, self.own, self.shared = graph, own, shared
        self.lock = threading.Lock()
        self.busy = {"cpu": None, "gpu": None}   # side -> when its running call is predicted to end, ns
        self.t0 = _now_ns()
        batch._run_cv = self.cv = threading.Condition()

    def one_done(self, _):
        with self.cv:
            self.cv.notify_all()

    def _ready(self, n):
        calls = self.batch.calls
        return all(calls[p].future.done() for p in self.preds[n])

    def _us(self, n, side):
        return self.costs[n][_SIDE[side]]

    def _stealable(self, side, now):
        """A call of the other side's graph queue whose inputs are done and which would end here before
        it could end there (that side busy past now with its running call and the calls queued before
        this one, by their predictions), the first in that side's order; else None."""
        other = _OTHER[side]
        busy = self.busy[other]
        if busy is None:   # idle: it takes its own next call itself
            return None
        there_starts = max(busy, now)
        for n in self.graph[other]:
            here, there = self._us(n, side), self._us(n, other)
            if here is not None and self._ready(n) and now + here * 1e3 < there_starts + there * 1e3:
                return n
            there_starts += there * 1e3
        return None

    def _pick(self, side):
        """(call index, how it was taken) or (None, "wait") or (None, "done"), under the lock."""
        mine, own, shared = self.graph[side], self.own[side], self.shared
        now = _now_ns()
        if mine and self._ready(mine[0]):
            return mine.popleft(), "planned"
        if mine:
            # a wait: an independent call fills it when the plan says it ends before the graph call
            # was to start
            left = self.at[mine[0]][1] - (now - self.t0) * 1e-3
            if own and self._us(own[0], side) <= left:
                return own.popleft(), "filled"
            if shared:
                j = shared[0] if side == "cpu" else shared[-1]
                if self._us(j, side) <= left:
                    return (shared.popleft() if side == "cpu" else shared.pop()), "filled"
        else:
            if own:
                return own.popleft(), "pulled"
            if shared:
                return (shared.popleft() if side == "cpu" else shared.pop()), "pulled"
        n = self._stealable(side, now)
        if n is not None:
            self.graph[_OTHER[side]].remove(n)
            return n, "taken"
        if not mine and not self.graph[_OTHER[side]]:
            return None, "done"
        return None, "wait"

    def _can_go(self, side):
        mine, theirs = self.graph[side], self.graph[_OTHER[side]]
        if mine and self._ready(mine[0]):
            return True
        if not mine and not theirs:
            return True
        return self._stealable(side, _now_ns()) is not None

    def worker(self, side):
        b = self.batch
        t_side = _now_ns()
        waited = 0.0
        while True:
            with self.lock:
                n, how = self._pick(side)
            if how == "done":
                return
            if n is None:
                w0 = _now_ns()
                b.wait_until(lambda: self._can_go(side))
                waited += (_now_ns() - w0) * 1e-3
                continue
            call = b.calls[n]
            p_side, p_start = self.at[n]
            now = _now_ns()
            tags = {"batch": b.id, "planned": p_side, "planned_start_us": round(p_start, 1),
                    "waited_us": round((now - call.submitted_ns) * 1e-3, 1),
                    "side_elapsed_us": round((now - t_side) * 1e-3, 1)}
            if self.preds[n]:
                tags["after"] = list(self.preds[n])
                tags["input_wait_us"] = round(waited, 1)
                if how == "taken":
                    tags["taken_from"] = p_side
                err = _input_error(call)
                if err is not None:
                    waited = 0.0
                    if call.future.set_running_or_notify_cancel():
                        call.future.set_exception(err)
                    continue
            waited = 0.0
            self.busy[side] = now + self._us(n, side) * 1e3
            try:
                b.submitter._run(call, backend=side, scope=tags, planned=bool(self.preds[n]),
                                 keep=side == "gpu" and n in self.kept)
            finally:
                self.busy[side] = None


def _now_ns():
    # the dispatcher's clock, read through its module: a simulated machine replaces it (virtual time)
    return _dispatch._perf_ns()


def _nbytes(x):
    if x is None:
        return 0
    return sum(a.nbytes for a in x) if isinstance(x, tuple) else x.nbytes


def _declared_stand_in(op, prepared):
    """Zeros of the result `prepared` will return, as its op declares it (OpSpec.result), or None."""
    declare = OPS[op].result
    if declare is None:
        return None
    out = declare(prepared)
    if not isinstance(out[1], str):   # several arrays: ((shape, dtype), ...)
        return tuple(stand_in(shape, dtype) for shape, dtype in out)
    return stand_in(*out)


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


def plan_graph(costs, preds, succs, copy_us=None):
    """heft() twice, each call free to go to either side, and each call held to the side the fluid split of
    the whole graph's work gives it (fluid_sides): the plan that ends first. Earliest finish alone sends a
    call to a side it is poor at whenever that side is idle first, which a graph of many parallel chains
    pays as independent calls do (place's docstring): on the virtual machine whose GPU is 0.5x on softmax
    and rms_norm and 1x on qmatmul, 60 such chains came out 1.16x their bound so, and 1.00x held to the
    fluid sides. A graph that is one long chain is the opposite case: the fluid split balances work that
    cannot run at once, and each call on its faster side wins."""
    free_plan = heft(costs, preds, succs, copy_us)
    held = fluid_sides(costs)
    if not held:
        return free_plan
    held_plan = heft(costs, preds, succs, copy_us, held)
    return held_plan if max(held_plan[1].values()) < max(free_plan[1].values()) else free_plan


def fluid_sides(costs):
    """{call: side} of the calls the fluid split of `costs` ({call: (cpu us, gpu us)}) gives wholly to one
    side: sorted by their CPU time over their GPU time, the CPU takes a prefix and the GPU the rest, so
    that both would end together were a call divisible; the calls of the relative speed of the one call
    that split cuts in two are left free (the split may put them on either side), and so are the calls
    only one side can run."""
    keys = sorted((n for n in costs if None not in costs[n]),
                  key=lambda n: (costs[n][0] / costs[n][1] if costs[n][1] > 0 else float("inf"), n))
    if not keys:
        return {}
    gpu_rest = sum(costs[n][1] for n in keys)
    cpu_done = 0.0
    cut = None
    for k, n in enumerate(keys):
        c, g = costs[n]
        gpu_rest -= g
        if cpu_done + c > gpu_rest + 1e-9 * (c + g):   # all of n on the CPU would end after the GPU
            share = (gpu_rest + g - cpu_done) / (c + g) if c + g > 0 else 0.0   # the part the CPU takes
            cut = (k, share)
            break
        cpu_done += c
    if cut is None:
        return {n: "cpu" for n in keys}
    k, share = cut
    ratio = lambda n: costs[n][0] / costs[n][1] if costs[n][1] > 0 else float("inf")  # noqa: E731
    r = ratio(keys[k])
    split = 1e-9 < share < 1 - 1e-9
    held = {}
    for j, n in enumerate(keys):
        if split and abs(ratio(n) - r) <= 1e-9 * max(r, 1.0):
            continue
        held[n] = "cpu" if j < k or j == k and share >= 1 - 1e-9 else "gpu"
    return held


def heft(costs, preds, succs, copy_us=None, held=None):
    """Places the calls of a dependency graph on the CPU and the GPU (HEFT, Topcuoglu et al. 2002):
    ([(call, side, start, end)] in the order of the plan, {side: when it is free after them}).
    `costs` {call: (cpu us or None, gpu us or None)} (None: that side cannot run it), `preds` and
    `succs` {call: [calls]}; `copy_us(pred, pred side, call, side)`: what moving the intermediate
    between them costs beyond the calls' own times (none by default).

    Each call's upward rank is its mean time over the sides that may run it plus the largest, over its
    successors, of the edge's mean copy and the successor's rank: the longest path from it to the end.
    Calls are taken by rank, highest first (so each comes after its predecessors), and each goes to the
    side where it finishes earliest: it starts in the side's first idle time long enough for it after
    every predecessor has ended (and its result has been copied across, where the sides differ), which
    may come before calls placed earlier (the plan lists each side's calls by their start). `held`
    {call: side}: calls that go to that side whatever (the ranks still count both sides' times)."""
    copy_us = copy_us or (lambda p, ps, n, s: 0.0)
    sides = ("cpu", "gpu")
    held = held or {}

    def ok(n):
        return [(s, t) for s, t in zip(sides, costs[n]) if t is not None]

    def may(n):
        return [(s, t) for s, t in ok(n) if held.get(n, s) == s]

    def mean_copy(p, n):
        pairs = [copy_us(p, ps, n, s) for ps, _ in ok(p) for s, _ in ok(n)]
        return sum(pairs) / len(pairs) if pairs else 0.0

    rank = {}
    for n in sorted(costs, reverse=True):   # submission order is a topological order: successors first
        rank[n] = sum(t for _, t in ok(n)) / len(ok(n)) + max(
            (mean_copy(n, m) + rank[m] for m in succs[n]), default=0.0)
    free = {"cpu": 0.0, "gpu": 0.0}
    # the work held to each side and not placed yet: a free call is judged by when its side would end
    # that too, so that it does not take the time the held calls will need there
    coming = {s: 0.0 for s in sides}
    for n, s in held.items():
        coming[s] += costs[n][sides.index(s)]
    where, end = {}, {}
    busy = {s: [] for s in sides}   # each side's placed runs, (start, end) in order
    out = []
    for n in sorted(costs, key=lambda n: (-rank[n], n)):
        best = None
        if n in held:
            coming[held[n]] -= costs[n][sides.index(held[n])]
        for s, t in may(n):
            ready = max([0.0] + [end[p] + (copy_us(p, where[p], n, s) if where[p] != s else 0.0)
                                 for p in preds[n]])
            start = _first_gap(busy[s], ready, t)
            key = (start + t + coming[s], t)
            if best is None or key < best[0]:
                best = (key, s, start, start + t)
        _, s, start, finish = best
        where[n], end[n] = s, finish
        bisect.insort(busy[s], (start, finish))
        free[s] = max(free[s], finish)
        out.append((n, s, start, finish))
    out.sort(key=lambda x: (x[2], x[3]))
    return out, free


def _first_gap(busy, ready, t):
    """The earliest start >= `ready` of a `t` long run between the sorted (start, end) runs of `busy`
    (HEFT's insertion: a call may fill a side's idle time before calls placed earlier)."""
    at = ready
    for s0, e0 in busy:
        if e0 <= at:
            continue
        if s0 >= at + t:
            return at
        at = max(at, e0)
    return at


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


def place(costs, free=None):
    """Places independent calls on the CPU and the GPU: [(index, side, start, end)] in the order each
    side runs them. `costs` is [(cpu us or None, gpu us or None)] (None: the side cannot run it);
    `free` {side: us}: when each side is free to start them (0 by default).

    Each side takes the calls it is relatively best at: the calls sorted by their CPU time over their GPU
    time, the CPU takes from the front and the GPU from the back, the next call always going to the side
    that would finish it first, until they meet. That is the fluid optimum of two processors rounded to
    whole calls (within one call's time of the bound); an earliest-finish rule alone, in any order, sends
    a call to the side it is poor at whenever that side is idle (a batch of calls of which the GPU is 2x on
    some and 0.5x on others came out 1.2-1.4x its bound). Calls only one side can run go there first."""
    fixed, both = _by_side(costs)
    free = dict(free) if free is not None else {"cpu": 0.0, "gpu": 0.0}
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
