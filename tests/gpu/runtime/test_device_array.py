"""DeviceArray interop structures (CUDA Array Interface v3, DLPack capsules both ways), the
host<->device helpers and the resident cache. Without a GPU, the DLPack machinery is checked on
CPU-device tensors that NumPy and PyTorch really produce and consume, and the copy/cache logic runs on
HostMemoryRuntime, a test double whose "device memory" is host memory. Real-device round trips are
marked gpu."""
import gc
import weakref

import numpy as np
import pytest
from requires import need

from hipsched.errors import GpuError
from hipsched.gpu.memory import dlpack
from hipsched.gpu.memory.device_array import DeviceArray, is_device_array, to_device, to_host
from hipsched.gpu.memory.resident_cache import ResidentCache, fingerprint

from half_formats import HALF, TYPE_IDS, TYPES
from host_memory import HostMemoryRuntime


@pytest.fixture
def rt():
    return HostMemoryRuntime()


def test_cuda_array_interface_v3():
    d = DeviceArray(0x7F0000001000, (3, 4), np.float32, None, stream=None)
    cai = d.__cuda_array_interface__
    assert cai == {"shape": (3, 4), "typestr": "<f4", "data": (0x7F0000001000, False), "version": 3,
                   "strides": None, "stream": None}
    assert (d.nbytes, d.size, d.ndim, len(d)) == (48, 12, 2, 3)
    assert DeviceArray(0x1000, (5,), np.float32, None, stream=0).__cuda_array_interface__["stream"] == 1
    assert DeviceArray(0x1000, (5,), np.float32, None, stream=1234).__cuda_array_interface__["stream"] == 1234
    strided = DeviceArray(0x1000, (3, 4), np.float32, None, strides=(32, 4))
    assert strided.__cuda_array_interface__["strides"] == (32, 4)


def test_cuda_array_interface_half_rules(rt):
    f16 = to_device(np.ones(4, np.float16), runtime=rt)
    assert f16.__cuda_array_interface__["typestr"] == "<f2"
    bf = to_device(np.ones(4, HALF["bfloat16"]), runtime=rt)
    assert not hasattr(bf, "__cuda_array_interface__")   # bfloat16 has no typestr: consumers take DLPack

    class _Opaque:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<V2", "data": (bf.ptr, False), "version": 3,
                                    "strides": None, "stream": None}
    with pytest.raises(GpuError, match="DLPack"):   # 2 opaque bytes are not guessed to be bfloat16
        DeviceArray.from_external(_Opaque(), runtime=rt)


def test_dlpack_device_follows_platform():
    class Amd:
        platform = "amd"

        def current_device(self):
            return 1
    assert DeviceArray(0x1000, (2,), np.float32, Amd()).__dlpack_device__() == (dlpack.kDLROCM, 1)
    assert DeviceArray(0x1000, (2,), np.float32, None).__dlpack_device__() == (dlpack.kDLCUDA, 0)


def test_dlpack_export_is_consumed_by_numpy_zero_copy():
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    d = DeviceArray(host.ctypes.data, host.shape, host.dtype, None, owner=host, device=(dlpack.kDLCPU, 0))
    view = np.from_dlpack(d)
    assert view.shape == host.shape and view.dtype == np.float32
    assert np.shares_memory(view, host)
    ref = weakref.ref(d)
    del d
    gc.collect()
    assert ref() is not None              # the consumer keeps the exporter alive
    np.testing.assert_array_equal(view, host)
    del view
    gc.collect()
    assert ref() is None                   # ... and releases it through the DLPack deleter


def test_unconsumed_capsule_releases_its_owner():
    host = np.ones(8, np.float32)
    d = DeviceArray(host.ctypes.data, host.shape, host.dtype, None, owner=host, device=(dlpack.kDLCPU, 0))
    ref = weakref.ref(d)
    cap = d.__dlpack__()
    del d
    gc.collect()
    assert ref() is not None
    del cap
    gc.collect()
    assert ref() is None


