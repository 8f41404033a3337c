"""Every SIMD level this CPU has against the scalar level, on the same inputs: add, scale, exp, softmax,
rms_norm, cosine_similarity, top_k and attention in float32, float16 and bfloat16, at sizes around both
lane widths (8 and 16) and their tails, and large enough to split over threads; quantize, dequantize and
qmatmul (Q8_0, Q4_0) over one block and many, rows and columns around every tile of the kernels.

The level is fixed once per process (HIPSCHED_CPU_FEATURES), so each level computes every case in its
own interpreter (this file run as a script) and the test compares what comes back:
- add, scale and the half conversions are one float32 operation between exact widenings and one
  rounding: bit for bit equal at every level, NaN payloads included (NaNs only in one operand, so
  which operand's payload wins does not arise).
- the vector exp is the same sequence of roundings at AVX2 and AVX-512, so E.exp and softmax along a
  non-last axis (its sums run down each column, in the same order at any width) are bit for bit equal
  between those two. The scalar level uses libm's expf and is only within the bounds below.
- reductions (softmax's row sum, dot products, rms_norm's sum of squares) add in an order that depends
  on the lane width: within the bounds the per-family tests state against float64 (test_cpu_elementwise:
  softmax rtol 1e-5; test_cpu_similarity: cosine atol 2e-6, its half section: (2d + 8) 2^-24;
  test_cpu_norm and the half sections: the result is float64's rounded, so two levels differ by at most one
  unit in the last place of the output type), hence within twice those of each other.
- attention: each level is within the bound _attention_bound derives from float32's unit roundoff and
  the two reduction lengths (head_dim for a score, seq_k for the softmax sum and the P V product), hence
  within twice it of another; a half output adds one unit in its last place. Its lanes are queries and
  every sum and max runs within a lane in the same order at every width, and the 16-lane exp2 rounds as
  the 8-lane one: AVX-512 and AVX2 give the same bits.
- bfloat16 matmul (the widening path: float32 BLAS) is within test_cpu_similarity's bound u |exact| +
  (1 + u) k 2^-24 (|a| @ |b|) of the exact product at every level, hence within twice it of another.
- avx512_bf16 (HIPSCHED_CPU_FEATURES=avx512_bf16, what a plain run on an AVX512_BF16 CPU uses) is the
  AVX-512 level with bfloat16 x bfloat16 on vdpbf16ps: bfloat16 matmul and the scores of bfloat16
  attention with an even head_dim. Those add exact products in float32 in another order (a score is
  scaled after its sum instead of before: one rounding either way), so the matmul and attention bounds
  above hold for them as they are; everything else is bit for bit the avx512 level's.
- quantize's bytes are ggml's reference rounding at every level, and dequantize is one exact product
  q * d per element: bit for bit equal (dequantize over arbitrary bytes: every fp16 scale, inf and NaN
  included). qmatmul sums exact weights times x in float32: each level within test_cpu_quant's bound
  k 2^-23 (|Wd| @ |x|) of the exact product, hence within twice it of another.
A level this CPU lacks is skipped, saying which level it detected. Under the scalar rerun of
test_simd_paths.py (HIPSCHED_CPU_FEATURES=scalar) the file is skipped: its subprocesses choose their
own level, so the rerun would only repeat it.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

# this file also runs as a script, in a subprocess per level, where no conftest puts tests/support on
# the path
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from requires import need  # noqa: E402

ml_dtypes = need("ml_dtypes", reason="bfloat16 arrays come from ml_dtypes (test extra)")

import hipsched  # noqa: E402
from half_formats import PRECISION, UNIT  # noqa: E402
from half_formats import TYPES as DTYPES  # noqa: E402

LEVELS = ["scalar", "avx2", "avx512"]
BF16 = np.dtype(ml_dtypes.bfloat16)
SIZES = [0, 1, 7, 8, 15, 16, 17, 31, 33, 1000, 300_001]  # lanes and tails of 8 and 16; the last crosses the thread grain

pytestmark = pytest.mark.skipif(os.environ.get("HIPSCHED_CPU_FEATURES") == "scalar",
                                reason="scalar rerun (test_simd_paths): the subprocesses pick their own levels")


# ------------------------------------------------------------------ the cases, computed in a subprocess

def _special(n, rng):
    """n float32 values with zeros, subnormals (of float32 and float16), values that round to inf in
    float16, infinities and NaNs with payloads and both signs, among normal ones."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(3)
    if n >= 16:
        bits = np.array([0x7fc00001, 0xffa00003, 0x7f800001, 0x7f800000, 0xff800000, 0x00000001, 0x80400000,
                         0x33800000, 0x387fc000, 0x477ff000, 0x477fefff, 0xc7800000, 0x80000000, 0x3f808000,
                         0x3f818000, 0x7f7fffff], np.uint32)
        idx = rng.choice(n, bits.size, replace=False)
        x[idx] = bits.view(np.float32)
    return x


