"""A decode step's memory: results written into out= on every side, and a KV cache kept on the GPU by
updates along its sequence axis (tests/gpu/emulator/test_transformer_elementwise_emulated.py,
tests/sched/test_splitting.py, tests/gpu/emulator/test_resident_arrays.py)."""
from mutants.mutant import Mutant

_ELEM = "tests/gpu/emulator/test_transformer_elementwise_emulated.py::test_out_and_in_place_on_both_sides"
_RESIDENT = "tests/gpu/emulator/test_resident_arrays.py"

MUTANTS = [
    Mutant(
        name="out-left-unwritten-off-the-cpu",
        why="issue 34: a call given out= that ran on the GPU (or split) returns its own new array and leaves "
            "out as it was, so a caller reading out reads stale data",
        path="hipsched/ops/base.py",
        find="    np.copyto(out, result)\n    return out",
        replace="    return result",
        kill=(f"{_ELEM}[warp32-rope-neox-float32]",
              "tests/sched/test_splitting.py::test_a_split_call_given_out_writes_it_whole[float32]"),
    ),
    Mutant(
        name="resident-update-copies-axis-zero-rows",
        why="issue 34: an update along a later axis copies bytes as if the index ran along axis 0, so the "
            "device copy of a KV cache keeps its old rows where the new position was written",
        path="hipsched/resident_array.py",
        find="    stride = inner * shape[axis]                           # bytes per position of the axes before it",
        replace="    stride = inner                                          # bytes per position of the axes before it",
        kill=(f"{_RESIDENT}::test_an_update_along_a_later_axis_copies_only_its_bytes",
              f"{_RESIDENT}::test_a_resident_kv_cache_grows_on_the_gpu_without_uploads"),
    ),
]
