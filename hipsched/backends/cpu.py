"""CpuBackend: runs a validated Call through the C kernels (hipsched/cpu/_<family> extensions).
Each op maps to a function `family.op(*call.args, **call.params)` taking C-contiguous float32 host
arrays (or op objects such as QuantizedTensor) and returning NumPy results."""
from __future__ import annotations

import importlib

# op -> (extension module under hipsched.cpu, function name)
CPU_IMPLS = {
    "add": ("_elementwise", "add"),
    "scale": ("_elementwise", "scale"),
    "softmax": ("_elementwise", "softmax"),
    "cosine_similarity": ("_similarity", "cosine_similarity"),
    "top_k": ("_similarity", "top_k"),
    "matmul": ("_similarity", "matmul"),
    "dequantize": ("_quant", "dequantize"),
    "qmatmul": ("_quant", "qmatmul"),
    "attention": ("_attention", "attention"),
    "spread_activation": ("_graph", "spread_activation"),
}


class CpuBackend:
    name = "cpu"
    available = True

    def __init__(self):
        self._fns = {}

    def _load(self, op):
        module, fn = CPU_IMPLS[op]
        f = getattr(importlib.import_module(f"hipsched.cpu.{module}"), fn)
        self._fns[op] = f
        return f

    def run(self, call, stream=None):
        """Run on host arrays; the executor moves device inputs to the host before calling this."""
        f = self._fns.get(call.op) or self._load(call.op)
        return f(*call.args, **call.params)
