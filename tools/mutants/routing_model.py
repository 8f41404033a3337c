"""Routing on any machine: how the performance model reads a side's slow mode (tests/sched/test_routing.py)."""
from mutants.mutant import Mutant

_ROUTING = "tests/sched/test_routing.py"

MUTANTS = [
    Mutant(
        name="pool-never-applied",
        why="issue 32: each size is its own samples' mean, so three runs that missed the op's slow mode "
            "predict the fast mode alone (bimodal-cpu, calibrated: regret 17.0% over three seeds)",
        path="hipsched/_perfmodel.pxd",
        find="    if not (f.pool_r > 0) or bk.n == 0:\n        return",
        replace="    if True:\n        return",
        kill=(f"{_ROUTING}::test_a_size_seen_a_few_times_borrows_its_ops_slow_mode",),
    ),
    Mutant(
        name="pool-blind-to-sizes-that-differ",
        why="issue 32: every size is the pool's ratio however well measured and however far its own "
            "samples lie from it (a team that only wakes for small inputs charged to every size)",
        path="hipsched/_perfmodel.pxd",
        find="    w = w / (w + v)\n",
        replace="    w = 0.0\n",
        kill=(f"{_ROUTING}::test_sizes_that_differ_beyond_their_noise_keep_their_own_means",),
    ),
    Mutant(
        name="pool-base-is-the-median",
        why="issue 32: a size's base is its median, which two slow draws of three put in the slow mode, "
            "and the pool's ratio then multiplies the slow time",
        path="hipsched/_perfmodel.pxd",
        find="    return bk.sorted[(bk.n - 1) >> 2]",
        replace="    return bk.sorted[(bk.n - 1) >> 1]",
        kill=(f"{_ROUTING}::test_a_size_seen_a_few_times_borrows_its_ops_slow_mode",),
    ),
]
