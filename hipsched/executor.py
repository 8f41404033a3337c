"""Executor: validate -> decide -> run -> (on GpuError) rerun on CPU -> record.

SKELETON: this first version only validates and runs on the CPU; the scheduler issue replaces the
body of `_run` with the decision core, fallback and telemetry. The public op methods below are the
API and keep their signatures."""
from __future__ import annotations

from .backends.cpu import CpuBackend
from .ops import OPS


class Executor:
    def __init__(self, config=None, **overrides):
        self.config = config
        self._cpu = CpuBackend()

    def _run(self, op, backend, stream, *args, **kwargs):
        call = OPS[op].prepare(*args, **kwargs)
        return self._cpu.run(call)

    # ------------------------------------------------------------------ ops
    def add(self, a, b, *, backend="auto", stream=None):
        """Elementwise a + b (float32). b may also match a trailing part of a's shape (a bias)."""
        return self._run("add", backend, stream, a, b)

    def scale(self, x, alpha, *, backend="auto", stream=None):
        """alpha * x (float32)."""
        return self._run("scale", backend, stream, x, alpha)

    def softmax(self, x, axis=-1, *, backend="auto", stream=None):
        """Numerically stable softmax along `axis` (float32)."""
        return self._run("softmax", backend, stream, x, axis=axis)

    def cosine_similarity(self, q, T, *, backend="auto", stream=None):
        """q (d,) or (m, d) against T (n, d) -> (n,) or (m, n) float32; a zero vector has similarity 0."""
        return self._run("cosine_similarity", backend, stream, q, T)

    def top_k(self, q, T, k, *, backend="auto", stream=None):
        """Exact k nearest rows of T by cosine -> (indices int64, scores float32), scores descending,
        ties to the lower index; k > n gives n results; q (m, d) gives (m, k) arrays."""
        return self._run("top_k", backend, stream, q, T, k)

    def matmul(self, a, b, *, backend="auto", stream=None):
        """a @ b in float32 (the CPU side is NumPy's BLAS)."""
        return self._run("matmul", backend, stream, a, b)

    def dequantize(self, w, *, backend="auto", stream=None):
        """QuantizedTensor -> float32 array of its shape."""
        return self._run("dequantize", backend, stream, w)

    def qmatmul(self, w, x, *, backend="auto", stream=None):
        """Quantized weights w (n, k) times float32 x (k,) or (k, m) -> (n,) or (n, m)."""
        return self._run("qmatmul", backend, stream, w, x)

    def attention(self, q, k, v, causal=False, scale=None, *, backend="auto", stream=None):
        """Scaled dot-product attention on (batch, heads, seq, head_dim) float32 arrays."""
        return self._run("attention", backend, stream, q, k, v, causal=causal, scale=scale)

    def spread_activation(self, graph, seeds, decay=0.5, steps=1, threshold=0.0, *, backend="auto", stream=None):
        """Spreading activation over a CSR graph (see docs): returns float32 activations (n,)."""
        return self._run("spread_activation", backend, stream, graph, seeds, decay=decay, steps=steps,
                         threshold=threshold)
