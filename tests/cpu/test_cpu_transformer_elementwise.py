"""silu_mul, gelu and rope on the CPU kernels (through the public API, on a CPU-only executor) against
outside references: torch's silu and gelu in float64, SciPy's normal CDF, and a float64 rope written
from the formula here. test_simd_paths.py reruns this file at every SIMD level below the machine's.

Bounds: U is the result type's unit roundoff, TINY half its least subnormal step (half_formats.py).
- silu_mul: float32 exp within 2 ulp, then a division and a product: 5 * 2^-24 |ref| in float32,
  then one rounding to the result type.
- gelu: float64 per element, rounded once: U |ref| + TINY against an accurate float64 reference
  (SciPy's x * ndtr(x), and the tanh form as x / (1 + exp(-2u))); against torch's float64 gelu also
  what its formula loses where 1 + erf or 1 + tanh cancels: 0.5 |x| 2^-52.
- rope: cos and sin rounded to float32 (2^-24 each), two products and a sum in float32:
  4 * 2^-24 (|a| + |b|) for a pair (a, b), then one rounding to the result type."""
import numpy as np
import pytest
from requires import need

import hipsched
from half_formats import TINY, TYPES as NPTYPES, UNIT

torch = need("torch", reason="PyTorch CPU is the silu/gelu reference (test extra)")
F = torch.nn.functional

TYPES = ("float32", "float16", "bfloat16")


def npdt(name):
    return NPTYPES[name]
SIZES = [1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 300_001]   # vector tails at 8 and 16 lanes; the last: two threads


def _within(got, ref, bound, what):
    got = np.asarray(got).astype(np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    err = np.abs(got - ref)
    bad = ~(err <= bound)
    assert not bad.any(), f"{what}: worst error / bound {float(np.nanmax(err / (bound + 1e-300))):.3g} at {np.argwhere(bad)[:3]}"


def _same_nonfinite(got, ref, what):
    got = np.asarray(got).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{what}: NaN where the reference has none or v.v.")
    inf = np.isinf(ref)
    np.testing.assert_array_equal(got[inf], ref[inf], err_msg=f"{what}: infinities")


def _data(rng, dtype, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(npdt(dtype))


# ------------------------------------------------------------------------------------------ silu_mul
def silu_mul_ref(g, u):
    g64, u64 = (torch.from_numpy(np.asarray(a).astype(np.float64)) for a in (g, u))
    return (F.silu(g64) * u64).numpy()


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("n", SIZES)
def test_silu_mul_matches_torch(rng, dtype, n):
    g, u = _data(rng, dtype, n, 4.0), _data(rng, dtype, n)
    out = hipsched.silu_mul(g, u)
    assert out.dtype == npdt(dtype) and out.shape == (n,)
    ref = silu_mul_ref(g, u)
    _within(out, ref, (UNIT[dtype] + 5 * 2.0 ** -24) * np.abs(ref) + TINY[dtype], f"silu_mul {dtype}")


@pytest.mark.parametrize("dtype", TYPES)
def test_silu_mul_nonfinite_propagates_like_torch(dtype):
    g = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0, -3.0, 0.0, -0.0, 60.0, -60.0, 1.0, np.nan] * 3, np.float32)
    u = np.array([1.0, 2.0, 1.0, np.nan, np.inf, -np.inf, np.inf, 1.0, 1.0, 1.0, -np.inf, np.inf] * 3, np.float32)
    g, u = g.astype(npdt(dtype)), u.astype(npdt(dtype))
    with np.errstate(all="ignore"):
        ref = silu_mul_ref(g, u)
        out = hipsched.silu_mul(g, u)
    _same_nonfinite(out, ref, f"silu_mul {dtype}")
    fin = np.isfinite(ref)
    _within(np.asarray(out).astype(np.float64)[fin], ref[fin], (UNIT[dtype] + 5 * 2.0 ** -24) * np.abs(ref[fin]) + TINY[dtype],
            "silu_mul finite part")


def test_silu_mul_keeps_shape_and_promotes_a_mix(rng):
    g, u = _data(rng, "float32", (3, 5, 7)), _data(rng, "float16", (3, 5, 7))
    out = hipsched.silu_mul(g, u)
    assert out.dtype == np.float32 and out.shape == (3, 5, 7)
    ref = silu_mul_ref(g, u.astype(np.float32))
    _within(out, ref, 6 * 2.0 ** -24 * np.abs(ref) + TINY["float32"], "silu_mul mixed")


