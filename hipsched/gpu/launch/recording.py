"""PlanRecorder: a GpuContext stand-in that watches one run of an op's launch glue and writes it down as
a replayable plan (hipsched/gpu/launch/_callpath.pyx's Plan).

Every call goes through to the real context, so the recorded run is an ordinary run with ordinary
results. What the glue does through `upload` (of device inputs), `empty`, `scratch`, `run`/`launch` and
`finish` is recorded: each kernel parameter becomes either a fixed value (a ctypes scalar, computed
from shapes and scalar parameters, which the plan's key holds) or a pointer into one of the call's
device inputs, outputs or scratch buffers, located by address. Anything else the glue reaches for (the
runtime itself, the vendor BLAS, a host upload, a download) makes the run unreplayable: those calls
keep going through the glue."""
from __future__ import annotations

import ctypes

import numpy as np

from .context import _as_dim3

# GpuContext attributes a plan may depend on: fixed for the context's life (device geometry, the
# compiled kernels and their limits)
_READS = frozenset(("multiprocessors", "warp_size", "arch", "platform", "target", "device", "check_launches", "planned",
                    "check", "function", "resources", "blocks_for", "cache", "_planned"))


class PlanRecorder:
    def __init__(self, ctx, inputs, stream):
        """`inputs`: the call's array inputs as (pointer, bytes, is a host array), in the plan key's order;
        `stream`: the call's stream handle."""
        self._ctx = ctx
        self._inputs = [(int(p), int(n), bool(h)) for p, n, h in inputs]
        self._uploads = []      # (device pointer, bytes, input) of host inputs' device copies
        self._stream = int(stream or 0)
        self._outputs = []      # (pointer, bytes)
        self._scratch = []      # (pointer, bytes) of distinct buffers
        self._launches = []     # (function, grid, block, shared, params)
        self._results = None
        self._single = True
        self._to_host = False
        self.refused = None     # why the run cannot be replayed, or None

    def _refuse(self, why):
        if self.refused is None:
            self.refused = why

    def __getattr__(self, name):
        if name not in _READS:
            self._refuse(f"the glue used ctx.{name}")
        return getattr(self._ctx, name)

    def blas(self):
        """The vendor BLAS: its calls go through Python, so a run that uses one is not replayable; a
        context without one (the glue then launches its own kernels) is."""
        blas = self._ctx.blas()
        if blas is not None:
            self._refuse("the vendor BLAS")
        return blas

    # ------------------------------------------------------------------ what a plan redoes
    def upload(self, x, stream, immutable=False, pack=None):
        dev = self._ctx.upload(x, stream, immutable, pack)
        if isinstance(x, np.ndarray):
            # a host input the plan stages up itself: one of the call's (never a kept resident copy)
            ptr = x.__array_interface__["data"][0]
            found = [i for i, (p, n, host) in enumerate(self._inputs) if host and p == ptr and n == x.nbytes]
            if not found or immutable or pack is not None or not x.flags.writeable:
                self._refuse("a host input the call does not stage")
            else:
                self._uploads.append((int(dev.ptr), int(dev.nbytes), found[0]))
        return dev

    def empty(self, shape, dtype, stream):
        out = self._ctx.empty(shape, dtype, stream)
        self._outputs.append((out.ptr, out.nbytes))
        return out

    def scratch(self, name, shape, dtype, stream):
        buf = self._ctx.scratch(name, shape, dtype, stream)
        for i, (ptr, nbytes) in enumerate(self._scratch):
            if ptr == buf.ptr:    # the same named buffer again: one buffer, as large as its largest use
                self._scratch[i] = (ptr, max(nbytes, buf.nbytes))
                return buf
        self._scratch.append((buf.ptr, buf.nbytes))
        return buf

    def run(self, launch, args, stream=0):
        self._ctx.run(launch, args, stream)
        fn = self._ctx._planned.get(launch) or self._ctx.function(launch.source, launch.kernel)
        self._launch(fn, launch.grid, launch.block, launch.shared, args, stream)

    def launch(self, fn, grid, block, args, shared=0, stream=0):
        self._ctx.launch(fn, grid, block, args, shared=shared, stream=stream)
        self._launch(fn, _as_dim3(grid), _as_dim3(block), shared, args, stream)

    def finish(self, out, call, stream):
        items = out if isinstance(out, tuple) else (out,)
        self._single = not isinstance(out, tuple)
        self._to_host = not call.on_device
        results = []
        for o in items:
            where = self._locate(int(o.ptr), outputs_only=True)
            if where is None or not o.is_c_contiguous:
                self._refuse("a result that is not one of the run's outputs")
                break
            results.append((where[1], where[2], tuple(o.shape), o.dtype, tuple(o.strides)))
        self._results = results
        return self._ctx.finish(out, call, stream)

    # ------------------------------------------------------------------ the record
    def _launch(self, fn, grid, block, shared, args, stream):
        if int(stream or 0) != self._stream:
            self._refuse("a launch on another stream")
            return
        params = []
        for a in args:
            if isinstance(a, ctypes._SimpleCData):
                raw = ctypes.string_at(ctypes.addressof(a), ctypes.sizeof(a))
                if len(raw) > 8:
                    self._refuse("a kernel parameter wider than 8 bytes")
                    return
                params.append(("value", raw.ljust(8, b"\0")))
            elif a is None:
                params.append(("value", bytes(8)))
            elif hasattr(a, "ptr"):
                where = self._locate(int(a.ptr))
                if where is None:
                    self._refuse("a pointer into memory the call does not own")
                    return
                params.append(("ptr",) + where)
            else:
                self._refuse(f"a kernel parameter of type {type(a).__name__}")
                return
        self._launches.append((int(fn), tuple(grid), tuple(block), int(shared), params))

    def _locate(self, ptr, outputs_only=False):
        """(kind, index, delta) of the buffer holding `ptr`: 1 an output, 2 a scratch buffer, 0 an input."""
        groups = ((1, self._outputs),) if outputs_only else ((1, self._outputs), (2, self._scratch))
        for kind, buffers in groups:
            for i, (base, nbytes) in enumerate(buffers):
                if base <= ptr < base + max(nbytes, 1):
                    return (kind, i, ptr - base)
        if not outputs_only:
            for i, (base, nbytes, host) in enumerate(self._inputs):
                if not host and base <= ptr < base + max(nbytes, 1):
                    return (0, i, ptr - base)
            for base, nbytes, i in self._uploads:
                if base <= ptr < base + max(nbytes, 1):
                    return (0, i, ptr - base)
        return None

    def plan(self):
        """The Plan (gpu/launch/_callpath.pyx) of the run, or None when it cannot be replayed."""
        if self.refused is not None or self._results is None:
            return None
        from ._callpath import Plan   # deferred: compiled, and loaded only where the fast path is used
        return Plan.build([(n, host) for _, n, host in self._inputs], [n for _, n in self._outputs],
                          [n for _, n in self._scratch], self._launches, self._results, self._single, self._to_host)