def _cases():
    """Deterministic inputs: (key, op, args) for every comparison."""
    rng = np.random.default_rng(20261122)
    out = []
    for name, dt in DTYPES.items():
        for n in SIZES:
            with np.errstate(over="ignore", invalid="ignore"):  # the specials include NaN and values past 65504
                a = _special(n, rng).astype(dt)  # the half casts: NumPy's / ml_dtypes' rounding
            b = (rng.standard_normal(n) * 3).astype(np.float32).astype(dt)
            out.append((f"add|{name}|{n}", "add", (a, b)))
            if n:  # b one element (0-d), and a bias repeated over rows
                out.append((f"add1|{name}|{n}", "add", (a, np.array(b[0]))))
                out.append((f"addrow|{name}|{n}", "add", (np.stack([a, b, a]), b)))
            out.append((f"scale|{name}|{n}", "scale", (a, 0.7071)))
            rows = 3 if n < 300_000 else 1
            x = (rng.standard_normal((rows, n)) * 4).astype(np.float32).astype(dt)
            out.append((f"softmax_rows|{name}|{n}", "softmax", (x, -1)))
        for shape in [(7, 37), (5, 300), (33, 17), (2, 16), (1000, 300)]:
            x = (rng.standard_normal(shape) * 4).astype(np.float32).astype(dt)
            out.append((f"softmax_cols|{name}|{shape}", "softmax", (x, 0)))
        for shape in [(1, 1), (3, 7), (3, 8), (3, 15), (2, 16), (2, 17), (2, 31), (2, 33), (4, 1000), (300, 1000)]:
            x = (rng.standard_normal(shape) * 2).astype(np.float32).astype(dt)
            w = (rng.standard_normal(shape[1]) + 1).astype(np.float32).astype(dt)
            out.append((f"rms_norm|{name}|{shape}", "rms_norm", (x, w)))
        for m, n, d in [(1, 50, 1), (1, 50, 7), (1, 50, 8), (1, 50, 15), (1, 50, 16), (1, 50, 17), (1, 50, 31),
                        (1, 50, 33), (1, 50, 64), (1, 50, 100), (3, 50, 33), (6, 40, 768), (5, 50, 17),
                        (1, 5000, 64), (2, 3000, 128)]:
            q = rng.standard_normal((m, d)).astype(np.float32)
            T = rng.standard_normal((n, d)).astype(np.float32).astype(dt)
            out.append((f"cosine|{name}|{(m, n, d)}", "cosine", (q, T)))
            out.append((f"top_k|{name}|{(m, n, d)}", "top_k", (q, T, 11)))
    x = np.concatenate([np.linspace(-100, 100, 100_003, dtype=np.float32), _special(1000, rng)])
    out.append(("exp|float32|100003", "exp", (x,)))
    out += _attention_cases()
    out += _quant_cases()
    out += _matmul_cases()
    return out


# (m, k, n) around the vdpbf16ps kernel's 12-row x 32-column register tiles and its work items of 192 rows
# x 128 columns, odd k (a pair padded), and b too narrow for it (n < 16, a vector: the widening path at
# every level)
MATMUL_SHAPES = [(1, 1, 1), (11, 3, 31), (12, 64, 32), (13, 65, 33), (97, 130, 257), (300, 200, 1), (7, 9, 16),
                 (250, 33, 140)]


def _matmul_cases():
    """bfloat16 matmul, its own generator (the other cases' inputs stay as they were)."""
    rng = np.random.default_rng(20261126)
    out = []
    for m, k, n in MATMUL_SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
        b = rng.standard_normal((k, n)).astype(np.float32).astype(BF16)
        out.append((f"matmul|bfloat16|{(m, k, n)}", "matmul", (a, b)))
    b = rng.standard_normal(70).astype(np.float32).astype(BF16)
    a = rng.standard_normal((40, 70)).astype(np.float32).astype(BF16)
    out.append(("matmul|bfloat16|vector", "matmul", (a, b)))
    return out


