"""top_k computed now over a persisted corpus, for query serving: one request to each worker that holds
chunks, answered by a handler on that worker, instead of a task graph through the scheduler. Same
result as dask.compute(*top_k(...)).

Why: a graph query waits for about four scheduler hops (the client's, scheduler's and workers' batched
streams each hold a message up to 10, 5 and 2 ms after the one before, and the merge, its alias and the
gather are a stage each), 25 to 55 ms on a 2-core machine whatever the corpus. Here a query is one
request and one reply per worker, all workers at once (straight to the worker when the client was made
with direct_to_workers=True, else relayed by the scheduler's `proxy`, as Dask's actors are), and the
client merges the few candidate lists itself. Dask still holds the corpus (persisted chunks, where
who_has says they are: the placement cache that top_k uses), and whenever this path cannot give the
exact answer (a worker gone, a chunk moved or lost, a worker without the handler) the query runs as
top_k's graph, where Dask's retries and recomputation apply. The handler is a worker RPC handler, not
an actor: an actor is a task the scheduler pins to its worker, and a worker holding one cannot be
retired gracefully. See docs/guide/distributed.md, "Queries served directly"."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback

import dask
import dask.array as da
import numpy as np
from distributed import futures_of
from distributed.protocol import to_serialize

from ..ops.validation import as_float, finite_scalar
from .ops import SPLIT_EVERY, _corpus, check_split_every, held_chunk, held_plans, merged, scan_top_k, top_k
from .placement import forget_placements, placement
from .workers import executor_of

HANDLER = "hipsched_top_k"   # the worker RPC handler's name
logger = logging.getLogger("hipsched.dask")
search_stats = {"direct": 0, "graph": 0, "installs": 0, "rereads": 0}   # read by the tests and the bench
_MOVED = object()   # _direct's answer when a planned chunk was not on its worker
# Where the last direct query's time went, for whoever profiles one (bench/distributed.py does):
# {"wall_s": the requests' round trip on the client, "workers": {address: {"handler_s": its handler,
# "scan_s": [each group's scan]}}}. wall_s - a worker's handler_s is that worker's request and reply
# in transit (and queued), whatever the clocks; the spread of handler_s is the scans' imbalance.
# Empty after a query that fell back to the graph. Read it as hipsched.dask.direct.last_timing (it is
# replaced, not updated, per query).
last_timing: dict = {}


class _Missing(Exception):
    """A chunk the plan put on this worker is not in its memory (moved, or lost with a worker)."""


def _scan(worker, q, k, keys, offsets, split_every):
    """One group's candidates from the chunks in `worker`'s memory (read in place, no copy), and how
    long the scan took."""
    t0 = time.perf_counter()

    def here():
        for key, off in zip(keys, offsets):
            try:
                block = held_chunk(worker, key)
            except KeyError:
                raise _Missing(key) from None
            yield off, block
    part = merged(scan_top_k(executor_of(worker), q, k, here(), split_every), k)
    return part, time.perf_counter() - t0


async def _serve_top_k(worker, q=None, k=None, groups=(), split_every=SPLIT_EVERY):
    """The handler: the worker's groups scanned on its own task threads (its `default` executor, so no
    more threads scan than the worker has; the event loop stays free), one candidate list per group, or
    None when a planned chunk is not in this worker's memory; and how long the handler and each group's
    scan took here (durations only: the worker's clock need not agree with the client's)."""
    t0 = time.perf_counter()
    loop = asyncio.get_running_loop()
    pool = worker.executors["default"]
    calls = [loop.run_in_executor(pool, _scan, worker, q, k, keys, offsets, split_every) for keys, offsets in groups]
    try:
        done = await asyncio.gather(*calls)
        parts = [part for part, _ in done]
    except _Missing:
        parts, done = None, ()
    timing = {"handler_s": time.perf_counter() - t0, "scan_s": [s for _, s in done]}
    return {"status": "OK", "parts": to_serialize(parts), "timing": timing}


def _install(dask_worker=None):
    """client.run target: adds the handler to this worker's RPC server (bound to the worker)."""
    async def hipsched_top_k(**msg):   # distributed's server logs its handlers by __name__
        return await _serve_top_k(dask_worker, **msg)
    dask_worker.handlers[HANDLER] = hipsched_top_k
    return True


_installed: set = set()   # (client id, worker address) where the handler was installed
_lock = threading.Lock()


def forget_workers(client=None) -> int:
    """Forgets on which workers of `client` (or of any client) the handler was installed; the next
    search installs it again where needed. search calls this itself when a worker fails to answer."""
    with _lock:
        gone = {key for key in _installed if client is None or key[0] == client.id}
        _installed.difference_update(gone)
    return len(gone)


