"""quant.inc's body at both lane widths, on any AVX2 machine: the body is compiled (gcc, into a temporary
library) with hs_vf emulated as 8 and as 16 plain floats, so its AVX-512 shape (HS_W 16: a block as two
vectors, the mat-vec's two-vector blocks, 2 x 8-column tiles, 16-lane accumulators and their reduction)
runs where the CPU has no AVX-512. Only the decoding of a block's bytes is per level in quant.inc; the
emulation takes the body's plain C decoding (exact integers, exact fp16 scale), which gives every level's
values: q * d is exact, however it is computed.

The emulated vector does what each level's does lane by lane: FMA through fmaf (one rounding, as
vfmadd), the horizontal sum in simd.h's order (at 16 lanes: the two halves added lane by lane first, as
hs_v_hsum does at AVX-512). So:
- quantize and dequantize give this level's bytes and bits at both widths;
- qmatmul at 8 lanes gives the AVX2 level's bits (the emulation is faithful); at 16 lanes it sums in the
  AVX-512 variant's order, so it must be within twice test_cpu_quant's bound of this level, and on an
  AVX-512 machine (this process at that level) bit for bit the AVX-512 variant's result.

Skipped without gcc or below the AVX2 level (the scalar variant's products are not fused)."""
import ctypes

import numpy as np
import pytest

import hipsched
from hipsched import QuantizedTensor
from hipsched.cpu import _quant as Q
from emulated_widths import build_widths, needs_gcc  # tests/support

LEVEL = hipsched.cpu_features()["simd"]

pytestmark = [
    needs_gcc,
    pytest.mark.skipif(LEVEL not in ("avx2", "avx512"),
                       reason=f"the emulation fuses multiply-adds as the SIMD levels do; this process runs {LEVEL}"),
]

HARNESS = r"""
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include <stdint.h>
#include "simd.h"   /* no level macro: the scalar section, whose 8-lane names emu_lanes.h replaces */
#include "emu_lanes.h"
/* qmatmul's packing buffer can be refused, to run its fallback (x read in place) */
#include <stdlib.h>
int emu_refuse_malloc = 0;
static void *emu_malloc(size_t n) { return emu_refuse_malloc ? NULL : malloc(n); }
#define malloc emu_malloc
#include "quant.inc"
"""

QT = {"q8_0": 0, "q4_0": 1}
BB = {"q8_0": 34, "q4_0": 18}
# (n, k, m): the mat-vec's row groups and their tails; 2 and 3 columns (one row in registers), tiles of
# 4..8 columns (17: three panels; 70: past the 64 columns one pass keeps), groups of 4 rows and their
# tails, one block and several chunks of 16 blocks with a tail; the last shapes over the thread grain
SHAPES = [(1, 32, 1), (5, 96, 1), (7, 544, 1), (67, 4096, 1), (1, 32, 2), (3, 64, 3), (5, 96, 4), (7, 544, 5),
          (9, 1056, 6), (33, 544, 7), (34, 1056, 8), (65, 96, 9), (31, 2048, 17), (6, 544, 70), (300, 1024, 8),
          (129, 4096, 3)]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    libs = build_widths(tmp_path_factory.mktemp("quant_widths"), HARNESS)
    for lib in libs.values():
        lib.hs_quantize_emu.restype = ctypes.c_int
        lib.hs_quantize_emu.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        lib.hs_dequantize_emu.restype = None
        lib.hs_dequantize_emu.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        lib.hs_qmatmul_emu.restype = None
        lib.hs_qmatmul_emu.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                       ctypes.c_int64, ctypes.c_void_p]
    return libs


def test_qmatmul_without_its_packing_buffer_gives_the_same_bits(emulated):
    """When the copy of x cannot be allocated, x is read in place: the same sums in the same order."""
    rng = np.random.default_rng(8)
    for width, lib in emulated.items():
        flag = ctypes.c_int.in_dll(lib, "emu_refuse_malloc")
        for qt in sorted(QT):
            for n, k, m in [(5, 96, 4), (34, 1056, 8), (31, 2048, 17), (6, 544, 70)]:
                raw = _blocks(rng, qt, n, k)
                x = rng.standard_normal((k, m)).astype(np.float32)
                flag.value = 0
                packed = _emu_qmatmul(lib, qt, raw, n, k, x)
                flag.value = 1
                try:
                    in_place = _emu_qmatmul(lib, qt, raw, n, k, x)
                finally:
                    flag.value = 0
                np.testing.assert_array_equal(in_place.view(np.uint32), packed.view(np.uint32),
                                              err_msg=f"width {width}: {qt} {(n, k, m)}")


