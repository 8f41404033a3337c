"""CPU engine: one Cython extension per op family wrapping the C kernels in src_c/cpu/."""
import os
import threading

# the package's version, restated here (a leaf may not import the package above it): threadpoolctl
# reports it as the pool's version; tests/cpu/test_thread_pool.py holds the two equal
__version__ = "0.1.0"

# Each family's extension module keeps its own thread cap (src_c/cpu/cpu_features.h): these are their
# setters, each module adding its own when it is imported (hipsched/cpu/_threads.pxi), and the cap last
# set (None: each module's default, the OpenMP thread count capped by HIPSCHED_NUM_THREADS).
_setters = []
_cap = None
_cap_lock = threading.Lock()


def _joined(setter):
    with _cap_lock:
        _setters.append(setter)
        if _cap is not None:
            setter(_cap)


def set_num_threads(n):
    """Run every CPU kernel on at most `n` threads from now on (n >= 1), in this process; None: back to
    the default (OpenMP's thread count, capped by HIPSCHED_NUM_THREADS). threadpoolctl's
    `threadpool_limits` calls this for hipsched's pool (hipsched/cpu/threadpool.py). A forked child runs
    on one thread whatever the cap (OpenMP's pool does not survive fork)."""
    global _cap
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"set_num_threads: n must be an integer >= 1 or None, got {n!r}")
    with _cap_lock:
        _cap = n
        for setter in _setters:
            setter(0 if n is None else n)


def get_num_threads() -> int:
    """The most threads a CPU kernel runs on now (hipsched.cpu_features()["threads"] reads the same)."""
    from . import _features   # deferred: the build may be missing; this says so where it is asked
    return _features._get_num_threads()


def _mark_forked_child():
    # Read by src_c/cpu/cpu_features.h in extension modules first imported after a fork: OpenMP's
    # thread pool is unusable in a forked child, so their kernels must run single-threaded. The pid
    # makes the mark mean nothing to processes that merely inherit the environment (spawn, exec).
    os.environ["HIPSCHED_FORKED_CHILD"] = str(os.getpid())


# This file runs once per process image: a forked child inherits it already imported. So a mark seen
# here was left by an earlier image of this pid (os.fork then exec), whose OpenMP pool is gone with it.
os.environ.pop("HIPSCHED_FORKED_CHILD", None)
os.register_at_fork(after_in_child=_mark_forked_child)

# src_c/cpu/cpu_features.h runs the detected level for a value it does not know; a misspelt level
# ("avx-512") would otherwise pass unnoticed.
_LEVELS = ("scalar", "none", "avx2", "avx512", "avx512_bf16")
if os.environ.get("HIPSCHED_CPU_FEATURES", "") not in ("",) + _LEVELS:
    import warnings
    warnings.warn(f"HIPSCHED_CPU_FEATURES={os.environ['HIPSCHED_CPU_FEATURES']!r} is not one of "
                  f"{', '.join(_LEVELS)}: the CPU kernels use the highest level this CPU has", RuntimeWarning,
                  stacklevel=2)

# The pool's module, imported here: threadpoolctl finds the pool by its library, which must be loaded for
# threadpool_info to list it. Its runtime's threads sleep between regions (hipsched/openmp_runtime.py
# says why): `import hipsched` has loaded the runtime already where it could (Linux); elsewhere, or where
# the library is not on the loader's path but is on our modules' rpath, this import loads it, the policy
# set only around it. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is.
from ..openmp_runtime import passive_while_loading as _passive_while_loading  # noqa: E402
with _passive_while_loading():
    try:
        from . import _features  # noqa: F401  (loads libgomp)
    except ImportError:   # not built: the layer that needs it says so when it is used
        pass

# threadpoolctl lists hipsched's pool and limits it (threadpool_info(), threadpool_limits()): registered
# here, where the pool's module is loaded, when threadpoolctl is installed (it is a dependency; a copy
# without it still runs)
try:
    from .threadpool import register as _register_with_threadpoolctl
except ImportError:   # threadpoolctl missing or too old to take a controller
    pass
else:
    _register_with_threadpoolctl()
