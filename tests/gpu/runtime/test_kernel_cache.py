"""The on-disk code-object cache: key stability, atomic writes, corrupt entries are misses that get
replaced, concurrent writers; and the in-process module cache. A counting compiler stands in for
hiprtc where the test is about the cache rather than compilation; one test uses the real hiprtc."""
import os
import subprocess
import sys
import threading

import pytest

from hipsched.errors import GpuError
from hipsched.gpu.compilation import kernels
from hipsched.gpu.compilation.kernels import KernelCache, cache_key, read_entry, write_entry
from hipsched.gpu.bindings.runtime import DeviceInfo
from requires import missing_tool

SRC = {"a.hip": 'extern "C" __global__ void ka(float* x) { x[0] = 1.0f; }',
       "b.hip": 'extern "C" __global__ void kb(float* x) { x[0] = 2.0f; }'}


class CountingCompiler:
    """Deterministic stand-in: the 'code object' is derived from its inputs, and calls are counted."""
    name, platform = "counting", "amd"

    def __init__(self, version="1.0"):
        self._version = version
        self.calls = 0

    def version(self):
        return self._version

    def supports(self, arch):
        return True

    def compile(self, source, name, arch, options=()):
        self.calls += 1
        return f"{name}|{arch}|{options}|{source}".encode() * 50


BASE = ("hiprtc", "hiprtc 9.0 libamdhip64.so.5.2.21153", "gfx90a:sramecc+:xnack-", ("-O3",), "src")


def test_key_is_stable_and_sensitive_to_every_input():
    assert cache_key(*BASE) == cache_key(*BASE)
    assert len(cache_key(*BASE)) == 64
    variants = [("nvrtc",) + BASE[1:], BASE[:1] + ("hiprtc 9.0 libamdhip64.so.5.3",) + BASE[2:],
                BASE[:2] + ("gfx90a",) + BASE[3:], BASE[:2] + ("gfx90a:sramecc-:xnack-",) + BASE[3:],
                BASE[:3] + ((),) + BASE[4:], BASE[:3] + (("-O2",),) + BASE[4:], BASE[:4] + ("src ",)]
    keys = {cache_key(*v) for v in variants}
    assert len(keys) == len(variants) and cache_key(*BASE) not in keys
    # Field boundaries are unambiguous: moving text between fields changes the key.
    assert cache_key("ab", "c", "x", (), "s") != cache_key("a", "bc", "x", (), "s")
    assert cache_key("a", "b", "x", ("-Da", "b"), "s") != cache_key("a", "b", "x", ("-Da b",), "s")


def test_key_covers_format_version(monkeypatch):
    before = cache_key(*BASE)
    monkeypatch.setattr(kernels, "FORMAT_VERSION", kernels.FORMAT_VERSION + 1)
    assert cache_key(*BASE) != before


def test_key_covers_the_prelude(tmp_path, monkeypatch):
    (tmp_path / "x.hip").write_text("// kernel\n")
    (tmp_path / "prelude.h").write_text("#define A 1\n")
    monkeypatch.setattr(kernels, "_source_dir", lambda: tmp_path)
    first = kernels.kernel_sources()["x.hip"]
    (tmp_path / "prelude.h").write_text("#define A 2\n")
    second = kernels.kernel_sources()["x.hip"]
    assert first != second and cache_key("c", "v", "gfx90a", (), first) != cache_key("c", "v", "gfx90a", (), second)


def test_hit_after_miss_and_per_arch_entries(tmp_path):
    comp = CountingCompiler()
    cache = KernelCache(comp, tmp_path, sources=SRC)
    a1 = cache.code_object("a.hip", "gfx90a")
    a2 = cache.code_object("a.hip", "gfx90a")
    assert a1 == a2 and comp.calls == 1 and (cache.hits, cache.misses) == (1, 1)
    cache.code_object("a.hip", "gfx906")
    cache.code_object("a.hip", "gfx90a", ("-DFOO",))
    assert comp.calls == 3
    # A new process (new KernelCache) hits the disk; another compiler version does not.
    comp2 = CountingCompiler()
    assert KernelCache(comp2, tmp_path, sources=SRC).code_object("a.hip", "gfx90a") == a1 and comp2.calls == 0
    comp3 = CountingCompiler("2.0")
    KernelCache(comp3, tmp_path, sources=SRC).code_object("a.hip", "gfx90a")
    assert comp3.calls == 1


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HIPSCHED_CACHE_DIR", str(tmp_path / "env-cache"))
    assert KernelCache(CountingCompiler()).cache_dir == tmp_path / "env-cache"
    monkeypatch.delenv("HIPSCHED_CACHE_DIR")
    assert str(kernels.default_cache_dir()).endswith(os.path.join("hipsched", "kernels"))


@pytest.mark.parametrize("damage", ["truncate_header", "truncate_payload", "flip_payload", "other_key", "empty",
                                    "garbage"])
