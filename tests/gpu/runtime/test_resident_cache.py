"""ResidentCache and the garbage collector: an entry's host array dying must never take the cache's lock
from inside the collector. The collector runs weakref callbacks on whatever thread allocates, and the
cache allocates under its (non-reentrant) lock (fingerprint, the entry tuple), so a callback that took
the lock there deadlocked the thread on itself. The callback only queues the key now; the next cache
operation drops it (CPython's WeakValueDictionary does the same with _pending_removals)."""
import ctypes
import gc

import numpy as np

from hipsched.gpu.memory.resident_cache import ResidentCache

from host_memory import HostMemoryRuntime, run_bounded  # noqa: F401


def frozen(a):
    a.flags.writeable = False   # only arrays nothing can write are kept implicitly
    return a


def test_host_array_dying_in_a_cycle_while_the_lock_is_held_does_not_deadlock():
    """Deterministic: the collector runs where an allocation under the lock would run it (inside
    fingerprint), while a cached array's only owner is a reference cycle."""
    run_bounded('''
        import gc
        import numpy as np
        from hipsched.gpu.memory import resident_cache
        from hipsched.gpu.memory.resident_cache import ResidentCache

        class Holder:
            pass

        real = resident_cache.fingerprint

        def fingerprint_that_collects(arr):
            gc.collect()          # what gc.set_threshold(1) makes any allocation here do
            return real(arr)

        cache = ResidentCache(HostMemoryRuntime(), max_bytes=1 << 20)
        other = np.ones(256, np.float32)
        other.flags.writeable = False    # only read-only arrays are kept
        cache.get(other)
        for i in range(3):
            h = Holder()
            h.me = h              # only the collector frees it, and its array with it
            h.arr = np.full(256, i, np.float32)
            h.arr.flags.writeable = False
            cache.get(h.arr)
            del h
            resident_cache.fingerprint = fingerprint_that_collects
            try:
                assert cache.get(other) is not None and cache.is_resident(other)   # hits: under the lock
            finally:
                resident_cache.fingerprint = real
        assert len(cache) == 1 and cache.bytes == other.nbytes, (len(cache), cache.bytes)
        print("ok")
    ''')


def test_collector_at_every_allocation_never_deadlocks_the_cache():
    """The same with the collector left to itself: gc.set_threshold(1) runs it at nearly every
    allocation, cycles dying at every step, for a few thousand cache operations."""
    run_bounded('''
        import gc
        import numpy as np
        from hipsched.gpu.memory.resident_cache import ResidentCache

        class Holder:
            pass

        cache = ResidentCache(HostMemoryRuntime(), max_bytes=64 * 1024)
        keep = [np.ones(64, np.float32) for _ in range(4)]
        for k in keep:
            k.flags.writeable = False    # only read-only arrays are kept
        gc.collect()
        gc.set_threshold(1)
        for i in range(2000):
            h = Holder()
            h.me = h
            h.arr = np.full(64 + i % 7, i, np.float32)
            h.arr.flags.writeable = False
            cache.get(h.arr)
            del h
            cache.get(keep[i % 4])
            cache.is_resident(keep[(i + 1) % 4])
        gc.set_threshold(700)
        gc.collect()
        cache.invalidate(keep[0])
        assert all(cache.is_resident(k) for k in keep[1:]) and len(cache) == 3, len(cache)
        print("ok")
    ''')


def test_dead_entries_are_dropped_by_the_next_operation():
    rt = HostMemoryRuntime()
    cache = ResidentCache(rt, max_bytes=1 << 20)
    a, b = frozen(np.ones(100, np.float32)), frozen(np.zeros(100, np.float32))
    cache.get(a)
    dev_b = cache.get(b)
    ptr_a = next(p for p in rt.buffers if p != dev_b.ptr)
    del a
    gc.collect()
    # the collector only queued the key: the device copy goes with the next call, outside the collector
    assert cache.bytes == 400 and len(cache) == 1 and ptr_a not in rt.buffers
    c = frozen(np.ones(100, np.float32))
    cache.get(c)
    assert cache.is_resident(c) and cache.is_resident(b) and cache.bytes == 800


def test_a_recycled_id_never_hits():
    cache = ResidentCache(HostMemoryRuntime(), max_bytes=1 << 20)
    for i in range(20):
        x = frozen(np.full(64, i, np.float32))
        got = cache.get(x).ptr
        view = np.frombuffer(ctypes.string_at(got, x.nbytes), np.float32)
        np.testing.assert_array_equal(view, x)   # never an older array's copy under the same id()
        del x
    assert len(cache) <= 20


