# Included by each extension module whose kernels start OpenMP regions: every such module has its own thread
# cap (cpu_features.h's hs__threads), and hipsched.cpu.set_num_threads sets it in all of them through these.
cdef extern from "cpu_features.h":
    int hs_num_threads() nogil
    void hs_set_num_threads(int n) nogil


def _get_num_threads():
    return hs_num_threads()


def _set_num_threads(int n):
    hs_set_num_threads(n)


import hipsched.cpu as _cpu_package
_cpu_package._joined(_set_num_threads)   # a module loaded after a cap was set starts with it
