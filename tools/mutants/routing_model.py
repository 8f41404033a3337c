"""Routing on any machine: how the performance model reads a side's slow mode (tests/sched/test_routing.py)."""
from mutants.mutant import Mutant

_ROUTING = "tests/sched/test_routing.py"

MUTANTS = [
    Mutant(
        name="pool-never-applied",
        why="issue 32: each size is its own samples' mean, so three runs that missed the op's slow mode "
            "predict the fast mode alone (bimodal-cpu, calibrated: regret 17.0% over three seeds)",
        path="hipsched/_perfmodel.pxd",
        find="    if f.pool_r > 0 and bk.base > 0:\n",
        replace="    if False:\n",
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
        name="pooled-mean-as-uncertain-as-one-run",
        why="issue 32: a mean is taken to be as uncertain as its bucket's run-to-run spread over its own "
            "few runs, though the pool's hundred runs measured it: a bimodal side's slower mean is then "
            "a tie with the faster side, and is explored again and again",
        path="hipsched/_perfmodel.pxd",
        find="            u[0] = bk.se\n",
        replace="            u[0] = (sd if sd > 0.02 else 0.02) / sqrt(<double>bk.n)\n",
        kill=(f"{_ROUTING}::test_a_pooled_mean_is_as_uncertain_as_the_mean_not_as_one_run",),
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
