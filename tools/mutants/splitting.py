"""Splitting one call across processors (tests/sched/test_splitting.py, tests/gpu/emulator/test_split_emulated.py)."""
from mutants.mutant import Mutant

MUTANTS = [
    Mutant(
        name="split-merge-ties-to-higher-index",
        why="issue 30 item 4: the merge of a split top_k sends equal scores to the higher index (the planted "
            "ties ranked 9th-227th and sometimes sat on one side of the cut, so no split test saw it)",
        path="hipsched/ops/similarity.py",
        find="order = np.lexsort((idx, -val), axis=-1)[..., :k]",
        replace="order = np.lexsort((-idx, -val), axis=-1)[..., :k]",
        kill=("tests/sched/test_splitting.py::test_partition_merges_to_the_unsplit_result",
              "tests/gpu/emulator/test_split_emulated.py::test_split_is_the_merge_of_each_sides_own_answer",
              "tests/gpu/emulator/test_split_emulated.py::"
              "test_a_call_split_across_the_cpu_and_two_devices_is_each_sides_own_answer"),
    ),
    Mutant(
        name="split-cut-ignores-the-share",
        why="issue 30 item 8: the run cuts the rows evenly whatever share the plan asked for (the event, "
            "built from the cut it made, agrees with itself, and the merged result is still right)",
        path="hipsched/splitting.py",
        find="part, bounds, sides, rows = plan.partition, plan.bounds, plan.sides, plan.partition.rows",
        replace="part, sides, rows = plan.partition, plan.sides, plan.partition.rows\n"
                "        bounds = [i * rows // len(sides) for i in range(len(sides) + 1)]",
        kill=("tests/sched/test_splitting.py::test_forced_split_is_exactly_the_unsplit_cpu_result",
              "tests/sched/test_splitting.py::test_the_executor_cuts_where_the_models_plan_says"),
    ),
]
