"""Float16 and bfloat16 for the tests of every layer (CPU kernels, GPU kernels on the emulator and on a
device): each format's NumPy dtype, the terms of the half tolerances (UNIT, TINY, half a unit in the last
place at a value), rounding, bit-pattern comparison, random values, and conversions to and from torch.

torch is imported on first use (`from half_formats import torch`, to_torch, from_torch), not with this
module: the kernel emulator's sanitizer steps import it with ThreadSanitizer preloaded, which aborts on
torch's OpenMP threads."""
import numpy as np
from requires import need

ml_dtypes = need("ml_dtypes", reason="bfloat16 arrays come from ml_dtypes (test extra)")

BF16 = ml_dtypes.bfloat16

# name: (NumPy dtype, precision p in bits with the implicit one, least normal exponent)
FORMATS = {"float16": (np.dtype(np.float16), 11, -14),
           "bfloat16": (np.dtype(BF16), 8, -126)}
HALVES = list(FORMATS)
HALF = {name: f[0] for name, f in FORMATS.items()}
# float32 and the halves, for a test that is the same in each apart from its bound; the halves' test ids
# carry "half", so CI's emulator steps that leave half precision out (-k "not half", .ci/run says why)
# leave them out
TYPES = {"float32": np.dtype(np.float32), **HALF}
TYPE_IDS = [t if t == "float32" else f"half-{t}" for t in TYPES]
F32_U = 2.0 ** -24  # float32 unit roundoff
_WITH_F32 = {"float32": (np.dtype(np.float32), 24, -126), **FORMATS}
# (precision p in bits with the implicit one, least normal exponent), float32 included
PRECISION = {name: (p, emin) for name, (_, p, emin) in _WITH_F32.items()}


class _PerType(dict):
    """Keyed by the type's name; a NumPy type or dtype (np.float16, BF16) finds its name's entry."""

    def __getitem__(self, key):
        return super().__getitem__(key if isinstance(key, str) else np.dtype(key).name)


# the unit roundoff of a rounding to the type, 2^-p: the relative error of a result rounded once
UNIT = _PerType({name: 2.0 ** -p for name, (_, p, _) in _WITH_F32.items()})
# half the smallest subnormal step, 2^(emin - p): the absolute error of a rounding where results underflow
TINY = _PerType({name: 2.0 ** (emin - p) for name, (_, p, emin) in _WITH_F32.items()})


def __getattr__(name):
    if name == "torch":
        return need("torch", reason="PyTorch CPU is the same-dtype reference (test extra)")
    raise AttributeError(name)


def npdt(name):
    return FORMATS[name][0]


def half_ulp(v, name):
    """Half a unit in the last place of format `name` at |v| (float64 array): the most the one rounding
    at the store moves a value, subnormals included (their ulp is that of the least normal binade)."""
    _, p, emin = FORMATS[name]
    v = np.abs(np.asarray(v, np.float64))
    _, e = np.frexp(v)  # v = m * 2^e, m in [0.5, 1): the binade's exponent is e - 1
    return 0.5 * np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))


def to_torch(x):
    torch = __getattr__("torch")
    if x.dtype == np.float16 or x.dtype == np.float32:
        return torch.from_numpy(np.ascontiguousarray(x))
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)


def from_torch(t, name):
    torch = __getattr__("torch")
    return t.view(torch.int16).numpy().view(npdt(name)) if name == "bfloat16" else t.numpy()


def bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def assert_same_halves(got, want):
    """Equal bit patterns, NaN for NaN (payloads aside); dtypes equal."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(bits(got)[~gn], bits(want)[~wn])


def rounded(x32, name):
    """A float32 array rounded to the format, as NumPy (float16) and ml_dtypes (bfloat16) round; float32
    as it is, for a test that runs in every type of TYPES."""
    return np.asarray(x32, np.float32).astype(TYPES[name])


def all_patterns(name):
    return np.arange(1 << 16, dtype=np.uint16).view(npdt(name))


def random_half(rng, shape, name, scale=1.0):
    return np.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(npdt(name))
