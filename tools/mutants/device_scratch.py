"""Device scratch is declared by the glue beside its planner, exactly what it allocates (issue 31, the
leftovers of the last house-order work; tests/gpu/runtime/test_device_scratch.py)."""
from mutants.mutant import Mutant

MUTANTS = [
    Mutant(name="top_k_scratch_leaves_out_the_norms",
           why="issue 31: the spec restated top_k's scratch as a bound apart from what the glue allocates",
           path="hipsched/gpu/ops/similarity.py",
           find="    return 4 * m * n + (4 * m if d else 0) + 12 * m * sum(partials[:2])\n",
           replace="    return 4 * m * n + 12 * m * sum(partials[:2])\n",
           kill=("tests/gpu/runtime/test_device_scratch.py",)),
    Mutant(name="spread_scratch_undeclared",
           why="issue 31: spread_activation's accumulator and ping-pong buffer were declared nowhere",
           path="hipsched/gpu/ops/graph.py",
           find="    return 4 * (n + 1) + (4 * n if steps > 1 else 0)\n",
           replace="    return 4 * (n + 1)\n",
           kill=("tests/gpu/runtime/test_device_scratch.py",)),
]
