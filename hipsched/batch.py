"""`with ex.batch() as b:` (Executor.batch): a batch collects its calls and, when its block ends, plans
them together. A call whose inputs are other calls of the batch is predicted on stand-ins of those
results (the shape and dtype its op declares: OpSpec.result), and the calls with edges are placed as a
graph (hipsched/batch_plan.py's `plan_graph`, `heft`: the longest remaining path first, each call to the
side where it finishes earliest, copies counted); the independent ones after them (`place`: each side
takes the calls it is relatively best at, balanced so that both sides end together). A thread per side
runs the plan: its graph calls in order as their inputs are done (a wait filled by an independent call
that fits, or by the other side's next call when that side runs late), then the independent calls, each
side taking the next as it becomes free, so that predictions that were off move the calls in the middle
to the side that runs ahead. Where the GPU makes device arrays, a chain planned on it keeps its
intermediates there. Each call's telemetry event carries the plan (its scope's tags: the batch, the side
it was planned on and when, what it waited for and how long)."""
from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import logging
import threading
import time

from . import _dispatch, _sched
from .batch_plan import by_side, place, plan_graph
from .errors import HipschedError
from .ops.base import OPS, stand_in
from .submission import _futures_in, _input_error, current_batch

_batch_ids = itertools.count(1)
log = logging.getLogger("hipsched")


# Decisions that leave the GPU out of an automatic call whatever the model says
_CPU_ONLY_REASONS = frozenset(("gpu_unavailable", "gpu_unsupported", "memory_constraint", "gpu_unhealthy",
                               "below_min_batch", "user_preference"))
_REASONS = _sched.REASONS