def _u_spread(dtype, rng):
    """u for the every-gate sweep: signed ones and halves, zeros, the type's least subnormal, its largest
    finite, infinities, NaN, and random values over many magnitudes (up to 1e30 for bfloat16)."""
    t = npdt(dtype)
    fixed = [0.0, -0.0, 1.0, -1.0, 0.5, -3.0, 7.25, 1e-3, np.inf, -np.inf, np.nan]
    mags = [1.0, 1e-6, 1e2, 1e4] + ([1e10, 1e20, 1e30] if dtype == "bfloat16" else [])
    rand = [v * m for m in mags for v in rng.standard_normal(4)]
    info = np.finfo(np.float16) if dtype == "float16" else need("ml_dtypes").finfo(t)
    with np.errstate(over="ignore"):
        u = np.array(fixed + rand + [float(info.smallest_subnormal), float(info.max)], np.float64).astype(t)
    return u


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_silu_mul_every_half_gate_value(rng, dtype):
    """The half types' silu (elementwise.inc, hs_v_silu_half: exp(-|g|) from a degree-5 (float16) / 4
    (bfloat16) polynomial and vscalefps or the exponent bits, one division) for every bit pattern of g
    (zeros, subnormals, every magnitude up to the largest finite, -100 and far below, +-inf, NaN) times a
    spread of u, against float64's g / (1 + exp(-g)) * u: within test_silu_mul_matches_torch's bound
    (U + 5 2^-24) |ref| + TINY, the bound the exact float32 formula has. This file runs at every SIMD
    level (test_simd_paths.py); half the rows hold g in order and half shuffled, so that AVX2's vectors
    of small |g| (its exponent-bit path) and those mixing in |g| > 87, inf or NaN (its general one) both
    come up. Measured over every (g, u) pair of both types (2^32 each) at every level: the worst error is
    0.9995 of this bound, outside what follows.
    Where silu(g) itself is below float32's normal range (|silu(g)| < 2^-126, g < -87), silu(g) is a
    float32 rounded to the denormal step 2^-149 before the product, so the bound there has |u| 2^-150
    more (it shows only for bfloat16 and |u| > 1e4 or so); and with u = +-inf a silu(g) that rounded to 0
    gives NaN (0 * inf) where float64 still has a tiny silu(g): as torch's float32 silu, and this kernel's
    float32 path, do. A float32 overflowing past the type's largest finite value may round to it or to
    inf."""
    t = npdt(dtype)
    g_all = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(t)
    u = _u_spread(dtype, rng)
    G = np.stack([g_all if k % 2 == 0 else rng.permutation(g_all) for k in range(u.size)])
    out = np.asarray(hipsched.silu_mul(G.ravel(), np.repeat(u, g_all.size))).astype(np.float64).reshape(G.shape)
    with np.errstate(all="ignore"):   # ml_dtypes' NaN to float64 warns; exp overflows for g < -709
        g64, u64 = G.astype(np.float64), u.astype(np.float64)[:, None]
        silu = g64 / (1.0 + np.exp(-g64))
        ref = silu * u64
    tail = (g64 < -80) & (np.abs(silu) < 2.0 ** -126)   # g < -87.3
    maybe_nan = tail & np.isinf(u64)   # NaN where silu(g) rounded to 0 in float32, else ref's infinity
    assert np.all(np.isnan(out[maybe_nan]) | (out[maybe_nan] == ref[maybe_nan])), f"silu_mul {dtype}: tail times inf"
    np.testing.assert_array_equal(np.isnan(out[~maybe_nan]), np.isnan(ref[~maybe_nan]),
                                  err_msg=f"silu_mul {dtype}: NaN where the reference has none or v.v.")
    inf = np.isinf(ref) & ~maybe_nan
    np.testing.assert_array_equal(out[inf], ref[inf], err_msg=f"silu_mul {dtype}: infinities")
    top = float(np.finfo(np.float16).max if dtype == "float16" else need("ml_dtypes").finfo(t).max)
    fin = np.isfinite(ref)
    over = fin & (np.abs(ref) >= top)
    assert np.all((np.abs(out[over]) == np.inf) | (np.abs(out[over]) == top)), f"silu_mul {dtype}: past the largest finite"
    assert np.all(np.sign(out[over]) == np.sign(ref[over]))
    fin &= ~over
    bound = (UNIT[dtype] + 5 * 2.0 ** -24) * np.abs(ref) + TINY[dtype] + np.where(tail, np.abs(u64) * 2.0 ** -150, 0.0)
    _within(out[fin], ref[fin], bound[fin], f"silu_mul {dtype} every gate value")


# ------------------------------------------------------------------------------------------ gelu
def gelu_torch(x, approximate):
    return F.gelu(torch.from_numpy(np.asarray(x).astype(np.float64)), approximate=approximate).numpy()


