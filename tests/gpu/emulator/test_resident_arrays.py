"""What the resident cache keeps and why (issue 19): implicitly only bytes nothing can write
(`immutable`), quantized weights by their contract, explicitly ResidentArray handles (Executor.resident)
whose updates reach every device copy; the budget (a share of free device memory unless configured);
what the scheduler and the telemetry are told. Device memory is host memory here (HostMemoryRuntime)
or the kernel emulator; tests/gpu/emulator/test_resident_stale.py holds the 10M-element stale-data proofs."""
import ctypes
import json
import mmap

import numpy as np
import pytest

import gpu_emulator
from emulated_executor import emulated_executor
from hipsched import Executor, HybridConfig, QuantizedTensor, quantize
from hipsched.backends.gpu import GpuBackend
from hipsched.gpu.memory import resident_cache
from hipsched.gpu.memory.resident_cache import ResidentCache, resident_budget
from hipsched.ops import OPS
from hipsched.resident_array import ResidentArray, handle_of, immutable
from host_memory import HostMemoryRuntime

needs_emulator = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")


def device_bytes(dev):
    return np.frombuffer(ctypes.string_at(dev.ptr, dev.nbytes), dev.dtype).reshape(dev.shape)


def frozen(a):
    a.flags.writeable = False
    return a


@pytest.fixture
def cache():
    return ResidentCache(HostMemoryRuntime(), max_bytes=1 << 20)


@pytest.fixture(scope="module")
def emu():
    runtime = gpu_emulator.EmuRuntime(32)
    yield runtime
    runtime.close()


# ------------------------------------------------------------------ implicit: what nothing can write

def test_immutable_follows_the_base_chain(tmp_path):
    owned = frozen(np.zeros(8, np.float32))
    assert immutable(owned) and immutable(frozen(owned[2:]))
    base = np.zeros(8, np.float32)
    assert not immutable(base) and not immutable(frozen(base[2:]))   # its base can still change
    assert immutable(np.frombuffer(b"\0" * 32, np.float32))
    assert not immutable(frozen(np.frombuffer(bytearray(32), np.float32)))
    assert not immutable(np.frombuffer(memoryview(bytearray(32)).toreadonly(), np.float32))
    path = tmp_path / "a.npy"
    np.save(path, np.arange(8, dtype=np.float32))
    assert immutable(np.load(path, mmap_mode="r"))
    assert not immutable(np.load(path, mmap_mode="r+"))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert immutable(np.frombuffer(m, np.uint8))
        del m


def test_a_view_of_a_registered_array_is_not_taken_for_immutable():
    """A registered array is read-only but changes through its handle's update(), which rewrites the
    handle's own device copies: a kept copy of a view of it would be served stale after an update."""
    T = np.zeros((64, 8), np.float32)
    h = ResidentArray.register(T)
    assert h.host is T
    try:
        view = T[:32]
        assert not T.flags.writeable and not view.flags.writeable
        assert not immutable(view)
        assert not ResidentCache(HostMemoryRuntime(), 1 << 20).would_keep(view)
    finally:
        h.release()
    assert immutable(frozen(np.zeros(8, np.float32))[2:])   # a frozen array nobody registered: still kept


def test_a_read_only_view_of_a_writable_array_is_never_kept(cache):
    base = np.arange(1000, dtype=np.float32)
    view = frozen(base[:500])
    cache.get(view)
    assert not cache.is_resident(view) and cache.bytes == 0
    base[123] = -1.0                       # the view changed under its read-only flag
    assert device_bytes(cache.get(view))[123] == -1.0


def test_read_only_arrays_are_kept_and_dropped_when_write_access_comes_back(cache):
    w = frozen(np.arange(1000, dtype=np.float32))
    d = cache.get(w)
    assert cache.get(w) is d and cache.is_resident(w) and cache.summary()["entries"]["implicit"] == 1
    w.flags.writeable = True
    w[500] = -1.0
    w.flags.writeable = False              # unchanged flag, changed bytes: the entry went when it was writable
    assert cache.is_resident(w)            # (a flip and back unseen in between is the documented limit)
    cache.invalidate(w)
    assert device_bytes(cache.get(w))[500] == -1.0


