"""What the Executor asks of a GPU backend, declared once: `GpuBackendBase`, every member the executor
calls, with the answers of a backend that lacks the capability. Every implementation inherits it: the
real one (backends/gpu.py), the stand-in when none loads (executor's _NoGpu), and the test doubles
(tests/support). The Executor then calls each member directly instead of
probing for it.

The split follows ggml's supports_op / offload_op: `supports(op, dtype)` is a table (can this device
run the op at all), `judge(call)` looks at one call (its shapes against the launch limits, its memory
against what is free, what it would copy), and `run` runs it."""
from __future__ import annotations

from ..errors import GpuError
from ..ops.base import host_arrays

# Host inputs at least this large are asked whether a GPU run would keep them (upload_sharing spreads
# their upload over the calls that reuse them; smaller uploads cost little next to a launch).
KEEP_QUERY_MIN_BYTES = 1 << 20


class Judgement:
    """A GPU backend's view of one call, taken once before it is decided (`GpuBackendBase.judge`) and
    carried on the call (`Call.judged`) to everything after: the decision's copy terms, the upload
    sharing rule, and the run, which launches the plan judged here rather than planning again and
    says here what it moved. `inputs`: (host array, trusted, resident now, a run would keep it) for
    each host input of at least KEEP_QUERY_MIN_BYTES (the one walk of the call's arguments);
    `plan`: the launch plan the judge checked (None: the backend has none to give); `moved`:
    (bytes uploaded, bytes read from kept copies) by the run, None where the backend does not count;
    `parts`: (bytes uploaded, upload us, kernel us) of a run of host data whose backend timed each part
    between events of its own (the copy engine's and the kernel's), None where it does not: the
    scheduler then treats the split of that run as unknown (docs/design/scheduling.md, "The performance
    model")."""

    __slots__ = ("refusal", "fits", "h2d", "d2h", "plan", "inputs", "moved", "parts")

    def __init__(self, refusal=None, fits=True, h2d=0, d2h=0, plan=None, inputs=()):
        self.refusal, self.fits, self.h2d, self.d2h = refusal, fits, h2d, d2h
        self.plan, self.inputs, self.moved, self.parts = plan, inputs, None, None


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

    def judge(self, call, wait_for_kernels=True) -> Judgement:
        """The Judgement of a call the scheduler could send here: why the device cannot run it (None:
        it can; judged on shapes and parameters before anything is uploaded; without `wait_for_kernels`
        also while a kernel it needs is compiled in the background), whether its device memory
        fits what is free now, the bytes a run would copy each way, and what it would keep. May raise:
        a failing query means the device cannot be trusted with the call. Composed here from the
        members a test double overrides; GpuBackend's does the same in one walk of the arguments."""
        why = self.unsupported(call)
        if why is not None:
            return Judgement(why, False)
        fits = self.device_bytes_needed(call) <= self._free_bytes()
        h2d, d2h = self.transfer_bytes(call)
        inputs = () if call.on_device else tuple(
            (a, trusted, resident, not resident and self.would_keep(a, trusted))
            for a, trusted in host_arrays(call.args, KEEP_QUERY_MIN_BYTES) for resident in (self.is_resident(a),))
        return Judgement(None, fits, int(h2d), int(d2h), inputs=inputs)

    def stream_for_thread(self):
        """A stream for the calling thread's GPU work, or None (the backend's default). The executor's
        submission threads ask: each thread's calls then go to a stream of their own, so that one call's
        copies can overlap another's kernel."""
        return None

    def _free_bytes(self) -> int:
        """The free memory a judgement compares with: GpuBackend's comes from its call engine, re-read at
        most every 10 ms (a decision must not cost a driver query); a stand-in's is its answer."""
        return int(self.free_memory())

    def forget_free_memory(self) -> None:
        """The device ran out of memory: the next judgement reads the free memory anew."""

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

    # whether upload() makes device arrays (a batch then keeps a chain's intermediates on the device)
    uploads = False

    def upload(self, host, stream=None):
        """A device array holding a copy of the host array `host` (copied when this returns), on this
        backend's device, or None where the backend has no device arrays of its own. A batch uploads a
        chain's host inputs so that the chain's intermediates stay on the device (hipsched/batch.py)."""
        return None

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

    def resident_summary(self) -> dict | None:
        return None

    def close(self) -> None:
        pass
