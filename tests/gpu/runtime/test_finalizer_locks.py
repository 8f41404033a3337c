"""Finalizers and callbacks never take a lock their own thread may hold. The collector runs them on
whatever thread allocates, in the middle of whatever that thread was doing, so a callback that takes a
non-reentrant lock deadlocks the thread on itself when the allocation happened while it held that lock.
Each test runs the collector exactly there, in a child process that dumps its stack and exits if it
hangs (tests/gpu/runtime/test_resident_cache.py does the same for the resident cache)."""
import gc
import os

import numpy as np

from host_memory import run_bounded

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "support")


def test_dlpack_capsule_dying_while_an_export_is_registered():
    """Our unconsumed capsule's destructor and the consumer's deleter unregister the export; an export
    being registered at that moment (the collector runs on its allocation) must not block them."""
    run_bounded('''
        import gc
        import numpy as np
        from hipsched.gpu.memory import dlpack
        from hipsched.gpu.memory.device_array import DeviceArray

        class CollectingDict(dict):
            def __setitem__(self, key, value):
                gc.collect()      # what an allocation does under gc.set_threshold(1)
                super().__setitem__(key, value)

        host = np.ones(8, np.float32)
        d = DeviceArray(host.ctypes.data, host.shape, host.dtype, None, owner=host, device=(dlpack.kDLCPU, 0))
        dlpack._exported = CollectingDict()
        for i in range(3):
            junk = [d.__dlpack__()]       # an unconsumed capsule only the collector frees
            junk.append(junk)
            view = np.from_dlpack(d)      # consumed: the deleter runs when the view goes
            junk.append(view)
            del junk, view
            cap = d.__dlpack__()
            del cap
        gc.collect()
        assert not dlpack._exported, len(dlpack._exported)
        print("ok")
    ''')


class _Runtime:
    """Just what the free_async fallback touches: events that are never complete until told."""

    def __init__(self):
        self.freed, self.done, self.next = [], set(), 100

    def event_create(self):
        self.next += 1
        return self.next

    def event_record(self, event, stream=0):
        pass

    def event_query(self, event):
        return event in self.done

    def event_synchronize(self, event):
        self.done.add(event)

    def event_destroy(self, event):
        pass

    def free(self, ptr):
        self.freed.append(ptr)


def test_free_async_fallback_from_a_finalizer_inside_a_release():
    """The event-based free list (drivers without cuMemFreeAsync) is reached from finalizers: one that
    runs while its thread is releasing the list (free() ran the collector) must leave its entry for
    later instead of waiting for the releaser, which is itself."""
    from hipsched.gpu.bindings.runtime import Runtime

    class Fallback(_Runtime):
        free_async = Runtime.free_async
        release_deferred_frees = Runtime.release_deferred_frees

    rt = Fallback()
    nested = []

    def free(ptr):
        rt.freed.append(ptr)
        if ptr == 1:                         # a finalizer that runs inside the release loop
            rt.free_async(99, 0)
            nested.append(ptr)
    rt.free = free
    rt.free_async(1, 0)
    rt.free_async(2, 0)
    assert rt.freed == []                    # queued behind events that have not completed
    assert rt.release_deferred_frees(wait=True) == 1 and nested == [1]
    assert rt.freed == [1, 2]                # 99 waits for the next release, not for its own thread
    assert rt.release_deferred_frees(wait=True) == 0 and rt.freed == [1, 2, 99]


def test_cached_host_array_collected_mid_call_is_dropped_later():
    from host_memory import HostMemoryRuntime
    from hipsched.gpu.memory.resident_cache import ResidentCache

    cache = ResidentCache(HostMemoryRuntime(), max_bytes=1 << 20)
    a = np.ones(16, np.float32)
    a.flags.writeable = False                # only read-only arrays are kept
    cache.get(a)
    assert len(cache._pending) == 0
    del a
    gc.collect()
    assert len(cache._pending) == 1          # the callback only queued it
    assert len(cache) == 0 and cache.bytes == 0 and not cache._pending


def test_finalizer_inside_the_primary_context_retain():
    """ctypes CUDA binding: free() from a device array's finalizer makes the device's primary context
    current, retaining it under a lock the first time; a finalizer that runs inside that retain (the
    collector ran on an allocation there) must not wait for its own thread."""
    run_bounded(f'''
        import gc, sys
        sys.path.insert(0, {TESTS!r})
        import pytest
        from fake_cuda_driver import FakeCudaDriver, install

        class CollectingDriver(FakeCudaDriver):
            def cuDevicePrimaryCtxRetain(self, out, dev):
                gc.collect()      # what an allocation does under gc.set_threshold(1)
                return FakeCudaDriver.cuDevicePrimaryCtxRetain(self, out, dev)

        install(pytest.MonkeyPatch(), CollectingDriver(devices=2))
        from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
        rt = CtypesRuntime("cuda")
        second = rt.for_device(1)
        ptrs = []

        class Finalized:          # a device array of GPU 1 that only the collector frees
            def __del__(self):
                ptrs.append(second.malloc(16))
                second.free(ptrs[-1])

        junk = Finalized()
        junk.me = junk
        del junk
        assert second.mem_info()[1] > 0   # GPU 1's first call: retains its context
        assert len(ptrs) == 1
        print("ok")
    ''')