# (n, k): k of one block, a few, and more than qmatmul's chunks of 16 blocks with a tail (17, 33 blocks);
# n not a multiple of the 4-row groups nor of the 2-row tiles; the last two over the thread grain.
# Columns: 1 (the mat-vec), 2 and 3 (one row in registers), 4..9 around the 4- and 8-column tiles (AVX2,
# AVX-512), 17 (three panels of up to 8) and 70 (past the 64 columns whose sums one pass keeps).
QUANT_SHAPES = [(1, 32), (3, 64), (5, 96), (7, 544), (33, 1056), (67, 4096), (300, 2048)]
QUANT_COLS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 70]


def _quant_blocks(rng, qt, n, k):
    """(n, k) of random blocks with finite fp16 scales of many magnitudes (subnormal and zero included),
    not made by our quantizer (whose bytes are what the quantize cases compare)."""
    bb, nb = (34 if qt == "q8_0" else 18), n * (k // 32)
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    d = (rng.standard_normal(nb) * np.exp2(rng.integers(-20, 12, nb))).astype(np.float16)
    d[::7] = np.float16(6e-8)   # subnormal
    d[3::11] = 0
    raw[:, :2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(n, k // 32 * bb)


def _quant_cases():
    """Quant cases, their own generator (the other cases' inputs stay as they were)."""
    rng = np.random.default_rng(20261123)
    out = []
    for qt in ("q8_0", "q4_0"):
        for n, k in QUANT_SHAPES:
            W = (rng.standard_normal((n, k)) * rng.uniform(1e-3, 1e2, size=(n, 1))).astype(np.float32)
            W[0, :32] = 0.5 * rng.integers(-20, 20, 32)  # exact ties of the rounding
            if n > 2:
                W[1, :32] = 0.0
                W[2, :32] = rng.standard_normal(32) * 1e-41  # float32 subnormals: a zero fp16 scale
            out.append((f"quantize|{qt}|{(n, k)}", "quantize", (W, qt)))
            bb = 34 if qt == "q8_0" else 18
            raw = rng.integers(0, 256, size=(n, k // 32 * bb), dtype=np.uint8)  # any scale: inf, NaN too
            out.append((f"dequantize|{qt}|{(n, k)}", "dequantize", (raw, (n, k), qt)))
            blocks = _quant_blocks(rng, qt, n, k)
            for m in (QUANT_COLS if n * k <= 100_000 else (1, 3, 8)):
                x = rng.standard_normal(k if m == 1 else (k, m)).astype(np.float32)
                out.append((f"qmatmul|{qt}|{(n, k, m)}", "qmatmul", (blocks, (n, k), qt, x)))
    return out


# (batch, heads, seq_q, seq_k, head_dim): query counts around the strips (16 queries at 8 lanes, 32 at
# 16) and the 64-query tile, key counts around the 64-key tile, head_dims that are not multiples of 4 or
# 16 (the kernel's 4-column blocks and AVX-512's lanes), and one call over the thread grain.
ATTENTION_SHAPES = [(1, 1, 1, 1, 1), (1, 2, 7, 9, 3), (2, 1, 17, 33, 5), (1, 2, 33, 31, 17), (1, 1, 63, 65, 7),
                    (1, 1, 65, 130, 33), (1, 2, 100, 70, 100), (1, 1, 31, 200, 20), (1, 1, 96, 96, 48),
                    (1, 1, 130, 129, 128), (4, 1, 257, 257, 64)]


def _attention_cases():
    """Attention, its own generator (the other cases' inputs stay as they were): every shape in each
    dtype, causal and not; and per dtype, non-finite values: a NaN in a query (its row only), inf in a
    key's V row that some queries see, NaN in one hidden from some (causal: it reaches only the queries
    that see it)."""
    rng = np.random.default_rng(20261123)
    out = []
    for name, dt in DTYPES.items():
        for shape in ATTENTION_SHAPES:
            b, h, sq, sk, d = shape
            q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32).astype(dt) for n in (sq, sk, sk))
            for causal in (False, True):
                out.append((f"attention|{name}|{shape}|{'causal' if causal else 'full'}", "attention",
                            (q, k, v, causal)))
        q, k, v = (rng.standard_normal((1, 2, 70, 19)).astype(np.float32) for _ in range(3))
        q[0, 0, 5, 3] = np.nan
        v[0, 1, 3, 7] = np.inf
        v[0, 1, 40, 2] = np.nan
        for causal in (False, True):
            out.append((f"attention|{name}|nonfinite|{'causal' if causal else 'full'}", "attention",
                        tuple(x.astype(dt) for x in (q, k, v)) + (causal,)))
    # the same with an even head_dim (bfloat16 scores on vdpbf16ps at avx512_bf16), NaN and inf in K too
    q, k, v = (rng.standard_normal((1, 2, 70, 20)).astype(np.float32) for _ in range(3))
    q[0, 0, 5, 3] = np.nan
    k[0, 1, 9, 4] = np.inf
    v[0, 1, 3, 7] = np.inf
    v[0, 1, 40, 2] = np.nan
    for name, dt in DTYPES.items():
        for causal in (False, True):
            out.append((f"attention|{name}|nonfinite20|{'causal' if causal else 'full'}", "attention",
                        tuple(x.astype(dt) for x in (q, k, v)) + (causal,)))
    return out


def _run(op, args):
    from hipsched.cpu import _attention as A, _elementwise as E, _norm as N, _quant as Q, _similarity as S
    if op == "quantize":
        return [Q.quantize(*args)]
    if op == "dequantize":
        raw, shape, qt = args
        return [Q.dequantize(hipsched.QuantizedTensor(raw, shape, qt))]
    if op == "qmatmul":
        raw, shape, qt, x = args
        return [Q.qmatmul(hipsched.QuantizedTensor(raw, shape, qt), x)]
    if op == "attention":
        q, k, v, causal = args
        return [A.attention(q, k, v, causal=causal)]
    if op == "matmul":
        return [S.matmul(*args)]
    if op == "add":
        return [E.add(*args)]
    if op == "scale":
        return [E.scale(*args)]
    if op == "softmax":
        return [E.softmax(*args)]
    if op == "exp":
        return [E.exp(*args)]
    if op == "rms_norm":
        return [N.rms_norm(*args, 1e-6)]
    if op == "cosine":
        return [S.cosine_similarity(*args)]
    idx, val = S.top_k(*args)
    return [idx, val]


def _as_saved(a):
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype in (np.float16, BF16) else a


def _compute(path):
    """This interpreter's level on every case, saved to path (halves as their bits)."""
    feats = hipsched.cpu_features()
    res = {"__simd__": np.array(feats["simd"]), "__bf16_dot__": np.array(feats["bf16_dot"])}
    for key, op, args in _cases():
        for i, r in enumerate(_run(op, args)):
            res[f"{key}#{i}"] = _as_saved(r)
    np.savez(path, **res)


if __name__ == "__main__":
    _compute(sys.argv[1])
    sys.exit(0)


# ------------------------------------------------------------------ the comparisons

_results = {}


def _level_results(level, tmp_path_factory):
    if level not in _results:
        path = tmp_path_factory.mktemp("levels") / f"{level}.npz"
        # run as a script its sys.path starts at tests/cpu: the checkout's root finds an in-place build
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, HIPSCHED_CPU_FEATURES=level,
                   PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        r = subprocess.run([sys.executable, __file__, str(path)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, f"level {level} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        with np.load(path) as f:
            _results[level] = dict(f)
        # avx512_bf16 is the avx512 vector level with the bfloat16 dot products on
        assert str(_results[level]["__simd__"]) == ("avx512" if level == "avx512_bf16" else level)
        assert bool(_results[level]["__bf16_dot__"]) == (level == "avx512_bf16")
    return _results[level]


def _available(level):
    feats = hipsched.cpu_features()
    detected = feats["detected"]
    if level == "avx512_bf16":
        if detected != "avx512" or not feats["avx512_bf16"]:
            pytest.skip(f"this CPU has no AVX512_BF16 at the avx512 level (detected: {detected}, "
                        f"avx512_bf16: {feats['avx512_bf16']})")
        return
    if LEVELS.index(level) > LEVELS.index(detected):
        pytest.skip(f"this CPU has no {level} level (detected: {detected})")


def _ulp(v, name):
    """One unit in the last place of the type `name` at |v| (float64 array)."""
    p, emin = PRECISION[name]
    a = np.abs(v)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return np.exp2(np.maximum(e, emin) - (p - 1))


def _f64(a, name):
    return (a.view(DTYPES[name]) if name != "float32" else a).astype(np.float64)


def _attention_bound(q, k, v, causal, name):
    """Per output element, a bound on |level - exact| for a level's attention (float64 arrays in, each
    (slabs, ..)), from float32's unit roundoff u = 2^-24 and the reduction lengths. With q~ = q scale
    log2(e) (rounded the same at every level) and S_j = sum_c |q~_c k_jc|: a score (d products summed,
    fused or not) is off by at most (d + 2) u S_j, and so is the running max, one of the scores; the
    difference s_j - m rounds once more (u 2 max S). Each weight p_j = 2^(s_j - m) is then off by a
    relative ln2 (2 (d + 2) + 2) u max S plus the exp2's own error (the polynomial's 1.2e-7, libm's half
    an ulp, the product's rounding: 4u). A rescaling factor alpha multiplies the output and the sum of
    weights alike and cancels in their quotient, up to two roundings per key tile (T = ceil(sk / 64)).
    The sums over seq_k keys add (sk + 1) u of their sum of magnitudes, and the final division one u.
    With A = sum_j p_j |v_j| / sum_j p_j >= |out|, everything together is at most
    (eta + (sk + 2T + 2) u) (A + |out|), eta the weights' relative error. Returns (out, bound) in
    float64; a half output adds one unit in its last place, left to the caller. Non-finite values of v
    count as 0: an output they reach is not finite (and not compared against a bound), and one they do
    not reach they do not change."""
    u = 2.0 ** -24
    q, k, v = (np.asarray(x).astype(np.float64) for x in (q, k, v))
    v = np.where(np.isfinite(v), v, 0.0)
    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    qmul = float(np.float32(1.0 / np.sqrt(d))) * np.log2(np.e)
    s = np.einsum("...ic,...jc->...ij", q * qmul, k)
    smag = np.einsum("...ic,...jc->...ij", np.abs(q * qmul), np.abs(k))
    if causal:
        hidden = ~np.tril(np.ones((sq, sk), bool))
        s = np.where(hidden, -np.inf, s)
        smag = np.where(hidden, 0.0, smag)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp2(s - s.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        out, mag = p @ v, p @ np.abs(v)
    tiles = -(-sk // 64)
    eta = np.log(2.0) * (2 * (d + 2) + 2) * u * smag.max(axis=-1, keepdims=True) + 4 * u
    return out, (eta + (sk + 2 * tiles + 2) * u) * (mag + np.abs(out))


def _check_attention(g, s, args, name, key):
    """g and s (two levels' outputs, halves as bits) within twice _attention_bound of each other, with
    the same non-finite elements."""
    q, k, v, causal = args
    gf, sf = _f64(g, name), _f64(s, name)
    np.testing.assert_array_equal(np.isnan(gf), np.isnan(sf), err_msg=f"{key}: NaN positions")
    fin = np.isfinite(sf)
    np.testing.assert_array_equal(gf[~fin], sf[~fin], err_msg=f"{key}: infinities")  # NaN == NaN here
    _, bound = _attention_bound(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), causal, name)
    tol = 2 * bound
    if name != "float32":
        tol = tol + _ulp(np.maximum(np.abs(gf), np.abs(sf)), name)
    diff = np.abs(np.where(fin, gf, 0.0) - np.where(fin, sf, 0.0))
    ok = ~fin | (diff <= tol)
    assert ok.all(), (f"{key}: {np.sum(~ok)} of {ok.size} beyond the bound; worst excess "
                      f"{np.max(np.where(ok, 0, diff - tol)):.3g} (diff {diff[~ok].max():.3g})")


def _check_qmatmul(g, s, args, key):
    """Two levels' qmatmul within twice test_cpu_quant's bound of each other (the exact weights from
    dequantize, bit for bit the same at every level)."""
    raw, (n, k), qt, x = args
    wd = np.abs(hipsched.dequantize(hipsched.QuantizedTensor(raw, (n, k), qt))).astype(np.float64)
    bound = k * 2.0 ** -23 * (wd @ np.abs(x).astype(np.float64)) + (k + 1) * 2.0 ** -149
    assert g.dtype == np.float32 and g.shape == s.shape, key
    err = np.abs(g.astype(np.float64) - s)
    assert np.all(err <= 2 * bound), f"{key}: max excess {np.max(err - 2 * bound):.3g}"


@pytest.fixture(scope="module")
def cases():
    return {key: (op, args) for key, op, args in _cases()}


def _check_matmul(g, s, args, key):
    """Two levels' bfloat16 matmul within twice test_cpu_similarity's bound of each other."""
    a, b = (x.astype(np.float64) for x in args)
    u = UNIT["bfloat16"]
    bound = u * np.abs(a @ b) + (1 + u) * a.shape[1] * 2.0 ** -24 * (np.abs(a) @ np.abs(b))
    err = np.abs(_f64(g, "bfloat16") - _f64(s, "bfloat16"))
    assert np.all(err <= 2 * bound), f"{key}: max excess {np.max(err - 2 * bound):.3g}"


@pytest.mark.parametrize("level", ["avx2", "avx512", "avx512_bf16"])
def test_level_against_scalar(level, cases, tmp_path_factory):
    _available(level)
    got, base = _level_results(level, tmp_path_factory), _level_results("scalar", tmp_path_factory)
    checked = 0
    for key, (op, args) in cases.items():
        name = key.split("|")[1]
        g, s = got[f"{key}#0"], base[f"{key}#0"]
        assert g.shape == s.shape, key
        if op in ("add", "scale", "quantize", "dequantize"):
            np.testing.assert_array_equal(g.view(np.uint8), s.view(np.uint8), err_msg=key)
        elif op == "qmatmul":
            _check_qmatmul(g, s, args, key)
        elif op == "exp":
            # libm's expf (scalar) gives denormals where the vector exp gives 0: atol FLT_MIN
            np.testing.assert_allclose(g, s, rtol=4 * 2.0 ** -23, atol=2.0 ** -126, equal_nan=True, err_msg=key)
        elif op == "softmax":
            gf, sf = _f64(g, name), _f64(s, name)
            if name == "float32":
                np.testing.assert_allclose(gf, sf, rtol=2e-5, atol=1e-30, err_msg=key)
            else:  # each is float64's softmax rounded once, off by float32 terms: at most one half ulp apart
                assert np.all(np.abs(gf - sf) <= _ulp(np.maximum(np.abs(gf), np.abs(sf)), name)), key
        elif op == "rms_norm":
            gf, sf = _f64(g, name), _f64(s, name)
            assert np.all(np.abs(gf - sf) <= _ulp(np.maximum(np.abs(gf), np.abs(sf)), name)), key
        elif op == "attention":
            _check_attention(g, s, args, name, key)
        elif op == "matmul":
            _check_matmul(g, s, args, key)
        elif op == "cosine":
            d = args[0].shape[1]
            bound = 2e-6 if name == "float32" else (2 * d + 8) * 2.0 ** -24
            np.testing.assert_allclose(g, s, atol=2 * bound, rtol=0, err_msg=key)
        else:  # top_k: the same scores within the cosine bound; the same rows where no near-tie could swap them
            d = args[0].shape[1]
            bound = 2e-6 if name == "float32" else (2 * d + 8) * 2.0 ** -24
            gv, sv = got[f"{key}#1"], base[f"{key}#1"]
            np.testing.assert_allclose(gv, sv, atol=2 * bound, rtol=0, err_msg=key)
            all_scores = base[key.replace("top_k", "cosine") + "#0"]
            for r in range(g.shape[0]):
                top = np.sort(all_scores[r])[::-1][: g.shape[1] + 1]
                if np.all(-np.diff(top) > 4 * bound):
                    np.testing.assert_array_equal(g[r], s[r], err_msg=f"{key} row {r}")
        checked += 1
    assert checked == len(cases)


def test_avx512_exp_and_column_softmax_equal_avx2(cases, tmp_path_factory):
    _available("avx512")
    a, b = _level_results("avx512", tmp_path_factory), _level_results("avx2", tmp_path_factory)
    keys = [k for k in cases if k.startswith(("exp|", "softmax_cols|"))]
    assert keys
    for key in keys:
        np.testing.assert_array_equal(a[f"{key}#0"].view(np.uint8), b[f"{key}#0"].view(np.uint8), err_msg=key)


def _bf16_dot_key(key):
    """Whether a case's result comes from a vdpbf16ps kernel at avx512_bf16."""
    parts = key.split("|")
    if parts[:2] == ["matmul", "bfloat16"]:
        return parts[2] != "vector" and int(parts[2].strip("()").split(",")[-1]) >= 16
    if parts[:2] == ["attention", "bfloat16"]:
        d = {"nonfinite": 19, "nonfinite20": 20}.get(parts[2]) or int(parts[2].strip("()").split(",")[-1])
        return d % 2 == 0
    return False


def test_avx512_bf16_changes_only_bfloat16_products(cases, tmp_path_factory):
    """avx512_bf16 and avx512 differ in the vdpbf16ps kernels only: every other result is bit for bit
    the same; those that differ are checked against scalar by test_level_against_scalar. The cases hold
    bfloat16 attention of odd head_dim (the widening path at both) and of even head_dim."""
    _available("avx512_bf16")
    a, b = _level_results("avx512_bf16", tmp_path_factory), _level_results("avx512", tmp_path_factory)
    dot = [k for k in cases if _bf16_dot_key(k)]
    assert any(k.startswith("matmul|") for k in dot) and any(k.startswith("attention|") for k in dot)
    assert any(k.startswith("attention|bfloat16|") and not _bf16_dot_key(k) for k in cases)
    differ = 0
    for key in cases:
        for i in range(2):
            if f"{key}#{i}" not in a:
                continue
            x, y = a[f"{key}#{i}"], b[f"{key}#{i}"]
            if _bf16_dot_key(key):
                differ += not np.array_equal(x.view(np.uint8), y.view(np.uint8))
            else:
                np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=key)
    assert differ, "no bfloat16 product changed: the vdpbf16ps kernels did not run at avx512_bf16"


def test_level_cases_cover_quant(cases):
    """The quant cases reach every path the kernels have: m == 1 and tiles of 1..8 columns, one block and
    several chunks of k, and sizes over the thread grain."""
    ms = {int(key.rsplit(",", 1)[1].strip(" )")) for key in cases if key.startswith("qmatmul|")}
    assert set(QUANT_COLS) <= ms
    for op in ("quantize", "dequantize", "qmatmul"):
        for qt in ("q8_0", "q4_0"):
            assert any(key.startswith(f"{op}|{qt}|") for key in cases), (op, qt)


def test_avx512_attention_equals_avx2(cases, tmp_path_factory):
    """Attention's lanes are queries: every score, max, sum and output column runs within one lane, in
    key (or head_dim) order, at every width, and att_exp2 on 16 lanes is the 8-lane one instruction for
    instruction. What a 32-query strip does beyond two 16-query ones (causal: the keys hidden from its
    first half, masked to -inf) adds exact zeros. So AVX-512 and AVX2 give the same bits."""
    _available("avx512")
    a, b = _level_results("avx512", tmp_path_factory), _level_results("avx2", tmp_path_factory)
    keys = [k for k in cases if k.startswith("attention|")]
    assert keys
    for key in keys:
        np.testing.assert_array_equal(a[f"{key}#0"].view(np.uint8), b[f"{key}#0"].view(np.uint8), err_msg=key)


def test_requested_level_and_fallback():
    """Each level name runs that level where the CPU has it, else the highest it has, and says so."""
    detected = hipsched.cpu_features()["detected"]
    code = "import hipsched, json; print(json.dumps(hipsched.cpu_features()))"
    import json
    has_bf16 = detected == "avx512" and hipsched.cpu_features()["avx512_bf16"]
    # a plain run uses vdpbf16ps wherever the CPU has it
    assert hipsched.cpu_features()["bf16_dot"] == (has_bf16 and os.environ.get("HIPSCHED_CPU_FEATURES") in
                                                    (None, "", "avx512_bf16"))
    for level in LEVELS + ["none", "avx512_bf16"]:
        env = dict(os.environ, HIPSCHED_CPU_FEATURES=level)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        f = json.loads(r.stdout)
        want = "scalar" if level == "none" else level
        assert f["requested"] == want and f["detected"] == detected
        vector = "avx512" if want == "avx512_bf16" else want  # the bf16 dot products sit on the avx512 level
        assert f["simd"] == LEVELS[min(LEVELS.index(vector), LEVELS.index(detected))]
        assert f["bf16_dot"] == (want == "avx512_bf16" and has_bf16)


def test_an_unknown_level_name_warns_and_runs_the_detected_level():
    detected = hipsched.cpu_features()["detected"]
    code = "import hipsched, json; print(json.dumps(hipsched.cpu_features()))"
    import json
    env = dict(os.environ, HIPSCHED_CPU_FEATURES="avx-512")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HIPSCHED_CPU_FEATURES='avx-512' is not one of scalar, none, avx2, avx512, avx512_bf16" in r.stderr
    f = json.loads(r.stdout)
    assert f["requested"] == "auto" and f["simd"] == detected
