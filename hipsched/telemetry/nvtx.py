"""Optional NVTX (NVIDIA) / roctx (ROCm) ranges, so hipsched phases and ops appear on Nsight Systems and
rocprof timelines. Loaded lazily through ctypes the first time a range is requested; when neither
library is present every call is a cheap no-op. HIPSCHED_NVTX=0 turns it off."""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager

_CANDIDATES = (
    # (library, push symbol, pop symbol)
    ("libroctx64.so", "roctxRangePushA", "roctxRangePop"),
    ("libroctx64.so.4", "roctxRangePushA", "roctxRangePop"),
    ("libnvToolsExt.so", "nvtxRangePushA", "nvtxRangePop"),
    ("libnvToolsExt.so.1", "nvtxRangePushA", "nvtxRangePop"),
)

_lock = threading.Lock()
_loaded = False
_push = None
_pop = None
library = None  # name of the library in use, or None


def _load():
    global _loaded, _push, _pop, library
    with _lock:
        if _loaded:
            return
        _loaded = True
        if os.environ.get("HIPSCHED_NVTX", "1") in ("0", "false", "no", "off"):
            return
        for name, push, pop in _CANDIDATES:
            try:
                lib = ctypes.CDLL(name)
                p, q = getattr(lib, push), getattr(lib, pop)
            except (OSError, AttributeError):
                continue
            p.argtypes, p.restype = [ctypes.c_char_p], ctypes.c_int
            q.argtypes, q.restype = [], ctypes.c_int
            _push, _pop, library = p, q, name
            return


def available() -> bool:
    if not _loaded:
        _load()
    return _push is not None


def push(name: str) -> bool:
    """Open a range; returns whether one was opened (so the caller pops only then)."""
    if not _loaded:
        _load()
    if _push is None:
        return False
    _push(name.encode("utf-8", "replace"))
    return True


def pop() -> None:
    if _pop is not None:
        _pop()


@contextmanager
def annotate(name: str):
    """`with nvtx.annotate("cosine_similarity"):` marks the block on a profiler timeline."""
    opened = push(name)
    try:
        yield
    finally:
        if opened:
            pop()
