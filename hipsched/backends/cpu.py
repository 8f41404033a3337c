"""CpuBackend: runs a validated Call through the C kernels (hipsched/cpu/_<family> extensions).
Each op's spec names a function `f(*call.args, **call.params)` taking C-contiguous float32 host
arrays (or op objects such as QuantizedTensor) and returning NumPy results."""
from __future__ import annotations

from ..ops import OPS

# op -> (module, function) of its CPU kernel, as the op specs declare it
CPU_IMPLS = {name: spec.cpu for name, spec in OPS.items()}


class CpuBackend:
    name = "cpu"
    available = True

    def __init__(self):
        self._fns = {}

    def _load(self, op):
        f = OPS[op].cpu_function()
        self._fns[op] = f
        return f

    def run(self, call, stream=None):
        """Run on host arrays; the executor moves device inputs to the host before calling this."""
        f = self._fns.get(call.op) or self._load(call.op)
        return f(*call.args, **call.params)
