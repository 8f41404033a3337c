"""The single-machine ops on Dask arrays (one concept over 500 lines: the row-chunked ops as graphs, each
built the same way): every chunk runs through its worker's Executor (workers.executor),
so each worker picks its own CPU or GPU per chunk. Inputs are checked on the client, before any task
is built. See docs/guide/distributed.md for what each op moves and what equality to expect."""
from __future__ import annotations

import numbers
import uuid

import dask
import dask.array as da
import numpy as np
from dask.core import get_dependencies, istask
from dask.highlevelgraph import HighLevelGraph
from dask.local import get_sync
from dask.sizeof import sizeof
from distributed import Future, get_worker, worker_client
from distributed.client import default_client
from distributed.spill import SpillBuffer

from ..broadcast import bias_fits
from ..ops.validation import HALF, as_float, check_ndim, contiguous_aligned, finite_scalar, shape_mismatch
from ..ops.elementwise import GELU_FORMS, ROPE_STYLES, _real_scalar, _rope_positions, rope_parameter
from ..ops.similarity import merge_top_k
from .placement import PLACEMENT_TOPIC, placement, runs
from .workers import executor

SPLIT_EVERY = 8   # fan-in of the top-k merge tree: 40 chunks merge in two levels


# ---------------------------------------------------------------------------------------- validation
def _dask(x, op, arg):
    if not isinstance(x, da.Array):
        raise TypeError(f"hipsched.dask.{op}: argument {arg!r} must be a dask array, got {type(x).__name__} "
                        f"(dask.array.from_array(x, chunks=...) makes one; hipsched.{op} takes NumPy arrays)")
    return x


def _dtype_ok(x, op, arg):
    """The single-machine op's dtype check (TypeError naming op and argument), on an empty stand-in:
    float32, float16, bfloat16 and the real types that convert to float32."""
    as_float(np.empty((0,) * max(1, x.ndim), dtype=x.dtype), op, arg, allow_device=False)


def result_dtype(*arrays):
    """The dtype the single-machine ops that keep half precision (add, scale, softmax, matmul, attention)
    return for these inputs (ops/validation.py's as_float and promote): float16 or bfloat16 when every input
    has that one type, float32 otherwise. A Dask array must declare it: its chunks will have it."""
    names = {np.dtype(a.dtype).name for a in arrays}
    if len(names) == 1 and names <= set(HALF):
        return np.dtype(arrays[0].dtype).newbyteorder("=")   # the kernels read native halves
    return np.dtype(np.float32)


def _one_block_query(q, op):
    """q as a one-chunk Dask array (it is sent whole to every task that needs it, once per worker)."""
    if isinstance(q, da.Array):
        _dtype_ok(q, op, "q")
        return q.rechunk(q.shape) if q.numblocks != (1,) * q.ndim else q
    q = as_float(q, op, "q", allow_device=False)
    return da.from_array(q, chunks=q.shape, name=f"hipsched-query-{dask.base.tokenize(q)}")


def _corpus(q, T, op):
    """Checks q (d,) or (m, d) against T (n, d) chunked by rows only; returns (q as one block, T)."""
    T = _dask(T, op, "T")
    q_arr = _one_block_query(q, op)
    check_ndim(q_arr, (1, 2), op, "q")
    check_ndim(T, (2,), op, "T")
    _dtype_ok(T, op, "T")
    if q_arr.shape[-1] != T.shape[1]:
        raise shape_mismatch(op, "q", q_arr.shape, "T", T.shape, "q's last axis must equal T's second (the dimension d)")
    if len(T.chunks[1]) > 1:
        # Each row's score needs the whole row; rechunking here would move the whole corpus over the
        # network on every call, so the caller decides (once) to do it.
        raise ValueError(f"hipsched.dask.{op}: T {T.shape} is chunked along d (chunks {T.chunks[1]}); the corpus "
                         f"must be chunked by rows only: T = T.rechunk({{1: -1}}) once (and persist it)")
    if any(np.isnan(c) for c in T.chunks[0]):
        raise ValueError(f"hipsched.dask.{op}: T has unknown chunk sizes; call T.compute_chunk_sizes() first")
    return q_arr, T


# ---------------------------------------------------------------------------------------- cosine and top-k
def _cos_block(qb, tb):
    return executor().cosine_similarity(qb, tb)


