"""attention.inc's body at both lane widths, on any AVX2 machine: the body is compiled (gcc, into a
temporary library) with hs_vf emulated as 8 and as 16 plain floats, so its AVX-512 shape (HS_W 16:
32-query strips, 16-lane softmax groups and half conversions) runs where the CPU has no AVX-512. The
emulated vector does what each level's does lane by lane: FMA through fmaf (one rounding), max with
vmaxps's rule (the second operand wins on NaN), halves through simd.h's scalar conversions (bit for bit
F16C's and the shift rule, checked exhaustively: tools/simd_exhaustive), exp2 per lane as the AVX2
att_exp2 computes it (a copy of it below; AVX-512's is the same instructions in EVEX form). Each width
must give the bits of the level this process runs (AVX2 or AVX-512): at 8 lanes that shows the emulation
is faithful, at 16 that the body's AVX-512 shape computes what AVX2 does. On an AVX-512 machine the
16-lane emulation is checked against the real AVX-512 variant as well. Where bfloat16 scores of an even
head_dim run on vdpbf16ps (cpu_features()["bf16_dot"]: another kernel, attention_bf16dot.c), the
widening body's bits are those of the float32 kernel on the widened inputs rounded to bfloat16
(test_cpu_attention's test_half_attention_is_the_float32_computation_rounded_once, which the avx512
rerun of test_simd_paths checks), and those are what the emulation must give.

Skipped without gcc, at the scalar level (libm's exp2f there, not the polynomial), or on a CPU without
AVX2."""
import ctypes

import numpy as np
import pytest
from requires import need

import hipsched
from hipsched.cpu import _attention as A
from emulated_widths import build_widths, needs_gcc  # tests/support

ml_dtypes = need("ml_dtypes", reason="bfloat16 arrays come from ml_dtypes (test extra)")

LEVEL = hipsched.cpu_features()["simd"]
BF16_DOT = hipsched.cpu_features()["bf16_dot"]

pytestmark = [
    needs_gcc,
    pytest.mark.skipif(LEVEL not in ("avx2", "avx512"),
                       reason=f"the emulation's exp2 is the vector one; this process runs the {LEVEL} level"),
]

HARNESS = r"""
#pragma GCC target("avx2,fma,f16c")
#include <math.h>
#include <stdint.h>
#include <immintrin.h>
#include "simd.h"   /* no level macro: the scalar section, whose 8-lane names emu_lanes.h replaces */
#include "emu_lanes.h"
/* attention.inc's AVX2 att_exp2, on one lane (the body's scalar branch calls exp2f per lane) */
static inline float emu_exp2f(float xs) {
    __m256 x = _mm256_set1_ps(xs);
    const __m256 lo = _mm256_set1_ps(-126.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_NLT_UQ);
    __m256 xc = _mm256_max_ps(lo, x);
    __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(xc, n);
    __m256 p = _mm256_set1_ps(1.5403530393e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108665e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650696e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718056e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_cvtss_f32(_mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep));
}
#define exp2f emu_exp2f
#include "attention.inc"
"""

CODE = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(ml_dtypes.bfloat16): 2}
# (batch, heads, seq_q, seq_k, head_dim): partial strips of 16 and 32 queries, partial 64-query and 64-key
# tiles, head_dims that are not multiples of 4 or 16
SHAPES = [(1, 2, 1, 1, 1), (2, 1, 7, 9, 3), (1, 2, 31, 33, 17), (2, 2, 65, 130, 64), (1, 1, 257, 257, 128),
          (1, 3, 100, 70, 5), (1, 1, 33, 200, 20), (1, 1, 130, 130, 100), (1, 1, 64, 64, 16), (1, 2, 17, 300, 31),
          (1, 1, 96, 96, 48), (3, 1, 15, 15, 15)]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    libs = {}
    for w, lib in build_widths(tmp_path_factory.mktemp("attention_widths"), HARNESS).items():
        f = lib.hs_attention_run_emu
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_int64] * 4 + [ctypes.c_float, ctypes.c_int,
                                                                                       ctypes.c_int]
        libs[w] = (lib, f)
    return libs


def _run_emulated(f, q, k, v, causal):
    b, h, sq, d = q.shape
    out = np.empty_like(q)
    scale = np.float32(1.0 / np.sqrt(d))  # the wrapper's default, rounded to float32 as it passes it
    assert f(q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data, CODE[q.dtype], b * h, sq, k.shape[2], d,
             scale, int(causal), 1) == 0
    return out


def _bits(a):
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a.view(np.uint32)


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("dt", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["float32", "float16", "bfloat16"])
def test_emulated_width_gives_this_levels_bits(emulated, width, dt):
    rng = np.random.default_rng(11)
    f = emulated[width][1]
    for b, h, sq, sk, d in SHAPES:
        for causal in (False, True):
            for nonfinite in (False, True):
                if nonfinite and sk < 10:
                    continue
                q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32).astype(dt) for n in (sq, sk, sk))
                if nonfinite:  # inf in a key some queries see (or, causal, that earlier ones do not), NaN in another
                    v[0, 0, sk - 3, 0] = np.inf
                    v[-1, -1, sk // 2, d - 1] = np.nan
                got = _run_emulated(f, q, k, v, causal)
                if BF16_DOT and q.dtype == ml_dtypes.bfloat16 and d % 2 == 0:
                    want = A.attention(*(x.astype(np.float32) for x in (q, k, v)), causal=causal).astype(q.dtype)
                else:
                    want = np.asarray(A.attention(q, k, v, causal=causal))
                np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=(
                    f"width {width} vs the {LEVEL} level: {np.dtype(dt).name} {(b, h, sq, sk, d)} causal={causal} "
                    f"nonfinite={nonfinite}"))
