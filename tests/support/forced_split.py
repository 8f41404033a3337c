"""A Splitter whose plan ignores the model: every call the executor lets through (a cost-model decision
on host data) is cut at a set share of its rows, so the tests see splits at shares they choose."""
from hipsched.ops import OPS
from hipsched.splitting import SplitPlan, Splitter


class ForcedSplitter(Splitter):
    gpu_share = 0.4

    def plan(self, call, slot, pc, pg, h2d, d2h):
        spec = OPS.get(call.op)
        part = spec.partition(call) if spec is not None and spec.partition is not None else None
        if part is None:
            return None
        cut = min(max(1, part.rows - int(round(self.gpu_share * part.rows))), part.rows - 1)
        return SplitPlan(part, cut, 1.0, 1.0, 1.0)


def force_split(ex, share):
    """Make `ex` (an Executor with a GPU) cut every splittable call at `share` of its rows for the GPU.
    Give it exploration_share=0 so that every call reaches the cost model, where splits are planned."""
    s = ForcedSplitter(ex._core, ex._cpu, ex._gpu, 0.0, ex._record_split)
    s.gpu_share = share
    ex._fast.splitter = s
    return ex
