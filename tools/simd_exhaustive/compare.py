"""Exhaustive: every float32 bit pattern through exp, exp_neg and the half stores, every 16-bit pattern
through the half loads, level A vs level B (and each store vs simd.h's scalar reference)."""
import ctypes, sys, time
import numpy as np
a_path, b_path = sys.argv[1], sys.argv[2]
A, B = ctypes.CDLL(a_path), ctypes.CDLL(b_path)
P = ctypes.c_void_p
def call(lib, name, x, o):
    getattr(lib, name)(P(x.ctypes.data), P(o.ctypes.data), ctypes.c_long(x.size))
CH = 1 << 24
bad = {}
t0 = time.time()
for c in range(1 << 32 >> 24):
    u = np.arange(c * CH, (c + 1) * CH, dtype=np.uint64).astype(np.uint32)
    x = u.view(np.float32)
    for fn in ("h_exp", "h_expn"):
        oa = np.empty(CH, np.float32); ob = np.empty(CH, np.float32)
        call(A, fn, x, oa); call(B, fn, x, ob)
        d = (oa.view(np.uint32) != ob.view(np.uint32)).sum()
        if d: bad[fn] = bad.get(fn, 0) + int(d)
    for fn, ref in (("h_f16", "h_ref_f16"), ("h_bf16", "h_ref_bf16")):
        oa = np.empty(CH, np.uint16); ob = np.empty(CH, np.uint16); orf = np.empty(CH, np.uint16)
        call(A, fn, x, oa); call(B, fn, x, ob); call(A, ref, x, orf)
        for tag, o in (("A", oa), ("B", ob)):
            d = (o != orf).sum()
            if d: bad[fn + "_vs_ref_" + tag] = bad.get(fn + "_vs_ref_" + tag, 0) + int(d)
h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
for fn, ref in (("h_lf16", "h_ref_lf16"), ("h_lbf16", "h_ref_lbf16")):
    for tag, lib in (("A", A), ("B", B)):
        o = np.empty(h.size, np.float32); orf = np.empty(h.size, np.float32)
        call(lib, fn, h, o); call(A, ref, h, orf)
        d = (o.view(np.uint32) != orf.view(np.uint32)).sum()
        if d: bad[fn + "_vs_ref_" + tag] = int(d)
print(f"{a_path} vs {b_path}: {time.time() - t0:.0f}s, mismatches: {bad or 'none'}")
sys.exit(1 if bad else 0)