def search(q, T, k, *, split_every: int = SPLIT_EVERY, timeout: float | None = None):
    """top_k(q, T, k) computed now, as NumPy (indices int64, scores float32), (k',) or (m, k'): equal to
    dask.compute(*hipsched.dask.top_k(q, T, k)), bit for bit. For a persisted corpus every worker that
    holds chunks gets one request (its handler installed on first use) and scans the chunks it holds in
    place, on its own threads; the client merges the candidate lists. For a lazy corpus, a Dask query,
    or whenever that cannot give the answer (a worker gone, no reply within `timeout` seconds when one
    is given, a chunk still not where a placement read again says), the query runs as top_k's task graph
    instead (Dask reruns and recomputes there), the stale placement is dropped, and the reason is logged
    on the "hipsched.dask" logger. A chunk not where the cached placement says makes the placement be
    read again (who_has) and the direct query asked once more first. Needs a synchronous client (an asynchronous one: await client.compute(
    hipsched.dask.top_k(...)))."""
    qd, T = _corpus(q, T, "top_k")
    k = int(finite_scalar(k, "top_k", "k", lo=1, integer=True))
    check_split_every(split_every)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"hipsched.dask.search: timeout must be a positive number of seconds or None, got {timeout!r}")
    live = [i for i, r in enumerate(T.chunks[0]) if r]
    p, futs = placement(T, live) if live else (None, None)
    if p is None:   # a corpus held by an asynchronous client has no cached placement either
        _refuse_asynchronous(T)
    # a Dask query stays a graph input (computing it first would be a round trip of its own)
    if p is not None and not isinstance(q, da.Array) and (qd.ndim == 1 or qd.shape[0] > 0):
        out = _direct(q, T, k, split_every, p, futs, timeout)
        if out is _MOVED:
            # a chunk moved since the placement was read (a rebalance, a retirement, or Dask's active
            # memory manager dropping the replica the plan chose): one who_has, and the query again
            search_stats["rereads"] += 1
            p, futs = placement(T, live)
            out = _direct(q, T, k, split_every, p, futs, timeout) if p is not None else None
        if out is not None and out is not _MOVED:
            search_stats["direct"] += 1
            return out
    search_stats["graph"] += 1
    arrays = top_k(q, T, k, split_every=split_every)
    if futs:   # persisted: computed by the client that holds it, default or not
        client = next(iter(futs.values())).client
        return tuple(client.compute(list(arrays), sync=True))
    return tuple(dask.compute(*arrays))


def _refuse_asynchronous(T):
    futs = futures_of(T)
    client = futs[0].client if futs else None
    if client is not None and getattr(client, "asynchronous", False):
        raise TypeError("hipsched.dask.search computes now and needs a synchronous client; with an asynchronous "
                        "one, await client.compute(list(hipsched.dask.top_k(q, T, k)))")


async def _ask_all(client, requests, timeout):
    """{worker: reply} for {worker: message}, all at once: straight to each worker when the client
    talks to workers directly, else relayed by the scheduler."""

    async def ask(address, msg):
        msg = {key: to_serialize(v) if isinstance(v, np.ndarray) else v for key, v in msg.items()}
        if client.direct_to_workers:
            return await getattr(client.rpc(address), HANDLER)(**msg)
        return await client.scheduler.proxy(msg={"op": HANDLER, **msg}, worker=address)
    replies = await asyncio.wait_for(asyncio.gather(*(ask(a, m) for a, m in requests.items())), timeout)
    return dict(zip(requests, replies))


def _direct(q, T, k, split_every, p, futs, timeout=None):
    global last_timing
    last_timing = {}   # a query that falls back leaves none
    client = next(iter(futs.values())).client
    qa = as_float(q, "top_k", "q", allow_device=False)
    per_worker: dict = {}
    for group, _ in held_plans(T, p):
        per_worker.setdefault(group.worker, []).append((group.keys, group.offsets))
    try:
        with _lock:
            new = [w for w in per_worker if (client.id, w) not in _installed]
        if new:
            client.run(_install, workers=new)
            with _lock:
                _installed.update((client.id, w) for w in new)
                search_stats["installs"] += len(new)
        requests = {w: {"q": qa, "k": k, "groups": groups, "split_every": split_every} for w, groups in per_worker.items()}
        t0 = time.perf_counter()
        replies = client.sync(_ask_all, client, requests, timeout)
        wall = time.perf_counter() - t0
        parts = [part for w in per_worker for part in _parts(replies[w])]
        # one assignment: a concurrent reader sees one query's timings, whole
        last_timing = {"wall_s": wall, "workers": {w: replies[w].get("timing") for w in per_worker}}
    except _Stale:      # a chunk was not where the placement said
        logger.info("hipsched.dask.search: a chunk was not where the placement says; the placement is read again "
                    "(and if that fails too, the query runs as the task graph)")
        forget_placements(T)
        return _MOVED
    except (OSError, _NoHandler, asyncio.TimeoutError) as e:
        # a worker gone, restarted without the handler, or not answering: the graph path reruns what it must
        # the message only, not the exception: its traceback would keep this call's frames (and the corpus's
        # futures) alive wherever the record is kept
        logger.warning("hipsched.dask.search: a worker did not answer (%s); this query runs as the task graph", repr(e))
        forget_placements(T)
        forget_workers(client)
        return None
    except Exception as e:   # anything else is a defect: said loudly, and the graph still answers
        logger.warning("hipsched.dask.search: the direct path failed; this query runs as the task graph\n%s",
                       "".join(traceback.format_exception(e)))
        forget_placements(T)
        return None
    return merged(parts, k)


class _Stale(Exception):
    """A worker's reply: a planned chunk is not in its memory."""


class _NoHandler(Exception):
    """A worker's reply that is not the handler's (no handler of that name there: a restarted worker)."""


def _parts(reply):
    if not isinstance(reply, dict) or reply.get("status") != "OK" or "parts" not in reply:
        raise _NoHandler(f"{HANDLER}: {reply!r}"[:200])
    parts = reply["parts"]
    if parts is None:
        raise _Stale()
    return parts