def test_trusted_bytes_are_kept_though_writable(cache):
    blocks = np.zeros(640, np.uint8)       # QuantizedTensor's source: immutable by its contract
    d = cache.get(blocks, immutable=True)
    assert cache.get(blocks) is d and cache.summary()["entries"]["trusted"] == 1


def test_quantized_weights_stay_resident_as_read_only_blocks():
    w = quantize(np.ones((4, 64), np.float32), "q8_0")
    assert not w.data.flags.writeable and w.data is w.data


def test_a_packed_copy_is_served_only_to_its_own_layout(cache):
    """get's `pack` (quantized weights kept in the GPU's layout): the kept copy is pack(host)'s bytes,
    counted as resident whatever the layout, but a get for another layout (or the raw bytes) never
    receives it: that get uploads its own (and the packed copy is dropped)."""
    blocks = np.arange(640, dtype=np.uint8)

    def pack(h):
        return h[::-1].copy()
    d = cache.get(blocks, immutable=True, pack=pack)
    np.testing.assert_array_equal(device_bytes(d), blocks[::-1])
    assert cache.is_resident(blocks) and cache.get(blocks, immutable=True, pack=pack) is d
    raw = cache.get(blocks, immutable=True)
    assert raw is not d
    np.testing.assert_array_equal(device_bytes(raw), blocks)
    assert cache.get(blocks, immutable=True, pack=lambda h: h.copy()) is not raw


@needs_emulator
def test_quantized_weights_are_kept_repacked_and_never_served_stale(emu, tmp_path):
    """qmatmul and dequantize keep w in the device layout (its bytes, gguf_blocks.device_bytes, are what
    the cache holds and what device_bytes_needed counts), reuse it, and never serve it for other bytes:
    another tensor of the same shape, a tensor made again over rewritten source bytes (the fingerprint
    sees a bulk rewrite), and the dead tensor's recycled id."""
    from hipsched.gguf_blocks import device_bytes as layout_bytes
    rng = np.random.default_rng(5)
    ex = emulated_executor(emu, tmp_path)
    gpu = ex._gpu
    try:
        x = rng.standard_normal(1056).astype(np.float32)
        src = np.array(quantize(rng.standard_normal((7, 1056)).astype(np.float32), "q4_0").data)   # writable
        w1 = QuantizedTensor(src, (7, 1056), "q4_0")
        w2 = quantize(rng.standard_normal((7, 1056)).astype(np.float32), "q4_0")
        call = OPS["qmatmul"].prepare(w1, x)
        assert gpu.device_bytes_needed(call) == call.nbytes + layout_bytes(7, 1056, "q4_0") - w1.nbytes > call.nbytes
        for w in (w1, w2, w1):
            np.testing.assert_allclose(ex.qmatmul(w, x, backend="gpu"), ex.qmatmul(w, x, backend="cpu"),
                                       rtol=1e-5, atol=1e-5)
        cache = gpu._ctx.resident
        assert cache.summary()["entries"]["trusted"] == 2 and cache.bytes == 2 * layout_bytes(7, 1056, "q4_0")
        before = cache.hits
        np.testing.assert_array_equal(ex.dequantize(w1, backend="gpu"), ex.dequantize(w1, backend="cpu"))
        assert cache.hits == before + 1   # the kept packed copy, not a new upload
        # the source rewritten behind the tensor's back (its contract forbids it; the stamp still sees it)
        src[:] = np.array(quantize(rng.standard_normal((7, 1056)).astype(np.float32), "q4_0").data)
        np.testing.assert_array_equal(ex.dequantize(w1, backend="gpu"), ex.dequantize(w1, backend="cpu"))
        np.testing.assert_allclose(ex.qmatmul(w1, x, backend="gpu"), ex.qmatmul(w1, x, backend="cpu"),
                                   rtol=1e-5, atol=1e-5)
        # tensors made and dropped one after another (ids recycled): each one's own bytes
        for _ in range(3):
            w = quantize(rng.standard_normal((7, 1056)).astype(np.float32), "q4_0")
            np.testing.assert_array_equal(ex.dequantize(w, backend="gpu"), ex.dequantize(w, backend="cpu"))
            del w
    finally:
        ex.close()


