"""Where a persisted corpus's chunks live, cached between top_k queries: read once from the scheduler
(client.nthreads, client.who_has), cut into one run of chunks per worker thread, and read again when it
is older than PLACEMENT_TTL_S, when a group task reports on PLACEMENT_TOPIC that it ran away from its
planned worker or missed a chunk there, or when forget_placements drops it. hipsched.dask.ops builds
top_k's graph from it. See docs/guide/distributed.md."""
from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict

import dask
import numpy as np
from distributed import futures_of


def runs(items, rows, parts):
    """`items` cut into at most `parts` consecutive runs of about equal rows, none empty."""
    n = len(items)
    parts = max(1, min(int(parts), n))
    cum = np.cumsum(rows)
    bounds, prev = [0], 0
    for p in range(1, parts):
        cut = int(np.searchsorted(cum, cum[-1] * p / parts)) + 1   # after the item that reaches the share
        cut = min(max(cut, prev + 1), n - (parts - p))             # at least one item per run
        bounds.append(cut)
        prev = cut
    bounds.append(n)
    return [items[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


PLACEMENT_TTL_S = 30.0           # a cached placement is read again (who_has) once it is this old
PLACEMENT_TOPIC = "hipsched-placement"   # a group task that ran away from its planned worker says so here
PLACEMENT_CACHE_SIZE = 32        # corpora remembered per process (keys and addresses only, no data)


class _Placement:
    """Where a persisted corpus's chunks were (client.who_has) and the group tasks made from it: what
    top_k reuses between queries instead of asking the scheduler again. Holds keys and addresses only,
    never a Future, so it keeps nothing alive on the cluster."""

    __slots__ = ("groups", "anchors", "made", "plans", "token", "holders")

    def __init__(self, groups, anchors, made, holder):
        self.groups, self.anchors, self.made = groups, anchors, made
        self.token = dask.base.tokenize(groups, anchors)   # in the graph's keys: other groups, other keys
        self.plans = None   # (ChunkGroup, its anchor chunk's TaskRef) per group, built on first use
        # the Futures of the first live chunk seen since who_has was read, weakly: while one of them
        # lives, the client has held the key throughout; once all are gone the corpus may have been
        # released and persisted again under the same keys (da.from_array names chunks by content), its
        # chunks placed anew. (A Future compares by identity.) Not covered: keys released by hand
        # (Future.release, client.cancel) or client.restart while an old handle lives; a stale plan then
        # costs one query's fallback, never the answer.
        self.holders = weakref.WeakSet((holder,))

    def held_since(self, fut) -> bool:
        """Whether the chunks can be where they were read: `fut` (the first live chunk's Future now) or
        another handle on the same key seen since then has lived throughout. Under _placement_lock."""
        if fut in self.holders:
            return True
        if not self.holders:
            return False
        self.holders.add(fut)
        return True


_placements: OrderedDict = OrderedDict()   # (client id, corpus name, row chunks) -> _Placement
_placement_lock = threading.Lock()
_subscribed: set = set()                   # ids of the clients whose PLACEMENT_TOPIC events we follow
placement_stats = {"lookups": 0, "refreshes": 0, "invalidations": 0}   # read by the tests and the bench


def forget_placements(corpus=None) -> int:
    """Drops the cached placement of the persisted corpus named `corpus` (a Dask array or its name), or
    of every corpus; the next top_k over it reads who_has again. Returns how many entries went. top_k
    calls this itself when a group task reports that it ran on a worker other than the planned one (the
    worker left, or the chunks moved), and re-reads a placement older than PLACEMENT_TTL_S."""
    name = getattr(corpus, "name", corpus)
    return _drop(lambda key: name is None or key[1] == name)


def _drop(matches) -> int:
    """Drops the cached placements whose key (client id, corpus name, row chunks) `matches`."""
    with _placement_lock:
        gone = [key for key in _placements if matches(key)]
        for key in gone:
            del _placements[key]
        placement_stats["invalidations"] += len(gone)
    return len(gone)


def _event_message(event):
    """The message of a subscribed event: (timestamp, message) from distributed, or the message."""
    return event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else event


def _on_placement_event(event):
    """PLACEMENT_TOPIC handler (the client's event loop): a group task ran away from its worker."""
    msg = _event_message(event)
    forget_placements(msg.get("corpus") if isinstance(msg, dict) else None)


def _on_worker_event(client_id, event):
    """A worker's own topic (its address; the client's event loop): a worker that left takes its chunks
    with it, so every placement this client cached may name it; they are read again on their next query
    (a request to a departed worker's address would wait for the connect timeout before failing)."""
    msg = _event_message(event)
    if isinstance(msg, dict) and msg.get("action") == "remove-worker":
        _drop(lambda key: key[0] == client_id)


def _follow_placement_events(client):
    if client.id in _subscribed:
        return
    _subscribed.add(client.id)
    try:
        client.subscribe_topic(PLACEMENT_TOPIC, _on_placement_event)
    except Exception:   # a client that cannot subscribe still gets the TTL's refresh
        pass


_followed_workers: set = set()   # (client id, worker address) whose remove-worker event we follow


def _follow_workers(client, addresses):
    for address in addresses:
        if (client.id, address) in _followed_workers:
            continue
        _followed_workers.add((client.id, address))
        try:
            client.subscribe_topic(address, lambda event, cid=client.id: _on_worker_event(cid, event))
        except Exception:
            pass


def _persisted_client(T, live):
    """The synchronous client holding every live chunk of T as a future, else None (a lazy corpus, or an
    asynchronous client, whose calls would return coroutines: it is grouped as a lazy corpus)."""
    keys = T.__dask_keys__()
    futs = {f.key: f for f in futures_of(T)}
    if not futs or any(keys[i][0] not in futs for i in live):
        return None, None
    client = next(iter(futs.values())).client
    if client is None or getattr(client, "asynchronous", False):
        return None, None
    return client, futs


def _read_placement(client, futs, T, live):
    """Groups of a persisted corpus by where its chunks live: each worker's chunks (client.who_has), cut
    into one consecutive run per worker thread, so every chunk is read where it is; and per group its
    anchor, the position in the run of the chunk its task depends on: one that only the group's worker
    holds where there is one, so Dask, which runs the task where its dependency is, cannot pick another
    holder of a replicated chunk."""
    keys = T.__dask_keys__()
    nthreads = client.nthreads()
    if not nthreads:
        return None
    who = client.who_has([futs[keys[i][0]] for i in live])
    rows = T.chunks[0]
    load = {w: 0 for w in nthreads}
    mine = {w: [] for w in nthreads}
    for i in live:
        holders = [w for w in who.get(keys[i][0], ()) if w in load] or list(load)   # lost: Dask recomputes it
        w = min(holders, key=lambda a: load[a])   # a replicated chunk goes to its least loaded holder
        mine[w].append(i)
        load[w] += rows[i]
    groups, anchors = [], []
    for w, idx in mine.items():
        for run in (runs(idx, [rows[i] for i in idx], nthreads[w]) if idx else []):
            groups.append((w, run))
            anchors.append(next((j for j, i in enumerate(run) if tuple(who.get(keys[i][0], ())) == (w,)), 0))
    return groups, anchors


def placement(T, live):
    """(the cached _Placement of a persisted corpus, read again when missing, older than PLACEMENT_TTL_S
    or dropped by forget_placements; T's futures) or (None, None) when T is not a persisted corpus."""
    client, futs = _persisted_client(T, live)
    if client is None:
        return None, None
    _follow_placement_events(client)
    key = (client.id, T.name, tuple(T.chunks[0]))
    now = time.monotonic()
    first = futs[T.__dask_keys__()[live[0]][0]]
    with _placement_lock:
        placement_stats["lookups"] += 1
        p = _placements.get(key)
        if p is not None and now - p.made < PLACEMENT_TTL_S and p.held_since(first):
            _placements.move_to_end(key)
            return p, futs
    placed = _read_placement(client, futs, T, live)
    if placed is None:
        return None, None
    _follow_workers(client, {w for w, _ in placed[0]})
    p = _Placement(*placed, now, first)
    with _placement_lock:
        placement_stats["refreshes"] += 1
        _placements[key] = p
        while len(_placements) > PLACEMENT_CACHE_SIZE:
            _placements.popitem(last=False)
    return p, futs
