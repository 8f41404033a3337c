"""Tensor-core kernels at the edges (tests/gpu/emulator/test_executor_op_matrix.py, test_gpu_kernels_emulated.py)."""
from mutants.mutant import Mutant

_KERNELS = "tests/gpu/emulator/test_gpu_kernels_emulated.py::test_tensor_core_attention_batches_heads_and_peaky_scores"

MUTANTS = [
    Mutant(
        name="attention-mma-grid-forgets-the-batch",
        why="issue 30 item 9: the tensor-core attention's grid covers the first batch only (every attention "
            "test had batch 1, so the op matrix's 24 attention cases passed on it)",
        path="hipsched/gpu/glue/attention.py",
        find="f\"hs_attention_{suffix}_mma_d{d}\", -(-sq // rows) * b * h, threads)",
        replace="f\"hs_attention_{suffix}_mma_d{d}\", -(-sq // rows) * h, threads)",
        kill=("tests/gpu/emulator/test_executor_op_matrix.py::test_op_dtype_matrix[emulator-attention-float16-d32-host]",
              f"{_KERNELS}[warp32-d32_batch2_heads3-float16]"),
    ),
    Mutant(
        name="attention-mfma-p-unscaled",
        why="issue 30 item 9: the MFMA attention rounds P to float16 unscaled, so a peaky row's numerators "
            "under 2^-14 are subnormal: l counts them, MI200's MFMA (flushing subnormal inputs, as the "
            "emulator now does) does not, and the output leaves the accuracy contract",
        path="src_c/hip/attention.hip",
        find="template <> struct HsfPScale<hs_half> { static constexpr float v = 32768.0f; };",
        replace="template <> struct HsfPScale<hs_half> { static constexpr float v = 1.0f; };",
        kill=(f"{_KERNELS}[warp64-d32_peaky-float16]",),
    ),
]