def gelu_accurate(x, approximate):
    x = np.asarray(x).astype(np.float64)
    with np.errstate(all="ignore"):
        if approximate == "none":
            ndtr = need("scipy.special", reason="SciPy's normal CDF is the accurate gelu reference (test extra)").ndtr
            return x * ndtr(x)
        u = np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)
        return x / (1 + np.exp(-2 * u))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("n", [1, 9, 33, 1000, 70_001])
def test_gelu_matches_torch_and_the_exact_formula(rng, approximate, dtype, n):
    x = _data(rng, dtype, n, 5.0)
    out = hipsched.gelu(x, approximate=approximate)
    assert out.dtype == npdt(dtype)
    x64 = x.astype(np.float64)
    exact = gelu_accurate(x, approximate)
    _within(out, exact, UNIT[dtype] * np.abs(exact) + TINY[dtype], f"gelu {approximate} {dtype} vs float64")
    ref = gelu_torch(x, approximate)
    _within(out, ref, UNIT[dtype] * np.abs(ref) + TINY[dtype] + 0.5 * np.abs(x64) * 2.0 ** -52 * 4,
            f"gelu {approximate} {dtype} vs torch")


def test_gelu_default_is_the_erf_form(rng):
    x = _data(rng, "float32", 100, 3.0)
    np.testing.assert_array_equal(hipsched.gelu(x), hipsched.gelu(x, approximate="none"))
    assert not np.array_equal(hipsched.gelu(x), hipsched.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", TYPES)
def test_gelu_nonfinite_propagates_like_torch(approximate, dtype):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -40.0, 40.0] * 3, np.float32).astype(npdt(dtype))
    out = hipsched.gelu(x, approximate=approximate)
    ref = gelu_torch(x, approximate)
    _same_nonfinite(out, ref, f"gelu {approximate} {dtype}")
    fin = np.isfinite(ref)
    _within(np.asarray(out).astype(np.float64)[fin], ref[fin], UNIT[dtype] * np.abs(ref[fin]) + TINY[dtype], "gelu finite")


def test_gelu_bad_approximate_names_the_choices():
    for bad in ("erf", "TANH", None, 1):
        with pytest.raises(ValueError, match="'none', 'tanh'"):
            hipsched.gelu(np.ones(3, np.float32), approximate=bad)