def _blocks(rng, qt, n, k):
    """Random blocks with finite fp16 scales of many magnitudes (zero and subnormal among them)."""
    nb = n * (k // 32)
    raw = rng.integers(0, 256, size=(nb, BB[qt]), dtype=np.uint8)
    d = (rng.standard_normal(nb) * np.exp2(rng.integers(-20, 12, nb))).astype(np.float16)
    d[::7] = np.float16(6e-8)
    d[3::11] = 0
    raw[:, :2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(n, k // 32 * BB[qt])


def _emu_qmatmul(lib, qt, raw, n, k, x):
    m = 1 if x.ndim == 1 else x.shape[1]
    xt = np.ascontiguousarray(x.T if x.ndim == 2 else x, dtype=np.float32)
    out = np.zeros((n, m) if x.ndim == 2 else n, np.float32)
    lib.hs_qmatmul_emu(QT[qt], raw.ctypes.data, n, k, xt.ctypes.data, m, out.ctypes.data)
    return out


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("qt", sorted(QT))
def test_emulated_width_quantize_and_dequantize_give_this_levels_bytes(emulated, width, qt):
    rng = np.random.default_rng(5)
    lib = emulated[width]
    for n, k in [(1, 32), (9, 96), (67, 4096)]:
        W = (rng.standard_normal((n, k)) * rng.uniform(1e-3, 1e2, size=(n, 1))).astype(np.float32)
        W[0, :32] = 0.5 * rng.integers(-20, 20, 32)
        out = np.empty((n, k // 32 * BB[qt]), np.uint8)
        assert lib.hs_quantize_emu(QT[qt], W.ctypes.data, n * k // 32, out.ctypes.data) == 0
        np.testing.assert_array_equal(out, Q.quantize(W, qt), err_msg=f"{qt} {(n, k)}")
        raw = rng.integers(0, 256, size=(n, k // 32 * BB[qt]), dtype=np.uint8)  # every scale: inf, NaN too
        deq = np.empty((n, k), np.float32)
        lib.hs_dequantize_emu(QT[qt], raw.ctypes.data, n * k // 32, deq.ctypes.data)
        want = Q.dequantize(QuantizedTensor(raw, (n, k), qt))
        np.testing.assert_array_equal(deq.view(np.uint32), want.view(np.uint32), err_msg=f"{qt} {(n, k)}")


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("qt", sorted(QT))
def test_emulated_width_qmatmul(emulated, width, qt):
    rng = np.random.default_rng(6)
    lib = emulated[width]
    same_bits = (width == 8 and LEVEL == "avx2") or (width == 16 and LEVEL == "avx512")
    for n, k, m in SHAPES:
        raw = _blocks(rng, qt, n, k)
        x = rng.standard_normal(k if m == 1 else (k, m)).astype(np.float32)
        got = _emu_qmatmul(lib, qt, raw, n, k, x)
        want = np.asarray(Q.qmatmul(QuantizedTensor(raw, (n, k), qt), x))
        assert got.shape == want.shape
        if same_bits:
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                          err_msg=f"width {width} vs the {LEVEL} level: {qt} {(n, k, m)}")
        else:  # the other lane width: another order of float32 additions, each within test_cpu_quant's bound
            wd = np.abs(Q.dequantize(QuantizedTensor(raw, (n, k), qt))).astype(np.float64)
            bound = k * 2.0 ** -23 * (wd @ np.abs(x).astype(np.float64)) + (k + 1) * 2.0 ** -149
            err = np.abs(got.astype(np.float64) - want)
            assert np.all(err <= 2 * bound), f"width {width} vs {LEVEL}: {qt} {(n, k, m)}"
            assert np.any(got != want) or n * k < 1000, "16 lanes should sum in another order than 8"