def cosine_similarity(q, T):
    """hipsched.cosine_similarity on a Dask corpus T (n, d) chunked by rows -> a Dask array (n,) or
    (m, n) chunked as T's rows. Each chunk's scores equal the single-machine op's for those rows (the
    kernel scores each row on its own) when q has at most 12 rows; see docs/guide/distributed.md."""
    qd, T = _corpus(q, T, "cosine_similarity")
    if qd.ndim == 1:
        return da.blockwise(_cos_block, "n", qd, "d", T, "nd", dtype=np.float32, concatenate=True,
                            name="hipsched-cosine_similarity-" + dask.base.tokenize(qd, T))
    return da.blockwise(_cos_block, "mn", qd, "md", T, "nd", dtype=np.float32, concatenate=True,
                        name="hipsched-cosine_similarity-" + dask.base.tokenize(qd, T))


def check_split_every(split_every):
    if isinstance(split_every, bool) or not isinstance(split_every, numbers.Integral) or split_every < 2:
        raise ValueError(f"hipsched.dask.top_k: split_every must be an integer >= 2, got {split_every!r}")


def merged(parts, k):
    """The one candidate list of `parts` (one or more lists)."""
    return parts[0] if len(parts) == 1 else merge_top_k(parts, k)


def scan_top_k(ex, q, k, blocks, split_every):
    """Candidate lists of (offset, chunk) `blocks`: each chunk through executor `ex`, its indices offset
    to the whole corpus; merged as they come, so fewer than `split_every` lists are held at a time."""
    parts = []
    for off, block in blocks:
        idx, val = ex.top_k(q, block, k)
        parts.append((idx + np.int64(off), val))
        if len(parts) >= split_every:
            parts = [merge_top_k(parts, k)]
    return parts


def _merge(k, *parts):
    return merge_top_k(parts, k)


def _merge_part(k, part, *parts):
    return merged(parts, k)[part]


# ---------------------------------------------------------------------------------------- grouping
class ChunkGroup:
    """The chunks one grouped task reads, in corpus order (opaque to Dask: it never looks inside, so the
    chunk keys and the subgraph it carries are data, not dependencies).

    `offsets[i]` is chunk i's first row in the whole corpus; `sources[i]` says where the task gets it:
    ("arg", j), its j-th chunk argument (a chunk Dask computed or holds already: a persisted chunk is
    read in place on the worker that holds it), or ("graph", key), computed inside the task from
    `graph[key]`, the chunk's own subgraph (a lazy chunk whose tasks no other chunk shares: it is made,
    scanned and dropped there, so it never crosses the network and one at a time is in memory).
    A persisted corpus's group (_topk_held) has `keys` instead, the chunks' keys, which it reads from
    its worker's memory; `worker` is the worker it was planned for and `corpus` the corpus's name: a
    group that runs anywhere else, or misses a chunk there, reports it (PLACEMENT_TOPIC), so the client
    reads the placement again."""

    __slots__ = ("offsets", "sources", "graph", "worker", "corpus", "keys", "anchor")

    def __init__(self, offsets, sources=(), graph=None, worker=None, corpus=None, keys=None, anchor=0):
        self.offsets, self.sources, self.graph, self.worker = tuple(offsets), tuple(sources), graph, worker
        self.corpus, self.keys, self.anchor = corpus, (tuple(keys) if keys is not None else None), anchor

    def __len__(self):
        return len(self.offsets)

    def __repr__(self):
        return f"ChunkGroup({len(self)} chunks, first rows {self.offsets[:4]}..., worker={self.worker!r})"

    def chunks(self, args):
        """(offset, chunk) pairs, one chunk at a time."""
        for off, (kind, ref) in zip(self.offsets, self.sources):
            if kind == "arg":
                yield off, args[ref]
            else:
                yield off, get_sync(self.graph[ref], ref)