def test_dlpack_export_strided_and_dtypes():
    host = np.arange(12, dtype=np.float64).reshape(3, 4)
    d = DeviceArray(host.ctypes.data, (3, 2), host.dtype, None, owner=host, strides=(32, 16),
                    device=(dlpack.kDLCPU, 0))
    np.testing.assert_array_equal(np.from_dlpack(d), host[:, ::2])
    i8 = np.arange(5, dtype=np.int8)
    np.testing.assert_array_equal(np.from_dlpack(DeviceArray(i8.ctypes.data, (5,), np.int8, None, owner=i8,
                                                             device=(1, 0))), i8)
    with pytest.raises(BufferError):
        d.__dlpack__(dl_device=(dlpack.kDLCUDA, 0))


# DLPack's type codes: kDLFloat for float32 and float16, kDLBfloat for bfloat16 (ml_dtypes' type)
DL_CODES = {"float32": (2, 32, 1), "float16": (2, 16, 1), "bfloat16": (dlpack.kDLBfloat, 16, 1)}


@pytest.mark.parametrize("dtype", list(TYPES), ids=TYPE_IDS)
def test_dlpack_type_codes(dtype):
    t = dlpack.dl_dtype(TYPES[dtype])
    assert (t.code, t.bits, t.lanes) == DL_CODES[dtype]
    assert dlpack.np_dtype(dlpack.DLDataType(*DL_CODES[dtype])) == TYPES[dtype]


@pytest.mark.half
def test_dlpack_bfloat16_without_ml_dtypes_is_a_clear_error(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)   # import fails as if not installed
    with pytest.raises(GpuError, match="ml_dtypes"):
        dlpack.np_dtype(dlpack.DLDataType(dlpack.kDLBfloat, 16, 1))


def test_consume_numpy_and_torch_capsules():
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = dlpack.ConsumedTensor(host.__dlpack__())
    assert (t.device, t.shape, t.dtype, t.ptr) == ((dlpack.kDLCPU, 0), (2, 3), np.dtype(np.float32),
                                                   host.ctypes.data)
    t.release()
    torch = need("torch")
    x = torch.arange(10, dtype=torch.int64)[2:]
    t = dlpack.ConsumedTensor(torch.utils.dlpack.to_dlpack(x))
    assert t.ptr == x.data_ptr() and t.shape == (8,) and t.dtype == np.int64
    t.release()
    with pytest.raises(GpuError):
        dlpack.ConsumedTensor(object())


def test_a_capsule_cannot_be_consumed_twice():
    cap = np.zeros(3, np.float32).__dlpack__()
    t = dlpack.ConsumedTensor(cap)
    with pytest.raises(GpuError):
        dlpack.ConsumedTensor(cap)
    t.release()


class FakeCai:
    def __init__(self, ptr, shape, typestr="<f4", strides=None, version=3, stream=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "version": version, "strides": strides, "stream": stream}


def test_from_external_cuda_array_interface(rt):
    src = FakeCai(0xABC000, (4, 5), stream=77)
    d = DeviceArray.from_external(src, runtime=rt)
    assert (d.ptr, d.shape, d.dtype, d.stream, d.owner) == (0xABC000, (4, 5), np.float32, 77, src)
    # Explicit C strides and length-1 axes with odd strides are contiguous too.
    assert DeviceArray.from_external(FakeCai(0x10, (4, 5), strides=(20, 4)), runtime=rt).shape == (4, 5)
    assert DeviceArray.from_external(FakeCai(0x10, (1, 5), strides=(999, 4)), runtime=rt).shape == (1, 5)
    with pytest.raises(GpuError, match="non-contiguous"):
        DeviceArray.from_external(FakeCai(0x10, (4, 5), strides=(4, 16)), runtime=rt)
    with pytest.raises(GpuError, match="version"):
        DeviceArray.from_external(FakeCai(0x10, (4,), version=1), runtime=rt)


def test_from_external_rejects_host_objects(rt):
    with pytest.raises(GpuError, match="not a GPU"):
        DeviceArray.from_external(np.zeros(3, np.float32), runtime=rt)
    with pytest.raises(GpuError):
        DeviceArray.from_external([1.0, 2.0], runtime=rt)
    assert not is_device_array(np.zeros(2)) and is_device_array(FakeCai(0x10, (2,)))


class OnDlDevice:
    """A DLPack producer whose data is `host` but which reports `device` (how managed or pinned memory
    looks from the outside)."""

    def __init__(self, host, device):
        self.host, self.device = host, device

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return dlpack.make_capsule(self.host.ctypes.data, self.host.shape, None, self.host.dtype, self.device,
                                   owner=self)