# ------------------------------------------------------------------ the budget

class _Memory(HostMemoryRuntime):
    def mem_info(self):
        return (10 << 30, 16 << 30)


def test_the_default_budget_is_a_share_of_free_device_memory(monkeypatch):
    monkeypatch.delenv("HIPSCHED_RESIDENT_BYTES", raising=False)
    c = ResidentCache(_Memory())
    assert c.max_bytes == int((10 << 30) * resident_cache.DEFAULT_RESIDENT_SHARE) and "free" in c.budget_source
    assert ResidentCache(HostMemoryRuntime()).max_bytes == resident_cache.FALLBACK_RESIDENT_BYTES   # cannot say
    monkeypatch.setenv("HIPSCHED_RESIDENT_BYTES", "4096")
    assert resident_budget(_Memory()) == (4096, "HIPSCHED_RESIDENT_BYTES")
    # the config's spellings of the default are the default here too (int("auto") failed the GPU's
    # start: every call then ran on the CPU), and a bad value costs only the budget, not the GPU
    for raw in ("auto", "None", "lots"):
        monkeypatch.setenv("HIPSCHED_RESIDENT_BYTES", raw)
        assert resident_budget(_Memory())[0] == int((10 << 30) * resident_cache.DEFAULT_RESIDENT_SHARE)
    assert resident_budget(_Memory(), 0) == (0, "configured")


def test_config_resident_bytes_defaults_to_auto():
    assert HybridConfig(config_file=False, env={}).resident_bytes is None
    assert HybridConfig(config_file=False, env={"HIPSCHED_RESIDENT_BYTES": "auto"}).resident_bytes is None
    assert HybridConfig(config_file=False, env={"HIPSCHED_RESIDENT_BYTES": "8589934592"}).resident_bytes == 8 << 30
    assert HybridConfig(config_file=False, env={}, resident_bytes="auto").resident_bytes is None
    with pytest.raises(Exception, match="resident_bytes"):
        HybridConfig(config_file=False, env={}, resident_bytes=-1)
    with pytest.raises(Exception, match="resident_bytes"):
        HybridConfig(config_file=False, env={}, resident_bytes="lots")


def test_pinned_arrays_stay_whatever_the_budget_and_evict_implicit_ones():
    cache = ResidentCache(HostMemoryRuntime(), max_bytes=6000)
    small = frozen(np.ones(1000, np.float32))
    cache.get(small)
    B = np.zeros(2000, np.float32)        # 8000 bytes: over the budget
    with ResidentArray.register(B) as big:
        cache.pin(big)
        assert not cache.is_resident(small) and cache.is_resident(B)
        assert cache.summary()["pinned_bytes"] == 8000 and cache.bytes == 8000
        cache.get(small)                   # no room left beside the pin: uploaded, not kept
        assert not cache.is_resident(small)
    assert cache.bytes == 0 and not cache.is_resident(B)


# ------------------------------------------------------------------ handles