def held_chunk(worker, key):
    """Chunk `key` from this worker's memory (KeyError if it is not there), its buffer made aligned in
    place the first time: a chunk that reached the worker inside a pickled graph (da.from_array of a
    NumPy array, say) starts wherever it fell in that message, and every op would copy it again on every
    query (under the nanny's MALLOC_TRIM_THRESHOLD_ each copy also faults in fresh pages: 42 -> 310 us
    per top_k of a 1000 x 64 chunk). The aligned copy replaces it under the same key (same bytes, same
    size), once. The swap runs on the worker's event loop, where the worker's state machine changes
    worker.data, and only while the key is still in memory there and still holds this array: from this
    thread it could put back a key the worker had just released."""
    data = worker.data
    block = None
    if type(data) is SpillBuffer:   # its memory part, without the per-read metrics (8 -> 1 us)
        block = data.fast.get(key)   # (other mappings' `fast`, dask-cuda's, may not hold arrays)
    if block is None:   # spilled (the buffer reads it back from disk), another mapping, or not here
        block = data[key]
    if isinstance(block, np.ndarray) and not block.flags.aligned:
        fixed = contiguous_aligned(block)
        worker.loop.add_callback(_swap_in, worker, key, block, fixed)
        block = fixed
    return block


def _swap_in(worker, key, old, new):
    ts = worker.state.tasks.get(key)
    if ts is None or ts.state != "memory":
        return
    try:
        if worker.data[key] is old:
            worker.data[key] = new
    except KeyError:
        pass


def _report(worker, group, why):
    worker.log_event(PLACEMENT_TOPIC, {"corpus": group.corpus, "planned": group.worker, "ran": worker.address,
                                       "why": why})


class _ClientOnly:
    """Keeps the corpus's futures alive with the graph on the client (so its chunks outlive a `del T`
    before the compute, as dependencies would); pickled, as when the graph goes to the scheduler, it is
    None: the tasks never see it and Dask never takes the futures for dependencies."""

    __slots__ = ("refs",)

    def __init__(self, refs):
        self.refs = refs

    def __reduce__(self):
        return (type(None), ())


def _topk_held(q, k, group, split_every, first, _keep=None):
    """A persisted corpus's group task: `first`, its anchor chunk (keys[anchor]), is its one dependency
    (so Dask runs it where that chunk lives, the planned worker); the others are read from this worker's memory in
    place (worker.data: no copy, and no dependency for the scheduler and the worker to track per chunk).
    A chunk that is not here (moved, or lost with a worker and not yet recomputed) is scanned where it
    is by a task of its own (_rescue) and only its k candidates come back; the placement is then
    reported stale. Same result as _topk_group over the same chunks."""
    try:
        worker = get_worker()
    except ValueError:
        raise RuntimeError("hipsched.dask.top_k: a persisted corpus's group task ran outside a distributed worker; "
                           "compute it with the distributed client that holds the corpus") from None
    if worker.address != group.worker:
        _report(worker, group, "elsewhere")
    missing = []

    def here():
        for j, (off, key) in enumerate(zip(group.offsets, group.keys)):
            if j == group.anchor and (not isinstance(first, np.ndarray) or first.flags.aligned):
                yield off, first
                continue
            try:
                block = held_chunk(worker, key)
            except KeyError:
                missing.append(j)
                continue
            yield off, block
    parts = scan_top_k(executor(), q, k, here(), split_every)
    if missing:
        _report(worker, group, "missing")
        parts.extend(_rescue(q, k, group, missing, split_every))
    return merged(parts, k)


def _rescue(q, k, group, missing, split_every):
    """The top k of the chunks `missing` (indices into the group) where they are: one task per chunk,
    each depending on its chunk's key, so Dask runs it on a holder (or recomputes a lost chunk first);
    submitted from this task through worker_client, which frees this worker's thread while it waits."""
    # deferred: dask._task_spec is private and newer than the oldest dask the extra allows
    from dask._task_spec import Task, TaskRef
    tag = uuid.uuid4().hex
    dsk = {}
    for j in missing:
        key = (f"hipsched-top_k-rescue-{tag}", j)
        sub = ChunkGroup([group.offsets[j]], [("arg", 0)])
        dsk[key] = Task(key, _topk_group, q, k, sub, split_every, TaskRef(group.keys[j]))
    with worker_client() as client:
        return client.get(dsk, list(dsk))


def _topk_group(q, k, group, split_every, *args):
    """One task's share of a top_k: each of its chunks through this worker's executor (the chunk read in
    place, no copy), indices offset to the whole corpus, merged into one candidate list."""
    return merged(scan_top_k(executor(), q, k, group.chunks(args), split_every), k)


GROUPS_PER_THREAD = 2   # a lazy corpus: consecutive runs of chunks, this many per worker thread


