"""Errors hipsched raises. Every failure of a GPU runtime becomes a GpuError carrying the runtime's
own error name, so the executor can fall back on any of them and the telemetry can say which."""


class HipschedError(Exception):
    """Base class of hipsched's own errors."""


class GpuError(HipschedError):
    """A GPU-side failure. `kind` classifies it for fallback and telemetry: one of
    unavailable, compile, oom, launch, lost, timeout, copy, unsupported, runtime.
    `name` is the runtime's own error name (e.g. hipErrorOutOfMemory, CUDA_ERROR_LAUNCH_FAILED).
    `message` is the text without the "[kind/name] " prefix that str() shows."""

    KINDS = ("unavailable", "compile", "oom", "launch", "lost", "timeout", "copy", "unsupported", "runtime")

    def __init__(self, kind: str, message: str, name: str | None = None):
        if kind not in self.KINDS:
            kind = "runtime"
        self.kind = kind
        self.name = name
        self.message = message
        super().__init__(f"[{kind}{'/' + name if name else ''}] {message}")

    def __reduce__(self):
        return (self.__class__, (self.kind, self.message, self.name))


class BuildMissingError(HipschedError, ImportError):
    """hipsched's compiled modules are not where the package was imported from: most often an unbuilt
    checkout in the current directory shadowing the installed package. The message names the fix."""