def test_register_in_place_or_copy():
    T = np.arange(12, dtype=np.float32).reshape(4, 3)   # a view, but of a base nothing else holds
    h = ResidentArray.register(T)
    assert h.host is T and not T.flags.writeable and ResidentArray.register(T) is h and handle_of(T) is h
    assert np.asarray(h) is T and h.shape == (4, 3) and len(h) == 4
    h.release()
    assert T.flags.writeable and handle_of(T) is None
    with pytest.raises(ValueError, match="released"):
        np.asarray(h)
    base = np.zeros((4, 6), np.float32)
    v = ResidentArray.register(base[:, :3])          # a strided view of a writable buffer: a copy
    assert v.host.base is None and base.flags.writeable
    base[0, 0] = 5.0
    assert v.host[0, 0] == 0.0
    v.release()
    whole = ResidentArray.register(base.reshape(6, 4))   # contiguous, but `base` still writes it: a copy
    assert whole.host.base is None and base.flags.writeable
    whole.release()
    ro_view = ResidentArray.register(frozen(base.reshape(6, 4)))   # read-only, but `base` is not
    assert ro_view.host.base is None
    ro_view.release()
    live = ResidentArray.register(T)
    other = ResidentArray.register(live, copy=True)                  # a copy of a live handle's array
    assert other.host is not T and other is not live
    other.release()
    live.release()
    ro = frozen(np.ones(4, np.float32))
    r = ResidentArray.register(ro)
    assert r.host is ro
    r.release()
    assert not ro.flags.writeable                     # it was read-only before: it stays so
    c = ResidentArray.register(T, copy=True)
    assert c.host is not T and T.flags.writeable
    c.release()


def test_update_validates_and_writes_rows():
    T = np.zeros((5, 2), np.float32)
    with ResidentArray.register(T) as h:
        h.update([-1, 0], [[1, 1], [2, 2]])
        np.testing.assert_array_equal(T, [[2, 2], [0, 0], [0, 0], [0, 0], [1, 1]])
        assert h.version == 1
        with pytest.raises(IndexError):
            h.update([5], [[0, 0]])
        with pytest.raises(TypeError):
            h.update([[0]], [[0, 0]])
        assert not T.flags.writeable
    ro = ResidentArray.register(np.frombuffer(b"\0" * 16, np.float32))
    with pytest.raises(ValueError, match="read-only at its source"):
        ro.update(0, 1.0)
    ro.release()


def test_updates_reach_every_device_copy_in_runs_and_spans(monkeypatch):
    rt = HostMemoryRuntime()
    copies = []
    real = rt.memcpy_htod

    def counted(dst, src, n, stream=0):
        copies.append(n)
        real(dst, src, n, stream)
    one, two = ResidentCache(rt, max_bytes=1 << 20), ResidentCache(rt, max_bytes=1 << 20)
    T = np.zeros((1000, 4), np.float32)
    rng = np.random.default_rng(7)
    with ResidentArray.register(T) as h:
        d1, d2 = one.pin(h), two.get(T)   # the second cache pins it on first use
        assert one.is_resident(T) and two.is_resident(T) and len(h.mirrors) == 2
        rt.memcpy_htod = counted
        h.update([3, 4, 5, 9], np.ones((4, 4)))
        assert copies == [3 * 16, 16] * 2          # one copy per run of rows, per device copy
        copies.clear()
        monkeypatch.setattr(resident_cache, "MAX_ROW_COPIES", 4)
        rows = np.arange(10, 1000, 10)
        h.update(rows, rng.standard_normal((len(rows), 4)))
        assert copies == [(990 - 10 + 1) * 16] * 2   # many runs: the span, once
        for d in (d1, d2):
            np.testing.assert_array_equal(device_bytes(d), T)
        two.clear()                                 # a context closing forgets its copy
        assert len(h.mirrors) == 1
    assert one.bytes == 0 and T.flags.writeable


def test_a_pinned_copy_is_not_served_once_its_array_is_writable_again(cache):
    T = np.zeros(100, np.float32)
    h = ResidentArray.register(T)
    cache.pin(h)
    T.flags.writeable = True               # behind the handle's back
    T[50] = 3.0
    assert not cache.is_resident(T) and device_bytes(cache.get(T))[50] == 3.0
    T.flags.writeable = False
    h.release()