def _default_threads():
    """Worker threads of the default distributed client, else this machine's CPU count (the threaded
    scheduler's pool)."""
    try:
        return max(1, sum(default_client().nthreads().values()))
    except (ImportError, ValueError, OSError):
        return max(1, int(dask.system.CPU_COUNT or 1))


EMBED_SHARED_BYTES = 1 << 20   # a lazy chunk's shared plain-data input up to this size is copied into its group


def _lazy_sources(T, live):
    """{chunk index: its subgraph} for the lazy chunks a grouped task can make itself: every task it
    needs is its own (no other chunk shares it) and no input is a Future (persisted data); shared
    inputs that are plain data of at most EMBED_SHARED_BYTES (a zarr array handle, say) are copied in.
    The other chunks are left to Dask (computed as the array's own tasks, passed to the group)."""
    dsk = dict(T.__dask_graph__())
    keys = T.__dask_keys__()
    closure, users = {}, {}
    for i in live:
        root = keys[i][0]
        seen, stack = set(), [root]
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            users.setdefault(key, set()).add(i)
            v = dsk.get(key)
            if v is None or isinstance(v, Future):
                seen.add(None)   # not in this graph, or persisted: Dask must provide it
                continue
            stack.extend(get_dependencies(dsk, key))
        closure[i] = seen
    out = {}
    for i, seen in closure.items():
        if None in seen:
            continue
        if all(len(users[key]) == 1 or (not istask(dsk[key]) and sizeof(dsk[key]) <= EMBED_SHARED_BYTES)
               for key in seen):
            out[i] = {key: dsk[key] for key in seen}
    return out


def chunk_groups(T, groups_per_thread=None):
    """How top_k groups T's row chunks into tasks: a list of (worker address or None, [chunk indices]).
    Persisted (every chunk a future): one group per worker thread, of the chunks that worker holds (the
    placement is cached between calls: see forget_placements). Lazy: consecutive runs of about equal
    rows, `groups_per_thread` (GROUPS_PER_THREAD) per thread of the default client's workers (or per
    CPU without one). Chunks with no rows are left out."""
    live = [i for i, r in enumerate(T.chunks[0]) if r]
    if not live:
        return []
    p, _ = placement(T, live)
    if p is not None:
        return list(p.groups)
    return _lazy_groups(T, live, groups_per_thread)


def _lazy_groups(T, live, groups_per_thread=None):
    per = GROUPS_PER_THREAD if groups_per_thread is None else groups_per_thread
    return [(None, run) for run in runs(live, [T.chunks[0][i] for i in live], per * _default_threads())]


