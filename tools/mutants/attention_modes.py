"""Attention's inference modes: grouped KV heads, causal alignment, kv_len and the decode paths
(tests/cpu/test_cpu_attention.py, tests/gpu/emulator/test_gpu_kernels_emulated.py)."""
from mutants.mutant import Mutant

_CPU = "tests/cpu/test_cpu_attention.py::test_grouped_heads_causal_modes_and_kv_len_against_torch"
_DECODE = "tests/gpu/emulator/test_gpu_kernels_emulated.py::test_attention_decode_split_k"

MUTANTS = [
    Mutant(
        name="attention-cpu-lower-right-aligned-top-left",
        why="issue 34: the CPU's tiled kernel drops lower_right's offset (kv_len - seq_q), so a prefill "
            "behind a cache sees only the first keys, as causal=True does",
        path="src_c/cpu/attention.inc",
        find="int64_t off = causal == 2 ? skv - sq : 0;",
        replace="int64_t off = 0;",
        kill=(f"{_CPU}[b2h6kv3q5k40d33-float32]",),
    ),
    Mutant(
        name="attention-gpu-decode-upper-left-sees-the-cache",
        why="issue 34: the GPU decode kernel lets a single query see every valid key under upper_left "
            "(torch's is_causal: key 0 only), lower_right's rule",
        path="src_c/hip/attention.hip",
        find="const hs_i64 kend = causal == 1 ? (skv < 1 ? skv : 1) : skv;",
        replace="const hs_i64 kend = skv;",
        kill=(f"{_DECODE}[float32-warp32-gqa4]",),
    ),
]