def test_corrupt_entry_is_a_miss_and_is_replaced(tmp_path, damage):
    comp = CountingCompiler()
    cache = KernelCache(comp, tmp_path, sources=SRC)
    good = cache.code_object("a.hip", "gfx90a")
    key = cache_key(comp.name, comp.version(), "gfx90a", (), SRC["a.hip"])
    path = cache.entry_path(key)
    blob = path.read_bytes()
    if damage == "truncate_header":
        blob = blob[:20]
    elif damage == "truncate_payload":
        blob = blob[:-7]
    elif damage == "flip_payload":
        blob = blob[:-1] + bytes([blob[-1] ^ 0xFF])
    elif damage == "other_key":
        other = cache_key(comp.name, comp.version(), "gfx906", (), SRC["a.hip"])
        write_entry(path, other, good)
        blob = path.read_bytes()
    elif damage == "empty":
        blob = b""
    else:
        blob = os.urandom(len(blob))
    path.write_bytes(blob)
    assert read_entry(path, key) is None
    again = KernelCache(comp, tmp_path, sources=SRC).code_object("a.hip", "gfx90a")
    assert again == good and comp.calls == 2
    assert read_entry(path, key) == good      # rewritten whole


def test_unwritable_cache_dir_still_compiles(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    comp = CountingCompiler()
    cache = KernelCache(comp, blocker / "cache", sources=SRC)
    assert cache.code_object("a.hip", "gfx90a") and cache.code_object("a.hip", "gfx90a")
    assert comp.calls == 1      # nothing on disk, but the process keeps what it compiled


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    key = cache_key(*BASE)
    path = tmp_path / "e.co"

    def failing_replace(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(kernels.os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_entry(path, key, b"x" * 1000)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []     # the temp file is removed too
    monkeypatch.undo()
    write_entry(path, key, b"payload")
    assert read_entry(path, key) == b"payload"
    assert [p.name for p in tmp_path.iterdir()] == ["e.co"]


def test_concurrent_writers_threads(tmp_path):
    key = cache_key(*BASE)
    path = tmp_path / "shared.co"
    payload = os.urandom(1 << 16)
    errors, seen = [], []

    def worker():
        try:
            for _ in range(20):
                write_entry(path, key, payload)
                got = read_entry(path, key)
                seen.append(got)
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(s == payload for s in seen)   # a reader never saw a partial entry
    assert [p.name for p in tmp_path.iterdir()] == ["shared.co"]


def test_concurrent_writers_processes(tmp_path):
    code = ("import sys, os\nfrom hipsched.gpu.compilation.kernels import write_entry, read_entry, cache_key\n"
            f"key = cache_key{BASE!r}\n"
            "p = sys.argv[1]\nfrom pathlib import Path\npayload = bytes(range(256)) * 512\n"
            "for _ in range(30):\n    write_entry(Path(p), key, payload)\n"
            "    got = read_entry(Path(p), key)\n    assert got == payload, 'partial read'\n")
    path = tmp_path / "proc.co"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE) for _ in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    assert read_entry(path, cache_key(*BASE)) == bytes(range(256)) * 512


def test_missing_source_is_a_gpu_error(tmp_path):
    with pytest.raises(GpuError) as info:
        KernelCache(CountingCompiler(), tmp_path, sources=SRC).code_object("nope.hip", "gfx90a")
    assert "nope.hip" in str(info.value)


class RecordingRuntime:
    """Records module loads; stands in for a device to test the per-device module cache."""

    def __init__(self):
        self._device = 0
        self.loads, self.lookups = [], []

    def current_device(self):
        return self._device

    def device_info(self, index):
        return DeviceInfo(index, "rec", ["gfx90a", "gfx1030"][index], 1 << 30, "amd", 64, 1)

    def module_load(self, image):
        self.loads.append(image)
        return 1000 + len(self.loads)

    def module_function(self, module, name):
        self.lookups.append((module, name))
        return module * 10 + len(self.lookups)

    def module_unload(self, module):
        pass


def test_function_loads_each_module_once_per_device(tmp_path):
    comp = CountingCompiler()
    cache = KernelCache(comp, tmp_path, sources=SRC)
    rt = RecordingRuntime()
    f1 = cache.function(rt, "a.hip", "ka")
    assert cache.function(rt, "a.hip", "ka") == f1
    cache.function(rt, "b.hip", "kb")
    assert len(rt.loads) == 2
    rt._device = 1                      # another device: its own arch, its own module
    cache.function(rt, "a.hip", "ka")
    assert len(rt.loads) == 3 and b"gfx1030" in rt.loads[-1]
    assert comp.calls == 3


def test_real_hiprtc_round_trip_through_disk(tmp_path):
    from hipsched.gpu.bindings.compilers import get_compiler
    try:
        comp = get_compiler("gfx906")
    except GpuError as e:
        missing_tool(f"hiprtc for gfx906 ({e})", "Debian: apt-get install libamdhip64-dev")
    first = KernelCache(comp, tmp_path, sources=SRC)
    code = first.code_object("a.hip", "gfx906")
    second = KernelCache(comp, tmp_path, sources=SRC)
    assert second.code_object("a.hip", "gfx906") == code and second.hits == 1 and second.misses == 0
