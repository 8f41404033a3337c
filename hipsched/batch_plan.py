"""Where a batch's calls go (hipsched/batch.py runs them): planning over predicted times alone, no
executor. `place` spreads independent calls over the CPU and the GPU (the fluid optimum of two
processors rounded to whole calls); `plan_graph` and `heft` place calls that depend on each other (HEFT:
the longest remaining path first, each call to the side where it finishes earliest, copies counted, idle
time filled), `fluid_sides` holding a graph of many parallel chains to the sides their relative speeds
give them (docs/design/scheduling.md, "Under load")."""
from __future__ import annotations

import bisect


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


def by_side(costs):
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
    fixed, both = by_side(costs)
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
