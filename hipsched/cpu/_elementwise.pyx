# Wrappers of src_c/cpu/elementwise.c: take validated C-contiguous float32, float16 or bfloat16 arrays
# (ops/elementwise.py checks shapes and converts or promotes dtypes), allocate the result in the input's
# dtype, run the kernel without the GIL.
cimport numpy as cnp
import numpy as np

from hipsched.broadcast import bias_fits
from libc.stdint cimport int64_t

from hipsched.cpu._carray cimport HS_F32, f32_ptr, float_ptr, hs_dtype

cnp.import_array()

cdef extern from "elementwise.h" nogil:
    void hs_add(hs_dtype dt, const void *a, const void *b, void *out, int64_t n, int64_t nb)
    void hs_scale(hs_dtype dt, const void *x, float alpha, void *out, int64_t n)
    void hs_softmax(hs_dtype dt, const void *x, void *out, int64_t outer, int64_t len, int64_t inner)
    void hs_add_f32(const float *a, const float *b, float *out, int64_t n, int64_t nb)
    void hs_scale_f32(const float *x, float alpha, float *out, int64_t n)
    void hs_softmax_f32(const float *x, float *out, int64_t outer, int64_t len, int64_t inner)
    void hs_exp_f32(const float *x, float *out, int64_t n)
    void hs_silu_mul(hs_dtype dt, const void *g, const void *u, void *out, int64_t n)
    void hs_gelu(hs_dtype dt, const void *x, void *out, int64_t n, int tanh_form)
    int hs_rope(hs_dtype dt, const void *x, const int64_t *positions, void *out, int64_t batch, int64_t heads,
                int64_t seq, int64_t d, int pos_per_batch, double base, double scale, int gptj)


def add(a, b):
    """a + b where b has a's shape or a trailing part of it (a bias repeated over the leading axes);
    a and b of one dtype (the kernel reads both with one element type)."""
    cdef int ca = -1, cb = -1
    cdef void *pa = float_ptr(a, "a", &ca)
    cdef void *pb = float_ptr(b, "b", &cb)
    if ca != cb:
        raise TypeError(f"add: a ({a.dtype}) and b ({b.dtype}) must have one dtype (promote through hipsched.ops)")
    cdef int64_t n = a.size, nb = b.size
    if not bias_fits(a.shape, b.shape):
        raise ValueError(f"add: b {b.shape} is neither a's shape {a.shape} nor a trailing part of it")
    out = np.empty_like(a)
    cdef void *po = cnp.PyArray_DATA(out)
    cdef hs_dtype dt = <hs_dtype>ca
    with nogil:
        hs_add(dt, pa, pb, po, n, nb)
    return out


def scale(x, alpha):
    """alpha * x; alpha is rounded to float32 first, as NumPy does for a Python scalar, and the product
    (formed in float32) is rounded to x's dtype."""
    cdef int cx = -1
    cdef void *px = float_ptr(x, "x", &cx)
    cdef float a = <float>float(alpha)
    cdef int64_t n = x.size
    out = np.empty_like(x)
    cdef void *po = cnp.PyArray_DATA(out)
    cdef hs_dtype dt = <hs_dtype>cx
    with nogil:
        hs_scale(dt, px, a, po, n)
    return out


def softmax(x, int axis=-1):
    """exp(x - max) / sum along `axis` (see hipsched.ops.elementwise for the NaN/inf rules)."""
    cdef int cx = -1
    cdef void *px = float_ptr(x, "x", &cx)
    cdef int nd = x.ndim
    if nd == 0 or not -nd <= axis < nd:
        raise ValueError(f"softmax: axis {axis} is out of range for shape {x.shape}")
    if axis < 0:
        axis += nd
    cdef int64_t outer = 1, inner = 1, length = cnp.PyArray_DIM(x, axis)
    cdef int i
    for i in range(axis):
        outer *= cnp.PyArray_DIM(x, i)
    for i in range(axis + 1, nd):
        inner *= cnp.PyArray_DIM(x, i)
    out = np.empty_like(x)
    cdef void *po = cnp.PyArray_DATA(out)
    cdef hs_dtype dt = <hs_dtype>cx
    with nogil:
        hs_softmax(dt, px, po, outer, length, inner)
    return out


