"""Runtime error codes -> GpuError. One place decides which `kind` (hipsched.errors.GpuError.KINDS) an
error name belongs to, for HIP (hipErrorOutOfMemory), the CUDA driver (CUDA_ERROR_OUT_OF_MEMORY),
hiprtc and NVRTC, so the executor's fallback and the telemetry classify failures the same way
whichever runtime produced them."""
from __future__ import annotations

import re

from ...errors import GpuError

# Ordered: the first rule whose pattern matches the normalised name wins. Names are normalised to
# lower case without "hiperror"/"cuda_error_"/underscores, so one rule covers HIP and CUDA.
_RULES = (
    ("oom", ("outofmemory", "memoryallocation")),
    ("timeout", ("launchtimeout",)),
    ("unavailable", ("nodevice", "invaliddevice", "insufficientdriver", "notinitialized", "initializationerror",
                     "deinitialized", "stublibrary", "systemdrivermismatch", "notsupported", "devicesunavailable",
                     "noloadlibrary", "compatnotsupportedondevice")),
    # Sticky errors: the context is unusable afterwards, so the scheduler should stop using the device.
    ("lost", ("illegaladdress", "eccuncorrectable", "eccnotcorrectable", "hardwarestackerror",
              "illegalinstruction", "misalignedaddress", "invalidaddressspace", "invalidpc", "launchfailure",
              "launchfailed", "assert", "contextisdestroyed", "devicelost", "unknown")),
    ("launch", ("launchoutofresources", "invalidconfiguration", "invaliddevicefunction", "cooperativelaunch",
                "launchincompatibletexturing")),
    ("compile", ("invalidimage", "nobinaryforgpu", "invalidkernelfile", "invalidptx", "invalidsource",
                 "jit", "nvrtcerror", "hiprtcerror", "notfound", "unsupportedptxversion")),
)


def _normalise(name: str) -> str:
    n = name.lower()
    for prefix in ("hiperror", "cuda_error_", "hiprtc_error_", "nvrtc_error_"):
        if n.startswith(prefix):
            n = n[len(prefix):]
    return re.sub(r"[^a-z0-9]", "", n)


def classify(name: str | None) -> str:
    """The GpuError kind for a runtime error name ("runtime" when nothing specific applies)."""
    if not name:
        return "runtime"
    if name.lower().startswith(("hiprtc_error", "nvrtc_error")):
        return "compile"
    n = _normalise(name)
    for kind, needles in _RULES:
        if any(needle in n for needle in needles):
            return kind
    return "runtime"


def gpu_error(name: str | None, what: str, code: int | None = None, kind: str | None = None) -> GpuError:
    """A GpuError for a failed runtime call `what` that returned error `name` (numeric `code`)."""
    detail = f"{what} failed"
    if name or code is not None:
        detail += f": {name or 'error'}" + (f" ({code})" if code is not None else "")
    return GpuError(kind or classify(name), detail, name=name)
