"""A Splitter whose plan ignores the model: every call the executor lets through (a cost-model decision
on host data) is cut at set shares of its rows, so the tests see splits at shares they choose."""
from hipsched.ops import OPS
from hipsched.splitting import SplitPlan, Splitter


class ForcedSplitter(Splitter):
    gpu_shares = (0.4,)   # one per GPU side, in the splitter's order (the executor's GPU first); the CPU the rest

    def plan(self, call, slot, pc, pg, h2d, d2h):
        spec = OPS.get(call.op)
        part = spec.partition(call) if spec is not None and spec.partition is not None else None
        if part is None:
            return None
        sides = self.sides
        shares = [1.0 - sum(self.gpu_shares), *self.gpu_shares]
        bounds, acc = [0], 0.0
        for f in shares[:-1]:
            acc += f
            bounds.append(min(max(bounds[-1] + 1, int(round(acc * part.rows))), part.rows - (len(shares) - len(bounds))))
        bounds.append(part.rows)
        if any(hi <= lo for lo, hi in zip(bounds, bounds[1:])):
            return None
        slots = {s.name: s.core.slot(call.op, call.dtype) for s in self.others}
        return SplitPlan(part, sides, bounds, 1.0, {s.name: 1.0 for s in sides}, slots=slots)


def force_split(ex, share):
    """Make `ex` (an Executor with a GPU) cut every splittable call at `share` of its rows for the GPU
    (a list: one share per GPU, the executor's first). Give it exploration_share=0 so that every call
    reaches the cost model, where splits are planned."""
    s = ForcedSplitter(ex._core, ex._cpu, ex._gpu, 0.0, ex._record_split, ex._other_gpus, ex._device_core)
    s.gpu_shares = tuple(share) if isinstance(share, (list, tuple)) else (share,)
    assert len(s.gpu_shares) == 1 + len(s.others), "one share per GPU"
    ex._fast.splitter = s
    return ex