def top_k(q, T, k, *, split_every: int = SPLIT_EVERY):
    """hipsched.top_k on a Dask corpus T (n, d) chunked by rows -> (indices int64, scores float32) as
    Dask arrays, (k',) or (m, k') with k' = min(k, n). The chunks are grouped (chunk_groups): a
    persisted corpus into one task per worker thread over the chunks that worker holds, a lazy one into
    consecutive runs, a few per thread; each task runs every chunk of its group through its worker's
    Executor (reading the chunk in place), offsets the indices to the whole corpus and keeps one top-k
    list; a merge tree of fan-in `split_every` joins the groups. Every merge keeps the single-machine
    order (ties on the lower index, NaN last), so the result is the same however the chunks are grouped:
    equal to hipsched.top_k on the computed corpus, bit for bit when q has at most 12 rows (see
    docs/guide/distributed.md)."""
    qd, T = _corpus(q, T, "top_k")
    k = int(finite_scalar(k, "top_k", "k", lo=1, integer=True))
    check_split_every(split_every)
    n = int(T.shape[0])
    kk = min(k, n)
    out_shape = (kk,) if qd.ndim == 1 else (int(qd.shape[0]), kk)
    if kk == 0 or (qd.ndim == 2 and qd.shape[0] == 0):
        return (da.zeros(out_shape, dtype=np.int64, chunks=out_shape),
                da.zeros(out_shape, dtype=np.float32, chunks=out_shape))
    # A NumPy query goes into every grouped task as data (a few KB), not as a key: a task whose only
    # input is the query would otherwise follow the query's bytes, and every lazy group would run on the
    # one worker holding it. A Dask query stays a dependency.
    # The keys name the grouping too: a placement read afresh (or another thread count) makes other
    # groups, which must not take the keys of a previous query's groups still held on the cluster.
    live = [i for i, r in enumerate(T.chunks[0]) if r]
    p, futs = placement(T, live)
    if p is not None:
        return _top_k_held(q, qd, T, k, split_every, out_shape, dask.base.tokenize(qd, T, k, split_every, p.token),
                           p, futs)
    q_arg = qd.to_delayed().ravel()[0] if isinstance(q, da.Array) else as_float(q, "top_k", "q", allow_device=False)
    groups = _lazy_groups(T, live)
    token = dask.base.tokenize(qd, T, k, split_every, groups)
    offsets = _offsets(T)
    handles = T.to_delayed(optimize_graph=False).ravel()
    inline = _lazy_sources(T, [i for _, run in groups for i in run])
    keys = T.__dask_keys__()
    task = dask.delayed(_topk_group, pure=True)
    level = []
    for g, (worker, run) in enumerate(groups):
        sources, args, graph = [], [], {}
        for i in run:
            if i in inline:
                graph[keys[i][0]] = inline[i]
                sources.append(("graph", keys[i][0]))
            else:
                sources.append(("arg", len(args)))
                args.append(handles[i])
        group = ChunkGroup([offsets[i] for i in run], sources, graph or None, worker)
        level.append(task(q_arg, k, group, split_every, *args, dask_key_name=(f"hipsched-top_k-group-{token}", g)))
    merge = dask.delayed(_merge, pure=True)
    depth = 0
    while len(level) > split_every:
        depth += 1
        level = [merge(k, *level[j:j + split_every], dask_key_name=(f"hipsched-top_k-merge{depth}-{token}", j))
                 for j in range(0, len(level), split_every)]
    # The root merge runs twice, once per output (indices, scores), each a merge of a few lists of k: one
    # hop less than a merge and a getitem per output, which is what a query waits for at its end.
    root = dask.delayed(_merge_part, pure=True)
    idx, val = (da.from_delayed(root(k, part, *level, dask_key_name=f"hipsched-top_k-{what}-root-{token}"),
                                shape=out_shape, dtype=dtype, name=f"hipsched-top_k-{what}-{token}")
                for part, what, dtype in ((0, "indices", np.int64), (1, "scores", np.float32)))
    return idx, val


def held_plans(T, p):
    """(ChunkGroup, its anchor chunk's TaskRef) per group of placement `p` of persisted corpus T: the
    chunk keys and offsets each group reads, built once per placement (top_k's graph and search's
    requests both read them)."""
    if p.plans is None:
        # deferred: dask._task_spec is private and newer than the oldest dask the extra allows
        from dask._task_spec import TaskRef
        keys = T.__dask_keys__()
        offsets = _offsets(T)
        p.plans = [(ChunkGroup([offsets[i] for i in run], (), None, worker, T.name, [keys[i][0] for i in run], a),
                    TaskRef(keys[run[a]][0])) for (worker, run), a in zip(p.groups, p.anchors)]
    return p.plans


def _offsets(T):
    """Each row chunk's first row in the whole corpus."""
    return np.concatenate([[0], np.cumsum(T.chunks[0])])[:-1].tolist()