def test_one_device_array_test_and_one_set_of_device_types():
    import hipsched.device_arrays as leaf
    from hipsched.gpu.memory import device_array
    from hipsched.ops import validation
    assert validation.is_device_array is device_array.is_device_array is leaf.is_device_array
    assert dlpack.GPU_DEVICE_TYPES is leaf.GPU_DEVICE_TYPES
    assert (dlpack.kDLCPU, dlpack.kDLCUDA, dlpack.kDLCUDAHost, dlpack.kDLROCM, dlpack.kDLROCMHost,
            dlpack.kDLCUDAManaged) == (1, 2, 3, 10, 11, 13)    # dlpack.h's numbers


@pytest.mark.parametrize("device_type, on_gpu", [(2, True), (10, True), (13, True),      # CUDA, ROCm, managed
                                                 (1, False), (3, False), (11, False)])   # CPU, pinned host
def test_which_dlpack_devices_are_device_arrays(device_type, on_gpu):
    """Managed memory is a device array (read only after the producer's stream is done: through the
    DLPack handshake); pinned host memory is host memory."""
    assert is_device_array(OnDlDevice(np.zeros(2, np.float32), (device_type, 0))) is on_gpu


def test_device_array_test_survives_odd_producers():
    class Broken:
        def __dlpack_device__(self):
            raise RuntimeError("no device")

    class RaisingCai:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("not on a GPU")

    class Empty:
        def __dlpack_device__(self):
            return ()
    assert not any(is_device_array(x) for x in (Broken(), RaisingCai(), Empty(), [1.0], 3.0, None))


def test_managed_memory_is_taken_in_place_and_copied_back(rt):
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    managed = OnDlDevice(host, (dlpack.kDLCUDAManaged, 0))
    d = DeviceArray.from_external(managed, runtime=rt)
    assert (d.ptr, d.shape, d.device) == (host.ctypes.data, (2, 3), (dlpack.kDLCUDAManaged, 0))
    np.testing.assert_array_equal(d.get(), host)      # through the runtime's copy, which synchronises
    pinned = OnDlDevice(host, (dlpack.kDLCUDAHost, 0))
    with pytest.raises(GpuError, match="not a GPU"):
        DeviceArray.from_external(pinned, runtime=rt)


class _DlpackOnly:
    """A foreign producer offering only DLPack (as a PyTorch bfloat16 tensor does: torch gives bf16 no
    __cuda_array_interface__)."""

    def __init__(self, dev):
        self._dev = dev

    def __dlpack__(self, stream=None):
        return self._dev.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._dev.__dlpack_device__()


@pytest.mark.parametrize("dtype", list(HALF))
def test_dlpack_round_trip_keeps_half_dtype(rt, dtype):
    x = np.arange(12, dtype=np.float32).reshape(3, 4).astype(HALF[dtype])
    dev = to_device(x, runtime=rt)
    back = DeviceArray.from_external(_DlpackOnly(dev), runtime=rt)
    assert back.dtype == HALF[dtype] and back.shape == (3, 4)
    np.testing.assert_array_equal(back.get().view(np.uint16), x.view(np.uint16))


def test_to_device_get_and_owned_memory_is_freed(rt):
    host = np.random.default_rng(0).standard_normal((7, 9)).astype(np.float32)
    d = to_device(host, runtime=rt)
    assert d.shape == host.shape and d.ptr in rt.buffers
    np.testing.assert_array_equal(d.get(), host)
    np.testing.assert_array_equal(to_host(d), host)
    d.set(host * 2)
    np.testing.assert_array_equal(d.get(), host * 2)
    view = d.reshape(-1)
    ptr = d.ptr
    del d
    gc.collect()
    assert ptr not in rt.freed              # the reshaped view keeps the allocation alive
    np.testing.assert_array_equal(view.get(), (host * 2).ravel())
    del view
    gc.collect()
    assert ptr in rt.freed
    # A wrapped foreign pointer is never freed by us.
    DeviceArray(0x1234, (2,), np.float32, rt)
    gc.collect()
    assert 0x1234 not in rt.freed


def test_to_device_makes_contiguous_and_converts(rt):
    host = np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2]
    d = to_device(host, runtime=rt, dtype=np.float32)
    np.testing.assert_array_equal(d.get(), host.astype(np.float32))


