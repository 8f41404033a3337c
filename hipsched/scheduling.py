"""The scheduler's public types: strategies, reasons, capabilities, a decision, and the seeds'
PerformanceTracker view over the learned model. The model itself lives in hipsched._sched."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from . import _sched
from .config import STRATEGIES

# The strategies and reasons are defined once: the strategies by config.STRATEGIES (which _sched checks
# against its Strategy enum), the reasons by _sched's Reason enum (_sched.REASONS, in index order). The
# member names are the values upper-cased (ExecutionStrategy.GPU_PREFERRED == "gpu_preferred").
ExecutionStrategy = Enum("ExecutionStrategy", [(s.upper(), s) for s in STRATEGIES], type=str, module=__name__,
                         qualname="ExecutionStrategy")
ExecutionStrategy.__doc__ = """How the executor picks a backend (HybridConfig.strategy): automatic (the cost model),
gpu_preferred, cpu_preferred, or backend_only (always HybridConfig.backend)."""

SelectionReason = Enum("SelectionReason", [(r.upper(), r) for r in _sched.REASONS], type=str, module=__name__,
                       qualname="SelectionReason")
SelectionReason.__doc__ = """Why a backend was chosen (BackendSelection.reason, the events' "reason"):

    GPU_AVAILABLE      strategy gpu_preferred sent it to the GPU, or its device inputs live on a further
                       GPU, which runs it while it is up and healthy
    GPU_UNAVAILABLE    no GPU, or none for this op / dtype / size
    CPU_FALLBACK       the GPU failed; the call reran on the CPU
    COST_MODEL         least predicted completion time
    MEMORY_CONSTRAINT  does not fit in free device memory
    USER_PREFERENCE    backend= on the call, force_cpu_mode, or a fixed strategy
    BELOW_MIN_BATCH    smaller than gpu_min_batch_size
    GPU_UNHEALTHY      the op's circuit breaker is open
    EXPLORING          sent to the side whose model needs samples (or a breaker probe)
    GPU_UNSUPPORTED    the GPU has the op but cannot run this call (its shapes, parameters)
    SPLIT              cut across the CPU and the GPU, each taking a share of the rows (backend "split")"""

# the core returns reasons as indices into this tuple
REASONS = tuple(SelectionReason)
BACKENDS = ("cpu", "gpu")


@dataclass(frozen=True)
class OpCapability:
    """What one backend can do for one op."""
    op: str
    backend: str
    dtypes: tuple[str, ...]
    max_elements: int              # largest Call.size accepted
    required_feature: str | None = None   # e.g. "avx2" (optional speed-up) or "gpu"


@dataclass(frozen=True)
class BackendSelection:
    backend_id: str                # "cpu" | "gpu"
    reason: SelectionReason
    estimated_cost: dict = field(default_factory=dict)   # {"cpu": us or None, "gpu": us or None}
    detail: str | None = None      # gpu_unsupported: why the GPU refuses the call

    @property
    def backend(self) -> str:
        return self.backend_id


@dataclass(frozen=True)
class ExecutorCapabilities:
    gpu_available: bool
    gpu_device_name: str | None
    cpu_simd_level: str
    reasons: tuple[str, ...]       # why the GPU is unavailable (empty when it is available)
    gpu_runtime: str | None = None
    gpu_arch: str | None = None
    cpu_threads: int = 1
    ops: tuple[OpCapability, ...] = ()
    gpu_devices: tuple[int, ...] = ()  # the GPUs in use: the one backend="gpu" means, then those split calls use

    def supports(self, op: str, backend: str = "gpu") -> bool:
        return any(c.op == op and c.backend == backend for c in self.ops)


def us_or_none(x: float):
    return None if x is None or math.isnan(x) else float(x)


class PerformanceTracker:
    """The seeds' tracker API over the executor's learned model. Latencies in microseconds; `size` is
    the op's work measure (Call.size), needed to put a sample in its size bucket. The model is per
    (op, dtype): `dtype` here is the default; the model-reading methods also take one per call."""

    def __init__(self, core, dtype: str = "float32"):
        self._core = core
        self._dtype = dtype

    def _slot(self, op, dtype=None):
        return self._core.slot(op, dtype or self._dtype)

    def record_cpu_latency(self, op: str, latency_us: float, size: int = 1) -> None:
        self._core.record_sample(self._slot(op), 0, size, latency_us)

    def record_gpu_success(self, op: str, latency_us: float, size: int = 1) -> None:
        self._core.record_sample(self._slot(op), 1, size, latency_us)

    def record_gpu_failure(self, op: str, size: int = 1) -> None:
        self._core.record_gpu_failure(self._slot(op), size, 0.0)

    def gpu_speedup(self, op: str, size: int | None = None, dtype: str | None = None):
        """Predicted CPU time / GPU kernel time at `size`, or, without a size, the median of that
        ratio over the size buckets measured on both sides. None when there is not enough data."""
        sid = self._slot(op, dtype)
        if size is not None:
            c, g = self._core.predict(sid, 0, size), self._core.predict(sid, 1, size)
            return None if math.isnan(c) or math.isnan(g) or g <= 0 else c / g
        cpu = {b[0]: b[3] for b in self._core.buckets(sid, 0)}
        ratios = sorted(cpu[b[0]] / b[3] for b in self._core.buckets(sid, 1) if b[0] in cpu and b[3] > 0)
        return ratios[(len(ratios) - 1) // 2] if ratios else None

    def gpu_success_rate(self, op: str) -> float:
        """Share of the op's recent GPU runs (the window) that succeeded; 1.0 before any."""
        return self._core.health(op)["success_rate"]

    def breaker_state(self, op: str) -> str:
        return self._core.health(op)["state"]

    def samples(self, op: str, backend: str = "cpu", dtype: str | None = None) -> list[tuple]:
        """[(bucket, samples held, mean size, median us, samples ever)] per measured size bucket."""
        return self._core.buckets(self._slot(op, dtype), BACKENDS.index(backend))