def _top_k_held(q, qd, T, k, split_every, out_shape, token, p, futs):
    """top_k over a persisted corpus from its cached placement: the graph written directly (one task per
    group over the chunk keys its worker holds, the merge tree, one root per output whose key is the
    output array's chunk), without who_has, delayed objects or per-chunk handles: about a millisecond
    on the client whatever the chunking."""
    # deferred: dask._task_spec is private and newer than the oldest dask the extra allows
    from dask._task_spec import Task, TaskRef
    deps = []
    if isinstance(q, da.Array):
        q_arg = TaskRef(qd.__dask_keys__()[0] if qd.ndim == 1 else qd.__dask_keys__()[0][0])
        deps.append(qd)
    else:
        # A NumPy query travels inside each group task as data (a few KB)
        q_arg = as_float(q, "top_k", "q", allow_device=False)
    keep = _ClientOnly(list(futs.values()))
    gname = f"hipsched-top_k-group-{token}"
    layer, level = {}, []
    for g, (group, first) in enumerate(held_plans(T, p)):
        key = (gname, g)
        layer[key] = Task(key, _topk_held, q_arg, k, group, split_every, first, keep)
        level.append(key)
    depth = 0
    while len(level) > split_every:
        depth += 1
        nxt = []
        for j in range(0, len(level), split_every):
            key = (f"hipsched-top_k-merge{depth}-{token}", j)
            layer[key] = Task(key, _merge, k, *[TaskRef(x) for x in level[j:j + split_every]])
            nxt.append(key)
        level = nxt
    # Of T's graph only the groups' anchor chunks go in (the futures, as a persisted array's own layer
    # holds them): the other chunks are not dependencies, so neither the client nor the scheduler nor
    # the workers handle a key per chunk per query.
    held = f"hipsched-top_k-held-{token}"
    hg = HighLevelGraph.from_collections(gname, layer, dependencies=deps)
    layers, dependencies = dict(hg.layers), dict(hg.dependencies)
    layers[held] = {first.key: futs[first.key] for _, first in p.plans}
    dependencies[held] = set()
    dependencies[gname] = set(dependencies[gname]) | {held}
    hg = HighLevelGraph(layers, dependencies)
    out = []
    for part, what, dtype in ((0, "indices", np.int64), (1, "scores", np.float32)):
        name = f"hipsched-top_k-{what}-{token}"
        key = (name,) + (0,) * len(out_shape)
        layers = dict(hg.layers)
        layers[name] = {key: Task(key, _merge_part, k, part, *[TaskRef(x) for x in level])}
        dependencies = dict(hg.dependencies)
        dependencies[name] = {gname}
        out.append(da.Array(HighLevelGraph(layers, dependencies), name, tuple((s,) for s in out_shape), dtype=dtype))
    return tuple(out)


# ---------------------------------------------------------------------------------------- elementwise
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _as_dask_like(b, chunks, op, arg):
    """b (NumPy or Dask) chunked as `chunks` (the trailing chunks of the array it combines with)."""
    if isinstance(b, da.Array):
        _dtype_ok(b, op, arg)
        return b.rechunk(chunks) if b.chunks != tuple(chunks) else b
    b = as_float(b, op, arg, allow_device=False)
    return da.from_array(b, chunks=tuple(chunks))


def _add_block(ab, bb):
    return executor().add(ab, bb)


def add(a, b):
    """hipsched.add on Dask arrays, chunk by chunk through each worker's executor: b has a's shape or a
    trailing part of it (a bias), NumPy or Dask; it is rechunked to match a's chunks. Bit-identical to
    the single-machine op (one float32 add per element)."""
    a = _dask(a, "add", "a")
    _dtype_ok(a, "add", "a")
    sb = tuple(getattr(b, "shape", np.shape(b)))
    sa = tuple(a.shape)
    if not bias_fits(sa, sb):
        raise shape_mismatch("add", "a", sa, "b", sb, "b must have a's shape or a trailing part of it")
    b = _as_dask_like(b, a.chunks[a.ndim - len(sb):], "add", "b")
    ia = _LETTERS[:a.ndim]
    return da.blockwise(_add_block, ia, a, ia, b, ia[a.ndim - len(sb):], dtype=result_dtype(a, b),
                        name="hipsched-add-" + dask.base.tokenize(a, b))


def _scale_block(xb, alpha):
    return executor().scale(xb, alpha)


def scale(x, alpha):
    """hipsched.scale on a Dask array, chunk by chunk; bit-identical to the single-machine op."""
    x = _dask(x, "scale", "x")
    _dtype_ok(x, "scale", "x")
    alpha = _real_scalar(alpha, "scale", "alpha")
    return x.map_blocks(_scale_block, alpha, dtype=result_dtype(x), name="hipsched-scale-" + dask.base.tokenize(x, alpha))


def _softmax_block(xb, axis):
    return executor().softmax(xb, axis=axis)


def softmax(x, axis=-1):
    """hipsched.softmax on a Dask array along an unchunked `axis` (each chunk holds whole slices, so
    each is bit-identical to the single-machine op); a chunked axis is a ValueError naming the rechunk."""
    x = _dask(x, "softmax", "x")
    _dtype_ok(x, "softmax", "x")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"softmax: axis must be an integer, got {axis!r}")
    if x.ndim == 0:
        raise ValueError("softmax: x must have at least one dimension, got a 0-d array")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"softmax: axis {axis} is out of range for shape {tuple(x.shape)}")
    axis = int(axis) % x.ndim
    if len(x.chunks[axis]) > 1:
        raise ValueError(f"hipsched.dask.softmax: x {x.shape} is chunked along axis {axis} (chunks {x.chunks[axis]}); "
                         f"softmax needs whole slices: x = x.rechunk({{{axis}: -1}})")
    return x.map_blocks(_softmax_block, axis, dtype=result_dtype(x), name="hipsched-softmax-" + dask.base.tokenize(x, axis))