# ------------------------------------------------------------------------------------------ rope
def rope_ref(x, positions, base=10000.0, scale=1.0, style="neox"):
    """float64 rope from the formula: pair i of a row rotated by (pos / scale) * base^(-2i/d)."""
    x = np.asarray(x).astype(np.float64)
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = (np.asarray(positions).astype(np.float64) / scale)[..., None] * inv      # (seq, d/2) or (batch, seq, d/2)
    c, s = np.cos(ang), np.sin(ang)
    if ang.ndim == 3:
        c, s = c[:, None], s[:, None]   # over heads
    if style == "neox":
        a, b = x[..., :d // 2], x[..., d // 2:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    with np.errstate(invalid="ignore"):
        oa, ob = a * c - b * s, a * s + b * c
    out, mag = np.empty_like(x), np.empty_like(x)
    if style == "neox":
        out[..., :d // 2], out[..., d // 2:] = oa, ob
        mag[..., :d // 2] = mag[..., d // 2:] = np.abs(a) + np.abs(b)
    else:
        out[..., 0::2], out[..., 1::2] = oa, ob
        mag[..., 0::2] = mag[..., 1::2] = np.abs(a) + np.abs(b)
    return out, mag


def _check_rope(out, x, positions, dtype, **kw):
    ref, mag = rope_ref(x, positions, **kw)
    assert out.dtype == npdt(dtype) and out.shape == x.shape
    _within(out, ref, UNIT[dtype] * np.abs(ref) + 4 * 2.0 ** -24 * mag + TINY[dtype], f"rope {dtype} {kw}")


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("shape", [(1, 2, 3, 2), (2, 3, 17, 64), (1, 4, 9, 40), (2, 2, 5, 128), (3, 7, 6), (1, 1, 1, 256)])
def test_rope_matches_float64_formula(rng, style, dtype, shape):
    x = _data(rng, dtype, shape)
    positions = rng.integers(0, 4096, shape[-2])
    _check_rope(hipsched.rope(x, positions, style=style), x, positions, dtype, style=style)


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("base,scale", [(10000.0, 1.0), (500000.0, 1.0), (10000.0, 4.0), (1e6, 0.5), (0.5, 1.0)])
def test_rope_base_and_scale_at_long_positions(rng, style, base, scale):
    # positions to 32k and past (the table's fast reduction up to 2^19 radians, libm beyond it)
    x = _data(rng, "float32", (1, 3, 12, 64))
    positions = np.array([0, 1, 2, 1000, 4095, 8191, 16383, 32767, 32768, 65535, 600_000, 3_000_000], np.int64)
    out = hipsched.rope(x, positions, base=base, scale=scale, style=style)
    _check_rope(out, x, positions, "float32", base=base, scale=scale, style=style)


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", TYPES)
def test_rope_positions_per_batch_row(rng, style, dtype):
    x = _data(rng, dtype, (3, 4, 5, 32))
    positions = rng.integers(-100, 40000, (3, 5)).astype(np.int32)   # any integer type; negative ones too
    _check_rope(hipsched.rope(x, positions, style=style), x, positions, dtype, style=style)


def test_rope_position_zero_is_the_identity_and_styles_differ(rng):
    x = _data(rng, "float32", (2, 3, 4, 16))
    np.testing.assert_array_equal(hipsched.rope(x, np.zeros(4, np.int64)), x)
    p = np.arange(4)
    assert not np.allclose(hipsched.rope(x, p, style="neox"), hipsched.rope(x, p, style="gptj"))


def test_rope_a_long_prefill_runs_on_threads_and_matches(rng):
    x = _data(rng, "float32", (1, 8, 2048, 64))
    positions = np.arange(2048)
    _check_rope(hipsched.rope(x, positions), x, positions, "float32")


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", TYPES)
def test_rope_nonfinite_stays_in_its_pair(rng, style, dtype):
    x = _data(rng, dtype, (1, 2, 3, 8))
    x[0, 0, 1, 2] = np.nan
    x[0, 1, 2, 5] = np.inf
    positions = np.array([0, 3, 7])
    ref, _ = rope_ref(x, positions, style=style)
    out = hipsched.rope(x, positions, style=style)
    _same_nonfinite(out, ref, f"rope {style} {dtype}")
    fin = np.isfinite(ref)
    assert fin.sum() == ref.size - 4   # the two pairs that hold a non-finite value, and no other element


@pytest.mark.parametrize("dtype", TYPES)
def test_results_past_16_mib_take_the_streaming_stores(rng, dtype):
    """From 16 MiB on the result is 64-byte aligned and written with non-temporal stores (elementwise.c):
    the same values as the reference, every row and block of it."""
    n = (16 << 20) // np.dtype(npdt(dtype)).itemsize + 40   # a tail past the last whole block
    g, u = _data(rng, dtype, n, 4.0), _data(rng, dtype, n)
    out = hipsched.silu_mul(g, u)
    assert out.ctypes.data % 64 == 0
    ref = silu_mul_ref(g, u)
    _within(out, ref, (UNIT[dtype] + 5 * 2.0 ** -24) * np.abs(ref) + TINY[dtype], f"silu_mul {dtype} streamed")
    seq = (16 << 20) // (32 * 128 * np.dtype(npdt(dtype)).itemsize)
    x = _data(rng, dtype, (1, 32, seq, 128))
    positions = np.arange(seq) * 7
    for style in ("neox", "gptj"):
        out = hipsched.rope(x, positions, style=style)
        assert out.ctypes.data % 64 == 0
        _check_rope(out, x, positions, dtype, style=style)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("n", [33, 1000, 300_001, (16 << 20) // 2 + 64])   # the last: a streamed result in halves
def test_out_and_in_place_are_the_new_arrays_bits(dtype, n):
    """The kernels write out= directly, and in place (out= the input) read each element, or rope's pair,
    before writing it, at every vector width, thread split and with streaming stores: the bits of the
    result in a new array."""
    rng = np.random.default_rng(n)
    t = npdt(dtype)
    g, u = (rng.standard_normal(n).astype(np.float32).astype(t) for _ in range(2))
    d = 64
    x = rng.standard_normal((2, 3, max(1, n // (6 * d)), d)).astype(np.float32).astype(t)
    pos = rng.integers(0, 5000, (2, x.shape[2]))
    cases = [("silu_mul", (g, u), {}, 0), ("silu_mul", (g, u), {}, 1), ("gelu", (g,), {"approximate": "tanh"}, 0),
             ("rope", (x, pos), {"style": "neox"}, 0), ("rope", (x, pos), {"style": "gptj"}, 0)]
    for op, args, kw, which in cases:
        fn = getattr(hipsched, op)
        want = fn(*args, **kw)
        out = np.empty_like(want)
        assert fn(*args, **kw, out=out) is out
        np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8), err_msg=f"{op} {dtype} out=")
        mine = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        assert fn(*mine, **kw, out=mine[which]) is mine[which]
        np.testing.assert_array_equal(mine[which].view(np.uint8), want.view(np.uint8), err_msg=f"{op} {dtype} in place")