def test_a_handle_works_without_a_gpu(tmp_path):
    with Executor(persist_model=False, cache_dir=str(tmp_path), force_cpu_mode=True) as ex:
        T = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
        q = T[7].copy()
        with ex.resident(T) as idx:
            assert ex.top_k(q, idx, 1)[0][0] == 7
            idx.update(3, q * 2)
            i, s = ex.top_k(q, idx, 2)
            assert set(i) == {3, 7}
            np.testing.assert_array_equal(ex.scale(idx, 2.0), 2.0 * T)


# ------------------------------------------------------------------ the scheduler and the telemetry

@needs_emulator
def test_the_scheduler_charges_no_upload_for_a_registered_array(emu, tmp_path):
    rng = np.random.default_rng(8)
    T = rng.standard_normal((300, 16)).astype(np.float32)
    q = rng.standard_normal(16).astype(np.float32)
    with emulated_executor(emu, tmp_path) as ex:
        gpu = ex._gpu
        call = OPS["top_k"].prepare(q, T, 5)
        assert gpu.transfer_bytes(call)[0] == q.nbytes + T.nbytes
        with ex.resident(T) as idx:
            assert gpu.transfer_bytes(OPS["top_k"].prepare(q, idx, 5))[0] == q.nbytes
            assert gpu.transfer_bytes(OPS["top_k"].prepare(q, T, 5))[0] == q.nbytes
            assert gpu.resident_summary()["entries"]["pinned"] == 1
        assert gpu.transfer_bytes(call)[0] == q.nbytes + T.nbytes


@needs_emulator
def test_gpu_events_say_what_was_uploaded_and_what_was_reused(emu, tmp_path):
    from jsonschema import validate
    from hipsched.telemetry.events import schema_path
    rng = np.random.default_rng(9)
    a = rng.standard_normal(1000).astype(np.float32)
    b = frozen(rng.standard_normal(1000).astype(np.float32))
    W = quantize(rng.standard_normal((16, 64), dtype=np.float32), "q8_0")
    x = rng.standard_normal(64).astype(np.float32)
    log = tmp_path / "events.jsonl"
    gpu = GpuBackend({"kernel_cache_dir": str(tmp_path / "kernels")}, runtime=emu)
    with Executor(gpu_backend=gpu, persist_model=False, cache_dir=str(tmp_path), telemetry_path=str(log)) as ex:
        ex.add(a, b, backend="gpu")
        ex.add(a, b, backend="gpu")
        ex.qmatmul(W, x, backend="gpu")
        ex.qmatmul(W, x, backend="gpu")
        ex.add(a, b, backend="cpu")
        ev = ex.events
    # W goes up in the GPU's layout: its rows of 64 padded to a superblock of 512 (gguf_blocks.device_bytes)
    from hipsched.gguf_blocks import device_bytes as layout_bytes
    wb = layout_bytes(16, 64, "q8_0")
    assert wb == 8 * W.nbytes
    assert [e.get("resident") for e in ev] == [
        {"uploaded": 8000, "reused": 0}, {"uploaded": 4000, "reused": 4000},
        {"uploaded": wb + x.nbytes, "reused": 0}, {"uploaded": x.nbytes, "reused": wb}, None]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    schema = json.load(open(schema_path()))
    for line, d in zip(lines, ev):
        validate(line, schema)
        assert line == d                   # the JSON line and the event dict agree
    with pytest.raises(Exception):
        validate({**lines[0], "resident": {"uploaded": -1, "reused": 0}}, schema)


@needs_emulator
def test_info_reports_the_resident_budget(emu, monkeypatch, capsys):
    from hipsched.cli import info
    from hipsched.gpu.bindings import detect
    monkeypatch.delenv("HIPSCHED_RESIDENT_BYTES", raising=False)
    monkeypatch.setattr(detect, "get_runtime", lambda: emu)
    monkeypatch.setattr(info, "_kernels", lambda rt: {"driver_version": 0, "loader": "", "unavailable": "n/a"})
    got = info.gather()["resident"]
    assert got["budget_bytes"] == emu.mem_info()[0] // 2 and "free" in got["budget_source"]
    info.run(type("Args", (), {"json": False})())
    assert "Resident inputs: up to 1.0 GiB of device memory (50% of the device memory free at start)" in \
        capsys.readouterr().out