def _silu_mul_block(gb, ub):
    return executor().silu_mul(gb, ub)


def silu_mul(gate, up):
    """hipsched.silu_mul on Dask arrays, chunk by chunk through each worker's executor: up (NumPy or Dask)
    has gate's shape and is rechunked to gate's chunks. Each element is computed alone, so the result
    equals the single-machine op's wherever the chunk runs on the same kind of engine."""
    gate = _dask(gate, "silu_mul", "gate")
    _dtype_ok(gate, "silu_mul", "gate")
    su = tuple(getattr(up, "shape", np.shape(up)))
    if su != tuple(gate.shape):
        raise shape_mismatch("silu_mul", "gate", gate.shape, "up", su, "gate and up must have one shape")
    up = _as_dask_like(up, gate.chunks, "silu_mul", "up")
    ix = _LETTERS[:gate.ndim]
    return da.blockwise(_silu_mul_block, ix, gate, ix, up, ix, dtype=result_dtype(gate, up),
                        name="hipsched-silu_mul-" + dask.base.tokenize(gate, up))


def _gelu_block(xb, approximate):
    return executor().gelu(xb, approximate=approximate)


def gelu(x, approximate="none"):
    """hipsched.gelu on a Dask array, chunk by chunk (element by element: any chunking)."""
    if not isinstance(approximate, str) or approximate not in GELU_FORMS:
        raise ValueError(f"gelu: approximate must be one of {', '.join(repr(f) for f in GELU_FORMS)}, got {approximate!r}")
    x = _dask(x, "gelu", "x")
    _dtype_ok(x, "gelu", "x")
    return x.map_blocks(_gelu_block, approximate, dtype=result_dtype(x),
                        name="hipsched-gelu-" + dask.base.tokenize(x, approximate))


def _rope_block(xb, positions, base, scale, style, block_info=None):
    loc = block_info[0]["array-location"]
    s0, s1 = loc[-2]
    pos = positions[..., s0:s1] if positions.ndim == 1 else positions[loc[0][0]:loc[0][1], s0:s1]
    return executor().rope(xb, np.ascontiguousarray(pos), base=base, scale=scale, style=style)


def rope(x, positions, *, base=10000.0, scale=1.0, style="neox"):
    """hipsched.rope on a Dask x (batch, heads, seq, head_dim) or (heads, seq, head_dim), chunked along
    any axis but head_dim (a chunk must hold whole rows); positions a NumPy integer array, (seq,) or
    (batch, seq), of which each task gets its chunk's part. Rows are computed alone, so each chunk
    equals the single-machine op's result for those rows on the same kind of engine."""
    if not isinstance(style, str) or style not in ROPE_STYLES:
        raise ValueError(f"rope: style must be one of {', '.join(repr(s) for s in ROPE_STYLES)}, got {style!r}")
    base, scale = rope_parameter(base, "base"), rope_parameter(scale, "scale")
    x = _dask(x, "rope", "x")
    _dtype_ok(x, "rope", "x")
    if x.ndim not in (3, 4):
        raise ValueError(f"rope: x must be 4-d (batch, heads, seq, head_dim) or 3-d (heads, seq, head_dim), got "
                         f"shape {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"rope: head_dim (x's last axis) must be even, got {x.shape[-1]}")
    if len(x.chunks[-1]) > 1:
        raise ValueError(f"hipsched.dask.rope: x {x.shape} is chunked along head_dim (chunks {x.chunks[-1]}); each "
                         f"chunk needs whole rows: x = x.rechunk({{{x.ndim - 1}: -1}})")
    pos = _rope_positions(positions, tuple(x.shape))
    return x.map_blocks(_rope_block, pos, base, scale, style, dtype=result_dtype(x),
                        name="hipsched-rope-" + dask.base.tokenize(x, pos, base, scale, style))
