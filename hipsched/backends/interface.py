"""What the Executor asks of a GPU backend, declared once: `GpuBackendBase`, every member the executor
calls, with the answers of a backend that lacks the capability. Every implementation inherits it: the
real one (backends/gpu.py), the stand-in when none loads (executor's _NoGpu), and the test doubles
(tests/support). The Executor then calls each member directly instead of
probing for it.

The split follows ggml's supports_op / offload_op: `supports(op, dtype)` is a table (can this device
run the op at all), `judge(call)` looks at one call (its shapes against the launch limits, its memory
against what is free, what it would copy), and `run` runs it."""
from __future__ import annotations

import time

from ..errors import GpuError

# Free device memory is re-read at most every 10 ms: a decision must not cost a driver query.
FREE_MEMORY_TTL_NS = 10_000_000


class GpuBackendBase:
    """The interface's members with the answers of a backend that lacks the capability: no device, no
    timing events, no resident copies. `judge` is composed from `unsupported`, `device_bytes_needed`,
    `free_memory` and `transfer_bytes`, which an implementation overrides."""

    name = "gpu"
    available = False
    unavailable_reason: str | None = None
    device_name: str | None = None
    runtime_name: str | None = None
    device_arch: str | None = None
    callpath = None
    device_index: int | None = None
    # run_timed(call, stream) -> (result, ticket): a run whose device time its events measure, read back by
    # gpu_times(); None where a backend cannot time its runs (the dispatcher then calls run)
    run_timed = None
    _free_read = (0, 0)   # (when, bytes) of the last free-memory reading

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int:
        """How many devices this backend's runtime sees (an executor may take them all)."""
        return 1 if self.available else 0

    def for_device(self, index: int) -> "GpuBackendBase":
        """A backend like this one on device `index`, sharing the driver (never raises: one that cannot
        start says why in `unavailable_reason`)."""
        other = GpuBackendBase()
        other.unavailable_reason = f"{type(self).__name__} cannot bind device {index}"
        return other

    # ------------------------------------------------------------------ what the device takes
    def supports(self, op: str, dtype: str) -> bool:
        return False

    def max_elements(self, op: str) -> int:
        return 0

    def unsupported(self, call) -> str | None:
        """Why this device cannot run `call` (None: it can)."""
        return None

    def device_bytes_needed(self, call) -> int:
        return int(call.nbytes)

    def free_memory(self) -> int:
        return 0

    def transfer_bytes(self, call) -> tuple[int, int]:
        """(host->device, device->host) bytes a run of `call` copies (device data: none)."""
        return (0, 0) if call.on_device else (int(call.nbytes), 0)

    def judge(self, call) -> tuple[str | None, bool, int, int]:
        """(refusal, fits, h2d, d2h) of a call the scheduler could send here: why the device cannot run
        it (None: it can; judged on shapes and parameters before anything is uploaded), whether its
        device memory fits what is free now, and the bytes a run would copy each way. May raise: a
        failing query means the device cannot be trusted with the call."""
        why = self.unsupported(call)
        if why is not None:
            return why, False, 0, 0
        fits = self.device_bytes_needed(call) <= self._free_bytes()
        h2d, d2h = self.transfer_bytes(call)
        return None, fits, int(h2d), int(d2h)

    def _free_bytes(self) -> int:
        now = time.perf_counter_ns()
        when, free = self._free_read
        if now - when > FREE_MEMORY_TTL_NS or not when:
            free = int(self.free_memory())
            self._free_read = (now, free)
        return free

    def forget_free_memory(self) -> None:
        """The device ran out of memory: the next judgement reads the free memory anew."""
        self._free_read = (0, 0)

    def disable(self, reason: str) -> None:
        """The device is gone for this backend (a forked child, a driver that stopped answering): every
        later call stays on the CPU, and `unavailable_reason` says why."""
        if self.callpath is not None:
            self.callpath.enabled = False
        if self.available:
            self.available = False
            self.unavailable_reason = reason

    # ------------------------------------------------------------------ running
    def run(self, call, stream=None):
        raise GpuError("unavailable", self.unavailable_reason or "no GPU")

    # A backend whose runs on device data can be timed by events (see GpuBackend.run_timed) sets this
    # to its method; None: such runs are not timed.
    run_timed = None

    def gpu_times(self) -> list:
        return []

    def measure_transfer(self) -> dict:
        raise GpuError("unavailable", self.unavailable_reason or "no GPU")

    # ------------------------------------------------------------------ residency
    def keep_resident(self, handle) -> None:
        """Keep a ResidentArray on the device (no device: it works on the host alone)."""

    def would_keep(self, host, trusted: bool = False) -> bool:
        return False

    def is_resident(self, host) -> bool:
        return False

    def roofline_properties(self) -> dict | None:
        """{"launch_us", "gbps", "gflops"}: a tiny call's time, the device's memory bandwidth and peak
        rate, answered at once (device properties, figures measured when the backend opened), for the
        roofline prior (hipsched/priors.py); None where the backend cannot say (no prior is used)."""
        return None

    def last_run_parts(self) -> tuple[float, float, float] | None:
        """(bytes uploaded, upload us, kernel us) of this thread's last run of host data, each part timed
        between events of its own (the copy engine's and the kernel's), or None where the backend does
        not time its parts: the scheduler then treats the split of that run as unknown (it takes the
        modelled copies off the wall time, as before; docs/design/scheduling.md, "Measured copies")."""
        return None

    def transfer_totals(self) -> tuple[int, int] | None:
        """(bytes uploaded, bytes read from kept copies) by this thread's calls so far; None when the
        backend does not keep count."""
        return None

    def resident_summary(self) -> dict | None:
        return None

    def close(self) -> None:
        pass