def test_an_implicit_copy_made_before_registration_is_not_served_after_updates():
    """A read-only array kept implicitly by one context, then registered through another: its updates
    only reach pinned copies, so the implicit one must go (a single-element update is invisible to the
    fingerprint)."""
    rt = HostMemoryRuntime()
    one, two = ResidentCache(rt, max_bytes=1 << 24), ResidentCache(rt, max_bytes=1 << 24)
    T = frozen(np.zeros(100_000, np.float32))
    one.get(T)
    assert one.summary()["entries"]["implicit"] == 1
    with ResidentArray.register(T) as h:
        two.pin(h)
        h.update(12345, 1.0)
        assert device_bytes(one.get(T))[12345] == 1.0      # pinned there now, from the current bytes
        assert one.summary()["entries"] == {"implicit": 0, "trusted": 0, "pinned": 1}
        h.update(54321, 2.0)
        assert device_bytes(one.get(T))[54321] == 2.0
    assert not T.flags.writeable                            # read-only before: it stays so


def test_an_update_racing_a_pin_is_never_lost():
    """The pin copies the host array with updates held off, so an update made while it uploads
    reaches the new copy (before, or through write_bytes after)."""
    import threading
    import time
    rt = HostMemoryRuntime()
    cache = ResidentCache(rt, max_bytes=1 << 24)
    T = np.zeros(1 << 16, np.float32)
    started, done = threading.Event(), []
    real = rt.memcpy_htod

    def slow_copy(dst, src, n, stream=0):
        real(dst, src, n, stream)
        if not started.is_set():   # the pin's upload is done: give the update time to slip in before
            started.set()          # the copy is attached (it must wait for the attachment instead)
            time.sleep(0.2)
    rt.memcpy_htod = slow_copy
    with ResidentArray.register(T) as h:
        updater = threading.Thread(target=lambda: (started.wait(), h.update(777, 5.0), done.append(1)))
        updater.start()
        dev = cache.pin(h)
        updater.join()
        assert done and T[777] == 5.0 and device_bytes(dev)[777] == 5.0


def test_trim_drops_kept_copies_but_not_pinned_ones(cache):
    a, w = frozen(np.ones(100, np.float32)), np.zeros(64, np.uint8)
    cache.get(a)
    cache.get(w, immutable=True)
    with ResidentArray.register(np.zeros(50, np.float32)) as h:
        cache.pin(h)
        assert cache.trim() == 400 + 64
        assert cache.summary()["entries"] == {"implicit": 0, "trusted": 0, "pinned": 1} and cache.bytes == 200


@needs_emulator
def test_a_gpu_out_of_memory_trims_the_kept_copies_first(emu, tmp_path, monkeypatch):
    from hipsched.errors import GpuError
    rng = np.random.default_rng(10)
    T = frozen(rng.standard_normal((64, 16)).astype(np.float32))
    q = rng.standard_normal(16).astype(np.float32)
    with emulated_executor(emu, tmp_path) as ex:
        ex.cosine_similarity(q, T, backend="gpu")
        ctx = ex._gpu._ctx
        assert ctx.resident.is_resident(T)
        real = ctx.empty

        def out_of_memory(*args, **kwargs):
            raise GpuError("oom", "emulated: out of memory", name="hipErrorOutOfMemory")
        monkeypatch.setattr(ctx, "empty", out_of_memory)
        out = ex.cosine_similarity(q, T, backend="gpu")          # falls back (or runs in pieces)
        monkeypatch.setattr(ctx, "empty", real)
        assert not ctx.resident.is_resident(T)
        np.testing.assert_allclose(out, ex.cosine_similarity(q, T, backend="cpu"), rtol=1e-5, atol=1e-6)


