"""hipsched's CPU thread pool as threadpoolctl sees it: `threadpool_info()` lists it (internal_api
"hipsched", user_api "openmp", the OpenMP pool it is), and `threadpool_limits(n)` or
`threadpool_limits(n, user_api="openmp")` caps it with the others. Its threads are OpenMP's, but its cap is
its own: each kernel asks for a team of at most that many threads, so omp_set_num_threads (what
threadpoolctl does to libgomp) would not reach it."""
from __future__ import annotations

from threadpoolctl import LibController, register as _register

import hipsched.cpu as _cpu


class HipschedController(LibController):
    user_api = "openmp"
    internal_api = "hipsched"
    # the feature module's library (hipsched/cpu/_features.*.so), told from other `_features` libraries by
    # the symbol _features.pyx exports
    filename_prefixes = ("_features",)
    check_symbols = ("hipsched_cpu_thread_pool",)

    def get_num_threads(self):
        return _cpu.get_num_threads()

    def set_num_threads(self, num_threads):
        _cpu.set_num_threads(max(1, int(num_threads)))

    def get_version(self):
        return _cpu.__version__


_registered = False


def register():
    global _registered
    if not _registered:
        _registered = True
        _register(HipschedController)
