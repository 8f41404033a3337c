"""Errors hipsched raises. Every failure of a GPU runtime becomes a GpuError carrying the runtime's
own error name, so the executor can fall back on any of them and the telemetry can say which."""


class HipschedError(Exception):
    """Base class of hipsched's own errors."""


class GpuError(HipschedError):
    """A GPU-side failure. `kind` classifies it for fallback and telemetry: one of
    unavailable, compile, oom, launch, lost, timeout, copy, unsupported, runtime.
    `name` is the runtime's own error name (e.g. hipErrorOutOfMemory, CUDA_ERROR_LAUNCH_FAILED)."""

    KINDS = ("unavailable", "compile", "oom", "launch", "lost", "timeout", "copy", "unsupported", "runtime")

    def __init__(self, kind: str, message: str, name: str | None = None):
        if kind not in self.KINDS:
            kind = "runtime"
        self.kind = kind
        self.name = name
        super().__init__(f"[{kind}{'/' + name if name else ''}] {message}")

    def __reduce__(self):
        return (self.__class__, (self.kind, str(self).split("] ", 1)[-1], self.name))


class BuildMissingError(HipschedError, ImportError):
    """hipsched's compiled modules are not where the package was imported from: most often an unbuilt
    checkout in the current directory shadowing the installed package. The message names the fix."""