def test_an_update_along_a_later_axis_copies_only_its_bytes(monkeypatch):
    """A KV cache (batch, heads, max_seq, head_dim) takes a step's position along axis 2: each device copy
    gets batch * heads runs of head_dim (one per (batch, head), consecutive positions joined), never the
    whole cache, and ends holding the host's bytes; negative axes count from the end; a bad axis or index
    is refused before anything is written."""
    rt = HostMemoryRuntime()
    copies = []
    real = rt.memcpy_htod

    def counted(dst, src, n, stream=0):
        copies.append((dst, n))
        real(dst, src, n, stream)
    cache = ResidentCache(rt, max_bytes=1 << 20)
    K = np.zeros((2, 3, 16, 8), np.float32)
    rng = np.random.default_rng(3)
    with ResidentArray.register(K) as h:
        d = cache.pin(h)
        rt.memcpy_htod = counted
        new = rng.standard_normal((2, 3, 8)).astype(np.float32)
        h.update(5, new, axis=2)
        np.testing.assert_array_equal(K[:, :, 5], new)
        row = 16 * 8 * 4   # one (batch, head)'s slab of the cache, in bytes
        assert [(dst - d.ptr, n) for dst, n in copies] == [(i * row + 5 * 32, 32) for i in range(6)]
        copies.clear()
        h.update([6, 7, 9], rng.standard_normal((2, 3, 3, 8)), axis=-2)
        assert [(dst - d.ptr, n) for dst, n in copies] == [
            (i * row + off, n) for i in range(6) for off, n in ((6 * 32, 64), (9 * 32, 32))]
        copies.clear()
        h.update([-1], rng.standard_normal((2, 3, 16, 1)), axis=3)   # the last column: 96 runs of 4 bytes
        assert len(copies) == 2 * 3 * 16 and {n for _, n in copies} == {4}
        np.testing.assert_array_equal(device_bytes(d), K)
        before = K.copy()
        for axis, index, err in ((4, 0, ValueError), (-5, 0, ValueError), (1.0, 0, TypeError), (2, 16, IndexError),
                                 (2, [[1]], TypeError)):
            with pytest.raises(err):
                h.update(index, 0.0, axis=axis)
        np.testing.assert_array_equal(K, before)


@needs_emulator
def test_a_resident_kv_cache_grows_on_the_gpu_without_uploads(tmp_path):
    """A decode loop's KV cache kept on the GPU through the public API: registered with ex.resident, each
    step's k and v written with update(pos, ..., axis=2), attention over the handles on the emulated GPU
    gives the CPU's result on the same bytes (grouped heads, lower_right, kv_len) and uploads only the
    query: the caches are read from their device copies."""
    rt = gpu_emulator.EmuRuntime(32)
    rng = np.random.default_rng(5)
    b, hq, hkv, seq, d = 1, 4, 2, 24, 16
    with emulated_executor(rt, tmp_path, allow_fallback=False) as ex:
        K, V = (ex.resident(np.zeros((b, hkv, seq, d), np.float32)) for _ in range(2))
        for pos in range(6):
            K.update(pos, rng.standard_normal((b, hkv, d)), axis=2)
            V.update(pos, rng.standard_normal((b, hkv, d)), axis=2)
            q = rng.standard_normal((b, hq, 1, d)).astype(np.float32)
            kv_len = np.array([pos + 1])
            got = ex.attention(q, K, V, causal="lower_right", kv_len=kv_len, backend="gpu")
            ev = ex.events[-1]
            assert (ev["backend"], ev["fallback"]) == ("gpu", None), ev
            assert ev["resident"]["uploaded"] <= q.nbytes + kv_len.nbytes, ev["resident"]
            assert ev["resident"]["reused"] >= K.nbytes + V.nbytes, ev["resident"]
            want = ex.attention(q, K.host, V.host, causal="lower_right", kv_len=kv_len, backend="cpu")
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
        K.release(), V.release()
    rt.close()
