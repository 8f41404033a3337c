"""Float16 and bfloat16 formats for the CPU tests of add, scale, softmax (tests/cpu/test_cpu_elementwise.py)
and rms_norm (tests/cpu/test_cpu_norm.py): each format's NumPy and torch dtypes, half a unit in the last
place at a value, conversions to and from torch, bit-pattern comparison, rounding and random values."""
import numpy as np
from requires import need

ml_dtypes = need("ml_dtypes", reason="bfloat16 arrays come from ml_dtypes (test extra)")
torch = need("torch", reason="PyTorch CPU is the same-dtype reference (test extra)")

BF16 = ml_dtypes.bfloat16

# name: (NumPy dtype, torch dtype, precision p in bits with the implicit one, least normal exponent)
FORMATS = {"float16": (np.dtype(np.float16), torch.float16, 11, -14),
           "bfloat16": (np.dtype(BF16), torch.bfloat16, 8, -126)}
HALVES = list(FORMATS)
F32_U = 2.0 ** -24  # float32 unit roundoff


def npdt(name):
    return FORMATS[name][0]


def half_ulp(v, name):
    """Half a unit in the last place of format `name` at |v| (float64 array): the most the one rounding
    at the store moves a value, subnormals included (their ulp is that of the least normal binade)."""
    _, _, p, emin = FORMATS[name]
    v = np.abs(np.asarray(v, np.float64))
    _, e = np.frexp(v)  # v = m * 2^e, m in [0.5, 1): the binade's exponent is e - 1
    return 0.5 * np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))


def to_torch(x):
    if x.dtype == np.float16 or x.dtype == np.float32:
        return torch.from_numpy(np.ascontiguousarray(x))
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)


def from_torch(t, name):
    return t.view(torch.int16).numpy().view(npdt(name)) if name == "bfloat16" else t.numpy()


def bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def assert_same_halves(got, want):
    """Equal bit patterns, NaN for NaN (payloads aside); dtypes equal."""
    assert got.dtype == want.dtype and got.shape == want.shape
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(bits(got)[~gn], bits(want)[~wn])


def rounded(x32, name):
    return np.asarray(x32, np.float32).astype(npdt(name))


def all_patterns(name):
    return np.arange(1 << 16, dtype=np.uint16).view(npdt(name))


def random_half(rng, shape, name, scale=1.0):
    return np.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(npdt(name))