# Results from this size on are written with streaming stores (elementwise.c, HS_STREAM_MIN_BYTES),
# which need a 64-byte-aligned destination; NumPy aligns its buffers to 16 bytes.
DEF STREAM_MIN_BYTES = 16 << 20


def _result_like(a):
    """An uninitialised array of a's shape and dtype; 64-byte aligned when it is large enough to be
    streamed."""
    if a.nbytes < STREAM_MIN_BYTES:
        return np.empty_like(a)
    buf = np.empty(a.nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    return buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)


cdef object _given_out(object out, object like, str op):
    """out= as the kernel takes it: like's shape and dtype, C-contiguous, aligned, writable (hipsched.ops
    validated it, overlap included: these checks keep a direct caller's mistake from writing out of
    bounds)."""
    if (type(out) is not np.ndarray or out.shape != like.shape or out.dtype != like.dtype
            or not out.flags.c_contiguous or not out.flags.aligned or not out.flags.writeable):
        raise ValueError(f"{op}: out must be a writable C-contiguous array of shape {like.shape} and dtype "
                         f"{like.dtype} (validate through hipsched.ops)")
    return out


def silu_mul(gate, up, out=None):
    """silu(gate) * up, gate and up of one shape and one dtype; into out when given (gate or up itself
    for in place)."""
    cdef int cg = -1, cu = -1
    cdef void *pg = float_ptr(gate, "gate", &cg)
    cdef void *pu = float_ptr(up, "up", &cu)
    if cg != cu:
        raise TypeError(f"silu_mul: gate ({gate.dtype}) and up ({up.dtype}) must have one dtype (promote through hipsched.ops)")
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {gate.shape} and up {up.shape} must have one shape")
    cdef int64_t n = gate.size
    out = _result_like(gate) if out is None else _given_out(out, gate, "silu_mul")
    cdef void *po = cnp.PyArray_DATA(out)
    cdef hs_dtype dt = <hs_dtype>cg
    with nogil:
        hs_silu_mul(dt, pg, pu, po, n)
    return out


