"""hipsched: run each numeric operation on the processor that finishes it first."""
from __future__ import annotations

import os
import threading

from .errors import GpuError, HipschedError
from .config import ConfigError, HybridConfig
from .executor import Executor
from .scheduling import (BackendSelection, ExecutionStrategy, ExecutorCapabilities, OpCapability,
                         PerformanceTracker, SelectionReason)
from .ops import OpType
from .ops.quant import *  # noqa: F401,F403  (QuantizedTensor, quantize once the quant family lands)

__version__ = "0.1.0"


def cpu_features() -> dict:
    """The SIMD level the CPU kernels use ("avx2" or "scalar"), the one detected, and the thread count."""
    from .cpu._features import cpu_features as _f
    return _f()


_default = None
_default_lock = threading.Lock()


def default_executor() -> Executor:
    """The process-wide executor behind the module-level ops (created on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Executor()
    return _default


def _forget_default_in_child():
    # The parent's default executor lives on in a forked child without its telemetry writer thread (and
    # with the parent's run id): the child builds its own on first use.
    global _default
    _default = None


os.register_at_fork(after_in_child=_forget_default_in_child)


def _forward(name):
    def op(*args, **kwargs):
        return getattr(default_executor(), name)(*args, **kwargs)
    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = getattr(Executor, name).__doc__
    return op


for _name in ("add", "scale", "softmax", "cosine_similarity", "top_k", "matmul", "dequantize", "qmatmul",
              "attention", "spread_activation"):
    globals()[_name] = _forward(_name)
del _name