def test_fingerprint_is_taken_before_the_upload():
    """The entry's stamp must describe what was uploaded: taken after the copy, a change made in
    between would be stamped as current and never re-uploaded. (A read-only array changes only when its
    owner gives it write access back for a moment: the fingerprint is the backstop for that.)"""
    rt = HostMemoryRuntime()
    cache = ResidentCache(rt, max_bytes=1 << 20)
    w = frozen(np.zeros(1000, np.float32))
    real = rt.memcpy_htod

    def copy_then_change(dst, src, n, stream=0):
        real(dst, src, n, stream)
        w.flags.writeable = True   # the host array changes right after the copy, and is frozen again
        w[:] = 7.0
        w.flags.writeable = False
    rt.memcpy_htod = copy_then_change
    cache.get(w)
    rt.memcpy_htod = real
    assert not cache.is_resident(w)
    dev = cache.get(w)
    assert np.frombuffer(ctypes.string_at(dev.ptr, w.nbytes), np.float32)[0] == 7.0


def test_a_read_only_row_range_of_a_kept_array_is_served_from_its_copy():
    """The GPU's rows of a call split across processors are a view of the corpus: a view inside a kept
    array is read from the kept copy at its offset, with no upload, and only while the array is kept."""
    rt = HostMemoryRuntime()
    cache = ResidentCache(rt, max_bytes=1 << 20)
    T = frozen(np.arange(4000, dtype=np.float32).reshape(400, 10).copy())   # owns its bytes: kept
    full = cache.get(T)
    rows = T[150:390]
    assert cache.is_resident(rows)
    misses = cache.misses
    view = cache.get(rows)
    assert cache.misses == misses                                  # nothing uploaded
    assert view.ptr == full.ptr + 150 * 10 * 4 and view.shape == (240, 10)
    np.testing.assert_array_equal(view.get(), rows)
    strided = T[:, :5]                                             # not one span of bytes: uploaded
    assert not cache.is_resident(strided)
    other = frozen(np.arange(4000, dtype=np.float32).reshape(400, 10).copy())
    assert not cache.is_resident(other[10:20])                     # same values, not kept
    cache.invalidate(T)
    assert not cache.is_resident(rows)                             # the copy is gone: so is the view


def test_a_view_is_never_served_from_a_copy_in_another_layout():
    """A copy kept in a device layout of its own (quantized weights repacked for the kernels) does not
    hold the host's bytes at the host's offsets: a row range of its host array is uploaded, and asking
    about it leaves the packed copy kept."""
    rt = HostMemoryRuntime()
    cache = ResidentCache(rt, max_bytes=1 << 20)
    W = frozen(np.arange(4096, dtype=np.uint8).reshape(64, 64).copy())
    pack = lambda a: a[:, ::-1].copy()  # noqa: E731 - any other layout of the same bytes
    cache.get(W, pack=pack)
    assert not cache.is_resident(W[8:16])
    misses = cache.misses
    np.testing.assert_array_equal(cache.get(W[8:16]).get(), W[8:16])
    assert cache.misses == misses + 1                              # uploaded, not a view of the packed copy
    hits = cache.hits
    cache.get(W, pack=pack)
    assert cache.hits == hits + 1                                  # the packed copy is still kept


def test_a_row_range_of_kept_weights_is_served_from_their_repacked_copy():
    """Quantized weights are kept in the kernels' layout, which is row-wise: a row range of the block
    bytes (the GPU's rows of a split qmatmul) is read from the kept copy at that row's device offset,
    and is exactly the layout those rows would have on their own."""
    from hipsched import quantize
    from hipsched.gpu.glue.quant import _PACK, device_layout
    rt = HostMemoryRuntime()
    cache = ResidentCache(rt, max_bytes=1 << 24)
    for qtype, k in (("q8_0", 512), ("q8_0", 96), ("q4_0", 1024), ("q4_0", 160)):   # whole and padded rows
        w = quantize(np.random.default_rng(k).standard_normal((40, k)).astype(np.float32), qtype)
        pack = _PACK[qtype]
        cache.get(w.data, immutable=True, pack=pack)
        rows = w.data[13:29]
        assert cache.is_resident(rows)
        misses = cache.misses
        got = cache.get(rows, immutable=True, pack=pack).get()
        assert cache.misses == misses, (qtype, k)                 # no upload
        np.testing.assert_array_equal(got, device_layout(rows, qtype))
        assert cache.get(w.data[13:29:2], immutable=True, pack=pack) is not None   # not a row range: uploaded
        assert cache.misses == misses + 1
