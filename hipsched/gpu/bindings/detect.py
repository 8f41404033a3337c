"""Which GPU runtime to use. `probe()` tries the bindings named by HIPSCHED_GPU_RUNTIME
(auto = hip-python, then hip, then cuda; or one of them; or none) and records why each one was not
taken; `get_runtime()` caches the first that works. Nothing here raises or crashes on a machine
without a GPU, a driver or the libraries."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from ...errors import GpuError
from .runtime import forked_error

ORDER = ("hip-python", "hip", "cuda")
CHOICES = ("auto", "none") + ORDER


@dataclass(frozen=True)
class RuntimeAttempt:
    name: str
    ok: bool
    reason: str | None      # why it was not taken (None when ok)


_lock = threading.Lock()
_state: dict = {}


def _construct(name: str):
    if name == "hip-python":
        from .hip_python import HipPythonRuntime  # deferred: only the binding chosen loads (hip-python is optional)
        return HipPythonRuntime()
    from .ctypes_api import CtypesRuntime  # deferred: only the binding chosen loads
    return CtypesRuntime("hip" if name == "hip" else "cuda")


def requested() -> tuple[list[str], str | None]:
    """(runtimes to try, problem with HIPSCHED_GPU_RUNTIME or None)."""
    choice = os.environ.get("HIPSCHED_GPU_RUNTIME", "auto").strip().lower() or "auto"
    if choice == "auto":
        return list(ORDER), None
    if choice == "none":
        return [], "disabled by HIPSCHED_GPU_RUNTIME=none"
    if choice in ORDER:
        return [choice], None
    return [], f"HIPSCHED_GPU_RUNTIME={choice!r} is not one of {', '.join(CHOICES)}"


def probe() -> tuple[list[RuntimeAttempt], object]:
    """Try the requested runtimes in order; returns (attempts, first working Runtime or None).
    Uncached: every call constructs afresh (use get_runtime() for the shared one)."""
    names, problem = requested()
    attempts, runtime = [], None
    if problem:
        attempts.append(RuntimeAttempt(os.environ.get("HIPSCHED_GPU_RUNTIME", "none"), False, problem))
    for name in names:
        if runtime is not None:
            attempts.append(RuntimeAttempt(name, False, f"not tried ({runtime.name} taken)"))
            continue
        try:
            runtime = _construct(name)
        except GpuError as e:
            attempts.append(RuntimeAttempt(name, False, _reason(e)))
        except Exception as e:   # a binding bug must not take the process down: record and go on
            attempts.append(RuntimeAttempt(name, False, f"init error: {type(e).__name__}: {e}"))
        else:
            attempts.append(RuntimeAttempt(name, True, None))
    return attempts, runtime


def _reason(e: GpuError) -> str:
    text = e.message
    if e.kind == "unavailable" and e.name and ("NoDevice" in e.name or "NO_DEVICE" in e.name):
        return f"{e.name} (no device)"
    if e.name and e.name not in text and not e.name.endswith("-missing"):
        text = f"{e.name}: {text}"
    return text


def _ensure():
    if "attempts" not in _state:
        with _lock:
            if "attempts" not in _state:
                attempts, runtime = probe()
                _state["runtime"] = runtime
                _state["attempts"] = attempts


def get_runtime():
    """The process-wide Runtime, or None when no GPU runtime works (see attempts())."""
    _ensure()
    return _state["runtime"]


def attempts() -> list[RuntimeAttempt]:
    """The cached probe: one RuntimeAttempt per runtime considered, in order."""
    _ensure()
    return list(_state["attempts"])


def gpu_available() -> bool:
    try:
        return get_runtime() is not None
    except Exception:
        return False


def unavailable_reason() -> str | None:
    """"hip: hipErrorNoDevice (no device); cuda: libcuda.so.1 not found", or None when a runtime works."""
    if gpu_available():
        return None
    return "; ".join(f"{a.name}: {a.reason}" for a in attempts()) or "no GPU runtime requested"


def reset() -> None:
    """Forget the cached probe (tests, or after changing HIPSCHED_GPU_RUNTIME)."""
    with _lock:
        _state.clear()


def _after_fork_in_child():
    # A runtime the parent initialised cannot be used in a forked child (CUDA answers
    # CUDA_ERROR_NOT_INITIALIZED to everything, ROCm may hang), and a fresh probe would initialise the
    # same driver in the same broken state: the child has no GPU, for one stated reason. A parent that
    # never probed left the driver untouched, so the child probes on first use as usual. The lock may
    # have been held by another parent thread at fork time.
    global _lock
    _lock = threading.Lock()
    runtime = _state.get("runtime")
    if runtime is not None:
        reason = forked_error(runtime.name).message
        _state["runtime"] = None
        _state["attempts"] = [RuntimeAttempt(runtime.name, False, reason)]


os.register_at_fork(after_in_child=_after_fork_in_child)
