"""CPU engine: one Cython extension per op family wrapping the C kernels in src_c/cpu/."""
import os


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
_LEVELS = ("scalar", "none", "avx2", "avx512")
if os.environ.get("HIPSCHED_CPU_FEATURES", "") not in ("",) + _LEVELS:
    import warnings
    warnings.warn(f"HIPSCHED_CPU_FEATURES={os.environ['HIPSCHED_CPU_FEATURES']!r} is not one of "
                  f"{', '.join(_LEVELS)}: the CPU kernels use the highest level this CPU has", RuntimeWarning,
                  stacklevel=2)