class Batch:
    """`with ex.batch() as b:` collects the calls submitted in its block (ex.submit or an op's wait=False
    on this thread, or in this asyncio task; b.submit from anywhere) and places and starts them when the
    block ends. `b.plan` is then
    [(call index, op, side, predicted start us, predicted finish us)] in the plan's order: the graph's
    calls by their start, then the independent ones (the run follows its order, and moves calls to the
    side that runs ahead: the events say where each ran, and where it was planned). Calls not planned
    ahead (Batch._graph says which) are not in it."""

    def __init__(self, submitter):
        self.submitter = submitter
        self.calls = []
        self.plan = []
        self.id = next(_batch_ids)
        self._token = None
        self.started = False    # its block has ended: its calls are planned and started
        self.lock = threading.Lock()   # started, and the calls joining it (b.submit may come from anywhere)
        self._entered = False

    def submit(self, op, *args, backend="auto", stream=None, split=None, **kwargs):
        """ex.submit into this batch, from any thread or task, until its block ends."""
        if self.started:
            raise HipschedError("the batch has started: submit to a new one, or to the executor")
        return self.submitter._ex._submit(op, backend, stream, split, args, kwargs, self)

    def __enter__(self):
        if self._entered:   # its calls were planned when its block ended; a second block would plan them again
            raise HipschedError("a batch is entered once: make a new one with ex.batch()")
        self._entered = True
        self._token = current_batch.set(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        current_batch.reset(self._token)
        with self.lock:
            self.started = True
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
        """Every call's result, in submission order (waits for them, `timeout` seconds in all)."""
        end = None if timeout is None else time.monotonic() + timeout
        return [c.future.result(None if end is None else max(0.0, end - time.monotonic())) for c in self.calls]

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
        else:   # the side asked for; one that refuses it is not planned: its run says what it says
            if (be == _sched.BACKEND_GPU) != (call.backend == "gpu"):
                return None
            gpu_ok = call.backend == "gpu"
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

        def leave(n, c):   # not planned: decided when its inputs are ready, as any submitted call
            costs.append(None)
            preds.append([])
            unplanned.append(c)
            made[n] = None
        for n, c in enumerate(self.calls):
            deps = _futures_in(c.args, c.kwargs)
            mine = [index.get(id(f)) for _, f in deps]
            if any(j is None or made.get(j) is None or j in device for j in mine):
                leave(n, c)
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
                    leave(n, c)
                    continue
                # an independent call that cannot be prepared fails alone, as it would run
                if c.future.set_running_or_notify_cancel():
                    c.future.set_exception(e)
                costs.append(None)
                preds.append([])
                made[n] = None
                continue
            if cost is None:   # asked for a side that refuses it: its run says what it says
                leave(n, c)
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
        own, both = by_side([costs[n] for n in alone])
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
            if p_side == side:
                return 0.0
            made = self._copies[p][1]
            return down(made) if p_side == "gpu" else up(made)
        return out, copy_us

    def wait_until(self, ready, wake_s=None):
        """Blocks the calling side's worker until `ready()` (its next call's inputs done, or another
        side's call it may take), looking again at each completion (a notify) and, without one, after
        `wake_s()` seconds (None: at a completion only); a simulated machine replaces this with its own
        wait (tests/support/virtual_machine.py)."""
        cv = self._run_cv
        with cv:
            while not ready():
                cv.wait(wake_s() if wake_s is not None else None)

    def run_sides(self, workers):
        """Starts a thread per side running its worker (a function of no argument that runs the side's
        calls until none is left); a simulated machine replaces this with its own callers
        (tests/support/virtual_machine.py)."""
        for side, work in workers.items():
            threading.Thread(target=work, daemon=True, name=f"hipsched-batch{self.id}-{side}").start()


_SIDE = {"cpu": 0, "gpu": 1}
_OTHER = {"cpu": "gpu", "gpu": "cpu"}
# how far into the other side's queue a waiting side looks for a call to take (the check runs under the
# queues' lock: a scan of every queued call at every look made a 1,500-call chain 1.6x slower)
_STEAL_LOOKAHEAD = 16
# the longest a waiting side sleeps without a completion or a start to wake it (a safety net: each of
# those notifies)
_WAIT_MAX_S = 0.05


class _PlanRun:
    """A batch's plan being run: each side's worker (Batch.run_sides) takes its next call here."""

    def __init__(self, batch, costs, preds, at, graph, kept, own, shared):
        self.batch, self.costs, self.preds, self.at, self.kept = batch, costs, preds, at, kept
        self.graph, self.own, self.shared = graph, own, shared
        # one lock for the queues and the waits: a side's check of what it may take reads the other
        # side's queue, which that side changes (two locks let a check iterate a queue being changed,
        # which killed a worker and left the batch waiting forever)
        self.lock = threading.Lock()
        self.busy = {"cpu": None, "gpu": None}   # side -> when its running call is predicted to end, ns
        self.t0 = _now_ns()
        batch._run_cv = self.cv = threading.Condition(self.lock)

    def one_done(self, _):
        with self.cv:
            self.cv.notify_all()

    def _ready(self, n):
        """Whether call n can be taken: its inputs are done, or it was cancelled (it will not run, and
        must not hold its side's queue until its inputs are made)."""
        calls = self.batch.calls
        return calls[n].future.cancelled() or all(calls[p].future.done() for p in self.preds[n])

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
        for k, n in enumerate(self.graph[other]):
            if k == _STEAL_LOOKAHEAD:
                break
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

    def _wake_s(self, side):
        """Seconds until a waiting side should look again without a completion: when the other side's
        running call is predicted to end (past that, it runs late, and its queued calls may be worth
        taking), at most _WAIT_MAX_S."""
        busy = self.busy[_OTHER[side]]
        if busy is None:
            return _WAIT_MAX_S
        return min(max((busy - _now_ns()) * 1e-9, 0.0) + 1e-4, _WAIT_MAX_S)

    def _can_go(self, side):
        mine, theirs = self.graph[side], self.graph[_OTHER[side]]
        if mine and self._ready(mine[0]):
            return True
        if not mine and not theirs:
            return True
        return self._stealable(side, _now_ns()) is not None

    def worker(self, side):
        """Runs the side's calls until none is left. Should it fail itself (not a call: a call's error goes
        to its Future), the calls still queued fail with its error rather than wait forever."""
        try:
            self._work(side)
        except BaseException as e:
            with self.lock:
                left = [*self.graph["cpu"], *self.graph["gpu"], *self.own["cpu"], *self.own["gpu"], *self.shared]
                for q in (self.graph["cpu"], self.graph["gpu"], self.own["cpu"], self.own["gpu"], self.shared):
                    q.clear()
                self.cv.notify_all()
            for n in left:
                f = self.batch.calls[n].future
                try:
                    if f.set_running_or_notify_cancel():
                        f.set_exception(e)
                except RuntimeError:
                    pass
            log.error("hipsched: batch %s's %s side failed; its calls left fail with: %r", self.batch.id, side, e)

    def _work(self, side):
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
                b.wait_until(lambda: self._can_go(side), lambda: self._wake_s(side))
                waited += (_now_ns() - w0) * 1e-3
                continue
            call = b.calls[n]
            if call.future.cancelled():
                continue
            p_side, p_start = self.at[n]
            now = _now_ns()
            tags = {"batch": b.id, "planned": p_side, "planned_start_us": round(p_start, 1),
                    "waited_us": round((time.perf_counter_ns() - call.submitted_ns) * 1e-3, 1),
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
            with self.lock:   # the other side may now take calls this one would start late
                self.busy[side] = now + self._us(n, side) * 1e3
                self.cv.notify_all()
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