def test_fingerprint_sees_reallocation_shape_and_sampled_changes():
    a = np.zeros(10000, np.float32)
    f = fingerprint(a)
    assert fingerprint(a) == f
    a[0] = 1.0
    assert fingerprint(a) != f
    b = np.zeros(10000, np.float32)
    assert fingerprint(b) != fingerprint(a.reshape(100, 100)) != fingerprint(a)


def test_resident_cache_keeps_read_only_arrays_and_never_writable_ones(rt):
    cache = ResidentCache(rt, max_bytes=1 << 20)
    w = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    d1 = cache.get(w)
    assert cache.get(w) is not d1 and (cache.hits, cache.misses) == (0, 2) and not cache.is_resident(w)
    assert cache.bytes == 0            # a writable array could change unseen: uploaded per call, never kept
    w.flags.writeable = False
    d1 = cache.get(w)
    assert cache.get(w) is d1 and (cache.hits, cache.misses) == (1, 3) and cache.is_resident(w)
    assert cache.bytes == w.nbytes
    w.flags.writeable = True           # write access back: the copy is no longer trusted, even unchanged
    assert not cache.is_resident(w) and cache.bytes == 0
    w[1] += 1.0
    np.testing.assert_array_equal(cache.get(w).get(), w)
    w.flags.writeable = False
    cache.get(w)
    cache.invalidate(w)
    assert cache.bytes == 0 and not cache.is_resident(w)


def test_resident_cache_lru_by_bytes_and_gc(rt):
    cache = ResidentCache(rt, max_bytes=3 * 4000)
    arrays = [np.full(1000, i, np.float32) for i in range(4)]
    for a in arrays:
        a.flags.writeable = False
    for a in arrays[:3]:
        cache.get(a)
    cache.get(arrays[0])                 # 0 becomes most recent; 1 is now least recent
    cache.get(arrays[3])
    assert cache.is_resident(arrays[0]) and not cache.is_resident(arrays[1]) and cache.is_resident(arrays[3])
    assert cache.bytes <= cache.max_bytes and len(cache) == 3
    big = np.zeros(10_000, np.float32)   # larger than the cache: uploaded, not kept
    big.flags.writeable = False
    assert cache.get(big).get().shape == big.shape and not cache.is_resident(big)
    del arrays[3]
    gc.collect()
    assert len(cache) == 2 and cache.bytes == 2 * 4000
    cache.clear()
    assert cache.bytes == 0 and len(cache) == 0


def test_resident_cache_size_from_environment(rt, monkeypatch):
    monkeypatch.setenv("HIPSCHED_RESIDENT_BYTES", "12345")
    assert ResidentCache(rt).max_bytes == 12345


def test_no_runtime_is_a_clear_error(monkeypatch):
    from hipsched.gpu.bindings import detect
    monkeypatch.setenv("HIPSCHED_GPU_RUNTIME", "none")
    detect.reset()
    try:
        with pytest.raises(GpuError) as info:
            to_device(np.zeros(3, np.float32))
        assert info.value.kind == "unavailable" and "disabled" in str(info.value)
    finally:
        detect.reset()


# ---------------------------------------------------------------------- on a real GPU
@pytest.mark.gpu
def test_gpu_round_trip_and_resident_cache():
    from hipsched.gpu.bindings import detect
    rt = detect.get_runtime()
    host = np.random.default_rng(2).standard_normal((256, 33)).astype(np.float32)
    d = to_device(host, runtime=rt)
    np.testing.assert_array_equal(d.get(), host)
    cache = ResidentCache(rt, max_bytes=1 << 24)
    host.flags.writeable = False
    assert cache.get(host) is cache.get(host)


@pytest.mark.gpu
def test_gpu_interop_with_torch_or_cupy():
    from hipsched.gpu.bindings import detect
    rt = detect.get_runtime()
    torch = need("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no GPU")
    x = torch.arange(64, dtype=torch.float32, device="cuda")
    d = DeviceArray.from_external(x, runtime=rt)
    assert d.ptr == x.data_ptr()
    np.testing.assert_array_equal(d.get(), x.cpu().numpy())
    y = torch.from_dlpack(to_device(np.ones(5, np.float32), runtime=rt))
    assert y.device.type == "cuda" and float(y.sum()) == 5.0
