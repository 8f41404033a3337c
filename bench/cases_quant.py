"""Quantization benchmarks: qmatmul against NumPy's float32 product on the already dequantized
matrix (the quantized kernel must turn reading 3.8x / 7.1x fewer bytes into time), and dequantize
against the gguf package's NumPy dequantizer."""
import numpy as np

from harness import Case


def cases():
    import gguf
    from gguf import GGMLQuantizationType as GT

    import hipsched as hs

    rng = np.random.default_rng(0)
    ex = hs.Executor()
    out = []

    n = k = 8192
    W = rng.standard_normal((n, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    X8 = rng.standard_normal((k, 8), dtype=np.float32)
    for qt, target in (("q8_0", 1.5), ("q4_0", 2.0)):
        w = hs.quantize(W, qt)
        Wf = ex.dequantize(w, backend="cpu")
        out.append(Case("qmatmul", f"{qt} W({n},{k}) @ x({k})", lambda w=w: ex.qmatmul(w, x, backend="cpu"),
                        lambda Wf=Wf: Wf @ x, "numpy Wf@x (float32)", bytes=w.nbytes + 4 * (k + n),
                        flops=2.0 * n * k, target=target, family="quant"))
        out.append(Case("qmatmul", f"{qt} W({n},{k}) @ X({k},8)", lambda w=w: ex.qmatmul(w, X8, backend="cpu"),
                        lambda Wf=Wf: Wf @ X8, "numpy Wf@X (float32)", bytes=w.nbytes + 4 * 8 * (k + n),
                        flops=2.0 * n * k * 8, target=1.0, family="quant"))
        del Wf
    del W

    n = k = 4096
    W = rng.standard_normal((n, k), dtype=np.float32)
    for qt, gt in (("q8_0", GT.Q8_0), ("q4_0", GT.Q4_0)):
        w = hs.quantize(W, qt)
        raw = np.array(w.data)
        out.append(Case("dequantize", f"{qt} ({n},{k})", lambda w=w: ex.dequantize(w, backend="cpu"),
                        lambda raw=raw, gt=gt: gguf.quants.dequantize(raw, gt), "gguf.quants.dequantize",
                        bytes=w.nbytes + 4 * n * k, target=10.0, family="quant"))
    return out
