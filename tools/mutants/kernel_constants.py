"""The numbers kernels and glue share come from hipsched/gpu/compilation/kernel_constants.py alone (issue 31,
"Constants from one source"): a kernel file or the glue holding its own copy again."""
from mutants.mutant import Mutant

MUTANTS = [
    Mutant(
        name="hip-redefines-a-kernel-constant",
        why="quant.hip spelled HSQ_NR out beside the glue's copy, kept in step by a comment: a redefinition to "
            "the same value compiles silently, and one change to the module would leave the kernel behind",
        path="src_c/hip/quant.hip",
        find="#define HSQ_U 2\n",
        replace="#define HSQ_NR 2\n#define HSQ_U 2\n",
        kill=("tests/gpu/runtime/test_kernel_constants.py::test_no_kernel_file_defines_a_declared_constant",),
    ),
    Mutant(
        name="glue-keeps-a-stale-literal",
        why="the push kernel's lanes per row (HSG_GROUP) as a literal 8 in the glue, equal to the kernel's "
            "today and not tomorrow",
        path="hipsched/gpu/glue/graph.py",
        find="grid_stride_blocks(n * HSG_GROUP, _BLOCK",
        replace="grid_stride_blocks(n * 8, _BLOCK",
        kill=("tests/gpu/runtime/test_kernel_constants.py::test_the_glue_follows_each_constant_it_imports",),
    ),
]
