"""silu_mul, gelu and rope (issue 34): the pairing of rope's two layouts, the angle range the GPU
kernel takes, and gelu's accuracy where 1 + erf cancels."""
from mutants.mutant import Mutant

MUTANTS = [
    Mutant(name="rope_gptj_pair_rotated_with_its_own_value",
           why="issue 34: GPT-J's interleaved pair (2i, 2i + 1) must mix both elements of the pair (the "
               "elements past the last whole vector of a row)",
           path="src_c/cpu/elementwise.inc",
           find="                HS_ST1(out + i + 1, b * c + a * sn);\n",
           replace="                HS_ST1(out + i + 1, b * c + b * sn);\n",
           kill=("tests/cpu/test_cpu_transformer_elementwise.py::test_rope_matches_float64_formula",)),
    Mutant(name="rope_gptj_vector_pair_not_swapped",
           why="issue 34: GPT-J's pairs in a vector: each lane's sin term takes its partner's value (the "
               "swap of even and odd lanes before the fmaddsub), not its own",
           path="src_c/cpu/elementwise.inc",
           find="    return hs_v_fmaddsub(v, hs_v_dup_even(cs), hs_v_mul(hs_v_swap_pairs(v), hs_v_dup_odd(cs)));\n",
           replace="    return hs_v_fmaddsub(v, hs_v_dup_even(cs), hs_v_mul(v, hs_v_dup_odd(cs)));\n",
           kill=("tests/cpu/test_cpu_transformer_elementwise.py::test_rope_matches_float64_formula",)),
    Mutant(name="rope_gpu_rotation_sign",
           why="issue 34: the rotation (a, b) -> (a cos - b sin, a sin + b cos) on the GPU",
           path="src_c/hip/rope.hip",
           find="        y[j1] = hs_st<T>(a * sn + bb * c);\n",
           replace="        y[j1] = hs_st<T>(a * sn - bb * c);\n",
           kill=("tests/gpu/emulator/test_transformer_elementwise_emulated.py::test_gpu_matches_reference_and_cpu",)),
    Mutant(name="rope_gpu_takes_any_angle",
           why="issue 34: angles past the GPU kernel's reduction must go to the CPU, not lose accuracy",
           path="hipsched/gpu/glue/elementwise.py",
           find="        if not top < ROPE_MAX_ANGLE:\n",
           replace="        if False:\n",
           kill=("tests/gpu/emulator/test_transformer_elementwise_emulated.py::test_rope_angles_past_the_kernels_reduction_are_refused",)),
    Mutant(name="gelu_one_plus_erf_cancels",
           why="issue 34: gelu at large negative x (1 + erf cancels to 0 where x Phi(x) is still a normal float)",
           path="src_c/cpu/elementwise.inc",
           find="            HS_ST1(out + i, (float)(0.5 * v * erfc(-v * 0.70710678118654752440)));\n",
           replace="            HS_ST1(out + i, (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440))));\n",
           kill=("tests/cpu/test_cpu_transformer_elementwise.py::test_gelu_matches_torch_and_the_exact_formula",)),
]
