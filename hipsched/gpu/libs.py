"""Finding and opening the vendor shared libraries (HIP runtime, hiprtc, CUDA driver, NVRTC).

Every binding and compiler opens its library through `open_library`, so the search order, the
environment overrides and the "why not" text that `python -m hipsched info` prints are the same
everywhere. Nothing here raises anything but LibraryNotFound."""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading


class LibraryNotFound(OSError):
    """None of the candidate files could be opened; the message lists what was tried."""


_lock = threading.Lock()
_opened: dict[tuple, tuple[ctypes.CDLL, str]] = {}


def _site_dirs() -> list[str]:
    dirs = []
    for entry in sys.path:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            dirs.append(entry)
    return dirs


# Candidate file names, most specific first. Pip's NVIDIA wheels put NVRTC under
# site-packages/nvidia/{cu13,cuda_nvrtc}/lib, which no loader path covers.
CANDIDATES = {
    "hip": ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"],
    # ROCm >= 6 ships hiprtc as its own library; ROCm 5.x keeps it inside libamdhip64.
    "hiprtc": ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libamdhip64.so", "libamdhip64.so.6",
               "libamdhip64.so.5"],
    "cuda": ["libcuda.so.1", "libcuda.so"],
    "nvrtc": ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"],
}
ENV_OVERRIDE = {"hip": "HIPSCHED_HIP_LIBRARY", "hiprtc": "HIPSCHED_HIPRTC_LIBRARY",
                "cuda": "HIPSCHED_CUDA_LIBRARY", "nvrtc": "HIPSCHED_NVRTC_LIBRARY"}


def candidate_paths(kind: str) -> list[str]:
    """Where `kind` ("hip", "hiprtc", "cuda", "nvrtc") is looked for, in order."""
    names = list(CANDIDATES[kind])
    override = os.environ.get(ENV_OVERRIDE[kind])
    if override:
        return [override]
    paths = []
    roots = [os.environ.get("ROCM_PATH"), "/opt/rocm"] if kind in ("hip", "hiprtc") else \
        [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    for root in filter(None, roots):
        for sub in ("lib", "lib64"):
            paths += [os.path.join(root, sub, n) for n in names]
    if kind == "nvrtc":
        for site in _site_dirs():
            for pattern in ("nvidia/cu*/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*"):
                paths += sorted((p for p in glob.glob(os.path.join(site, pattern)) if "builtins" not in p),
                                reverse=True)
    paths += names  # bare names: the system loader's own search path
    return paths


def open_library(kind: str) -> tuple[ctypes.CDLL, str]:
    """Open the library for `kind`; returns (handle, resolved file path). Cached per kind."""
    with _lock:
        key = (kind, os.environ.get(ENV_OVERRIDE[kind]))
        if key in _opened:
            return _opened[key]
        tried = []
        for path in candidate_paths(kind):
            if os.path.isabs(path) and not os.path.exists(path):
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path}: {str(e).split(':')[-1].strip()}")
                continue
            result = (lib, resolved_path(lib, path))
            _opened[key] = result
            return result
        names = ", ".join(CANDIDATES[kind]) if not os.environ.get(ENV_OVERRIDE[kind]) else \
            os.environ[ENV_OVERRIDE[kind]]
        raise LibraryNotFound(f"{names} not found" + (f" ({tried[0]})" if tried else ""))


def resolved_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The real file behind an opened library (so a version bump changes cache keys)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(" ")[-1]
                if path.startswith("/") and os.path.basename(path).startswith(os.path.basename(fallback).split(".so")[0] + ".so"):
                    return os.path.realpath(path)
    except OSError:
        pass
    return fallback