def gelu(x, approximate="none", out=None):
    """GELU, torch's erf form ("none") or its tanh form ("tanh"), in float64 per element; into out when
    given (x itself for in place)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    cdef int cx = -1
    cdef void *px = float_ptr(x, "x", &cx)
    cdef int64_t n = x.size
    cdef int tanh_form = approximate == "tanh"
    out = np.empty_like(x) if out is None else _given_out(out, x, "gelu")
    cdef void *po = cnp.PyArray_DATA(out)
    cdef hs_dtype dt = <hs_dtype>cx
    with nogil:
        hs_gelu(dt, px, po, n, tanh_form)
    return out


def rope(x, positions, base=10000.0, scale=1.0, style="neox", out=None):
    """Rotary embedding of x (batch, heads, seq, d) or (heads, seq, d) at int64 positions (seq,) or
    (batch, seq) (see hipsched.ops.elementwise.prepare_rope for the formula); into out when given (x
    itself for in place: each pair is read before it is written)."""
    cdef int cx = -1
    cdef void *px = float_ptr(x, "x", &cx)
    if style not in ("neox", "gptj"):
        raise ValueError(f"rope: style must be 'neox' or 'gptj', got {style!r}")
    if x.ndim not in (3, 4) or x.shape[x.ndim - 1] % 2:
        raise ValueError(f"rope: x must be 3-d or 4-d with an even last axis, got {x.shape}")
    pos = positions
    if not isinstance(pos, np.ndarray) or pos.dtype != np.int64 or not pos.flags.c_contiguous or not pos.flags.aligned:
        raise TypeError("rope: positions must be a C-contiguous int64 array (validate through hipsched.ops)")
    cdef int64_t batch = x.shape[0] if x.ndim == 4 else 1
    cdef int64_t heads = x.shape[x.ndim - 3], seq = x.shape[x.ndim - 2], d = x.shape[x.ndim - 1]
    cdef int per_batch
    if pos.shape == (seq,):
        per_batch = 0
    elif x.ndim == 4 and pos.shape == (batch, seq):
        per_batch = 1
    else:
        raise ValueError(f"rope: positions {pos.shape} must be (seq,) or (batch, seq) for x {x.shape}")
    cdef double b = float(base), sc = float(scale)
    cdef int gptj = style == "gptj", rc
    out = _result_like(x) if out is None else _given_out(out, x, "rope")
    cdef void *po = cnp.PyArray_DATA(out)
    cdef const int64_t *pp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>pos)
    cdef hs_dtype dt = <hs_dtype>cx
    with nogil:
        rc = hs_rope(dt, px, pp, po, batch, heads, seq, d, per_batch, b, sc, gptj)
    if rc:
        raise MemoryError(f"rope: no memory for the angle table of head_dim {d}")
    return out


def exp(x):
    """The vectorised exp softmax uses (exposed so tests can measure its error in ulp)."""
    cdef float *px = f32_ptr(x, "x")
    cdef int64_t n = x.size
    out = np.empty_like(x)
    cdef float *po = <float *>cnp.PyArray_DATA(out)
    with nogil:
        hs_exp_f32(px, po, n)
    return out


# ---------------------------------------------------------------- compiled common cases (see _hot.pxd)
from cpython.float cimport PyFloat_CheckExact, PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_CheckExact
from hipsched.cpu._hot cimport HotOp, plain_f32

# Below this many elements a kernel runs without releasing the GIL: dropping and retaking it costs
# about as much as adding 4096 floats, and the C kernels start no threads at these sizes anyway.
DEF GIL_KEPT_MAX = 4096
# Past this the general path's checks (result memory) apply; its cost is nothing at such sizes.
DEF HOT_MAX = 1 << 28


cdef inline cnp.ndarray empty_like_f32(cnp.ndarray a):
    return cnp.PyArray_EMPTY(cnp.PyArray_NDIM(a), cnp.PyArray_DIMS(a), cnp.NPY_FLOAT32, 0)


ctypedef struct Operands:   # one call's pointers and sizes, whichever kernel it is for (silu_mul: y is up)
    const float *x
    const float *y
    float *out
    int64_t n
    int64_t m               # add: b's size; softmax: the row length
    float alpha

ctypedef void (*kernel_fn)(Operands *o) noexcept nogil

cdef void k_add(Operands *o) noexcept nogil:
    hs_add_f32(o.x, o.y, o.out, o.n, o.m)

cdef void k_scale(Operands *o) noexcept nogil:
    hs_scale_f32(o.x, o.alpha, o.out, o.n)

cdef void k_silu_mul(Operands *o) noexcept nogil:
    hs_silu_mul(HS_F32, o.x, o.y, o.out, o.n)

cdef void k_softmax(Operands *o) noexcept nogil:
    if o.m:
        hs_softmax_f32(o.x, o.out, o.n // o.m, o.m, 1)


cdef object launch(kernel_fn k, Operands *o, cnp.ndarray like):
    """The result (like's shape, float32) of kernel `k`, with the GIL kept for small calls."""
    cdef cnp.ndarray out = empty_like_f32(like)
    o.out = <float *>cnp.PyArray_DATA(out)
    if o.n <= GIL_KEPT_MAX:
        k(o)
    else:
        with nogil:
            k(o)
    return out


cdef inline bint sized(object x, double bytes_per_element, double *size, double *nbytes) noexcept:
    """x plain float32 and within the hot path's size; sets the call's work measure and bytes."""
    if not plain_f32(x):
        return False
    cdef cnp.npy_intp n = cnp.PyArray_SIZE(<cnp.ndarray>x)
    if n > HOT_MAX:
        return False
    size[0] = n
    nbytes[0] = bytes_per_element * n
    return True


cdef class AddHot(HotOp):
    """add(a, b): b of a's shape or a trailing part of it, both plain float32."""
    cdef object check(self, tuple args, dict kwargs, double *size, double *nbytes):
        if len(args) != 2 or kwargs:
            return None
        a = args[0]
        b = args[1]
        if not plain_f32(b) or not sized(a, 8.0, size, nbytes):
            return None
        cdef int na = cnp.PyArray_NDIM(<cnp.ndarray>a), nb = cnp.PyArray_NDIM(<cnp.ndarray>b), i
        cdef cnp.npy_intp *da = cnp.PyArray_DIMS(<cnp.ndarray>a)
        cdef cnp.npy_intp *db = cnp.PyArray_DIMS(<cnp.ndarray>b)
        if nb > na:
            return None
        for i in range(nb):
            if da[na - nb + i] != db[i]:
                return None
        nbytes[0] += 4.0 * cnp.PyArray_SIZE(<cnp.ndarray>b)
        return args

    cdef object run(self, object ready):
        cdef cnp.ndarray a = <cnp.ndarray>(<tuple>ready)[0]
        cdef cnp.ndarray b = <cnp.ndarray>(<tuple>ready)[1]
        cdef Operands o
        o.x = <float *>cnp.PyArray_DATA(a)
        o.y = <float *>cnp.PyArray_DATA(b)
        o.n = cnp.PyArray_SIZE(a)
        o.m = cnp.PyArray_SIZE(b)
        return launch(k_add, &o, a)


cdef class ScaleHot(HotOp):
    """scale(x, alpha): x plain float32, alpha a Python float (ints, NumPy scalars and 0-d arrays take
    the general path, which owns their conversion and its errors)."""
    cdef object check(self, tuple args, dict kwargs, double *size, double *nbytes):
        if len(args) != 2 or kwargs or not PyFloat_CheckExact(args[1]) or not sized(args[0], 8.0, size, nbytes):
            return None
        return args

    cdef object run(self, object ready):
        cdef cnp.ndarray x = <cnp.ndarray>(<tuple>ready)[0]
        cdef Operands o
        o.x = <float *>cnp.PyArray_DATA(x)
        o.n = cnp.PyArray_SIZE(x)
        o.alpha = <float>PyFloat_AS_DOUBLE((<tuple>ready)[1])  # rounded as the general path rounds it
        return launch(k_scale, &o, x)


cdef class SoftmaxHot(HotOp):
    """softmax(x, axis=-1) over the last axis of a plain float32 x (other axes: general path)."""
    cdef object check(self, tuple args, dict kwargs, double *size, double *nbytes):
        if len(args) != 1:
            return None
        if kwargs:
            if len(kwargs) != 1:
                return None
            axis = kwargs.get("axis")
            if not PyLong_CheckExact(axis) or axis != -1:
                return None
        x = args[0]
        if not sized(x, 8.0, size, nbytes) or cnp.PyArray_NDIM(<cnp.ndarray>x) == 0:
            return None
        return x

    cdef object run(self, object ready):
        cdef cnp.ndarray x = <cnp.ndarray>ready
        cdef Operands o
        o.x = <float *>cnp.PyArray_DATA(x)
        o.n = cnp.PyArray_SIZE(x)
        o.m = cnp.PyArray_DIM(x, cnp.PyArray_NDIM(x) - 1)
        return launch(k_softmax, &o, x)


cdef class SiluMulHot(HotOp):
    """silu_mul(gate, up): both plain float32 of one shape (a decode step calls it once per layer on a
    few thousand elements, where the general path's checks cost more than the kernel)."""
    cdef object check(self, tuple args, dict kwargs, double *size, double *nbytes):
        # (the op method passes out=None with every call: only a given out= is the general path's)
        if len(args) != 2 or kwargs and (len(kwargs) != 1 or kwargs.get("out", 0) is not None):
            return None
        g = args[0]
        u = args[1]
        if not plain_f32(u) or not sized(g, 12.0, size, nbytes):
            return None
        cdef int nd = cnp.PyArray_NDIM(<cnp.ndarray>g), i
        if cnp.PyArray_NDIM(<cnp.ndarray>u) != nd:
            return None
        for i in range(nd):
            if cnp.PyArray_DIM(<cnp.ndarray>g, i) != cnp.PyArray_DIM(<cnp.ndarray>u, i):
                return None
        return args

    cdef object run(self, object ready):
        cdef cnp.ndarray g = <cnp.ndarray>(<tuple>ready)[0]
        cdef cnp.ndarray u = <cnp.ndarray>(<tuple>ready)[1]
        cdef Operands o
        o.x = <float *>cnp.PyArray_DATA(g)
        o.y = <float *>cnp.PyArray_DATA(u)
        o.n = cnp.PyArray_SIZE(g)
        if cnp.PyArray_NBYTES(g) >= STREAM_MIN_BYTES:   # the general path's aligned, streamed result
            return silu_mul(g, u)
        return launch(k_silu_mul, &o, g)


cdef inline bint rope_float(object v, double *out) noexcept:
    """base or scale as the general path takes them without a conversion: a Python float, finite, > 0."""
    if not PyFloat_CheckExact(v):
        return False
    out[0] = PyFloat_AS_DOUBLE(v)
    return out[0] > 0 and out[0] <= 1.7976931348623157e308   # NaN and inf fail one side


cdef class RopeHot(HotOp):
    """rope(x, positions, *, base, scale, style): x plain float32, 3-d or 4-d with an even head_dim;
    positions an exact C-contiguous native int64 ndarray of shape (seq,) or (batch, seq); base and scale
    Python floats (finite, > 0), style "neox" or "gptj". Anything else: the general path."""
    cdef object check(self, tuple args, dict kwargs, double *size, double *nbytes):
        if len(args) != 2:
            return None
        cdef double base = 10000.0, scale = 1.0
        style = "neox"
        if kwargs:
            for k, v in kwargs.items():
                if k == "base":
                    if not rope_float(v, &base):
                        return None
                elif k == "scale":
                    if not rope_float(v, &scale):
                        return None
                elif k == "style":
                    if v != "neox" and v != "gptj" or type(v) is not str:
                        return None
                    style = v
                elif k != "out" or v is not None:   # a given out= is the general path's
                    return None
        x = args[0]
        p = args[1]
        if not sized(x, 8.0, size, nbytes) or not cnp.PyArray_CheckExact(p):
            return None
        cdef cnp.ndarray xa = <cnp.ndarray>x, pa = <cnp.ndarray>p
        cdef int nd = cnp.PyArray_NDIM(xa)
        if nd != 3 and nd != 4 or cnp.PyArray_DIM(xa, nd - 1) % 2:
            return None
        if (cnp.PyArray_TYPE(pa) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(pa)
                or not cnp.PyArray_ISALIGNED(pa) or not cnp.PyArray_ISNOTSWAPPED(pa)):
            return None
        cdef int pd = cnp.PyArray_NDIM(pa)
        if cnp.PyArray_DIM(pa, pd - 1) != cnp.PyArray_DIM(xa, nd - 2):
            return None
        if not (pd == 1 or pd == 2 and nd == 4 and cnp.PyArray_DIM(pa, 0) == cnp.PyArray_DIM(xa, 0)):
            return None
        nbytes[0] += 8.0 * cnp.PyArray_SIZE(pa)
        return (x, p, base, scale, style)

    cdef object run(self, object ready):
        x, p, base, scale, style = <tuple>ready
        return rope(x, p, base, scale, style)


add_hot = AddHot()
silu_mul_hot = SiluMulHot()
rope_hot = RopeHot()
scale_hot = ScaleHot()
softmax_hot = SoftmaxHot()


include "_threads.pxi"
