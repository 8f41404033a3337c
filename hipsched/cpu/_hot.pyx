# cython: language_level=3
"""The base of the compiled common cases (see _hot.pxd): a HotOp that accepts nothing, so an op
whose module declares none simply always takes its general path."""


cdef class HotOp:
    cdef object check(self, tuple args, dict kwargs, double *size, double *nbytes):
        return None

    cdef object run(self, object ready):
        raise NotImplementedError(f"{type(self).__name__}.run")
