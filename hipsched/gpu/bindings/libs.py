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
# site-packages/nvidia/cu13/lib (nvidia-cuda-nvrtc 13.x) or nvidia/cuda_nvrtc/lib (the -cu12 and -cu11
# packages), which no loader path covers.
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
            # "cu*" also matches cuda_nvrtc; libnvrtc-builtins and the .alt. builds are not NVRTC itself
            found = glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libnvrtc.so*"))
            paths += sorted(found, reverse=True)
    paths += names  # bare names: the system loader's own search path
    seen, unique = set(), []
    for p in paths:
        if p not in seen:
            seen.add(p)
            unique.append(p)
    return unique


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


def open_all(kind: str) -> list[tuple[ctypes.CDLL, str]]:
    """Every distinct library file for `kind` that opens, in candidate order, as (handle, resolved path).
    Several NVRTCs may be installed at once (pip's CUDA 12 and CUDA 13 wheels, a system toolkit) and
    the driver decides which one's code it can load. With the environment override, only that file."""
    out, seen = [], set()
    for path in candidate_paths(kind):
        if os.path.isabs(path) and not os.path.exists(path):
            continue
        real = os.path.realpath(path) if os.path.isabs(path) else None
        if real is not None and real in seen:
            continue
        with _lock:
            cached = _opened.get(("file", real or path))
        if cached is None:
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            cached = (lib, real or resolved_path(lib, path))
            with _lock:
                _opened[("file", real or path)] = cached
        if cached[1] in seen:
            continue
        seen.add(cached[1])
        if real:
            seen.add(real)
        out.append(cached)
    return out


# A symbol each kind of library defines, for dladdr to name the file it came from.
_PROBE_SYMBOL = {"hip": "hipInit", "hiprtc": "hiprtcVersion", "cuda": "cuInit", "nvrtc": "nvrtcVersion"}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _dladdr_path(lib: ctypes.CDLL) -> str | None:
    try:
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.restype, dladdr.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    except (OSError, AttributeError):
        return None
    for symbol in _PROBE_SYMBOL.values():
        fn = getattr(lib, symbol, None)
        if fn is None:
            continue
        info = _DlInfo()
        if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            path = info.dli_fname.decode(errors="replace")
            if path.startswith("/"):
                return os.path.realpath(path)
    return None


def resolved_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The real file behind an opened library (so a version bump changes cache keys). Asked of the
    dynamic loader for one of its symbols: with two NVRTCs loaded, a file-name match would be ambiguous."""
    path = _dladdr_path(lib)
    if path:
        return path
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(" ")[-1]
                if path.startswith("/") and os.path.basename(path).startswith(os.path.basename(fallback).split(".so")[0] + ".so"):
                    return os.path.realpath(path)
    except OSError:
        pass
    return fallback
