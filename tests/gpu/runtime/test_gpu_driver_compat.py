"""Compiler and driver versions: which NVRTC (and CUBIN or PTX) a CUDA driver of a given version can
load, the driver version in the kernel-cache key, and a driver that refuses our code objects becoming
one `unavailable` reason, never a load retried on every call.

The driver is tests/support/fake_cuda_driver.py under the real ctypes binding: it refuses a CUBIN whose ELF
ABI version is newer than its CUDA major (as CUDA 12 drivers refuse NVRTC 13's) and PTX whose ISA
is newer than it. One test uses the real NVRTC libraries when both a CUDA 12 and a CUDA 13 one are
installed (the test extra brings both)."""
import numpy as np
import pytest

import hipsched
from hipsched.backends.gpu import GpuBackend
from hipsched.errors import GpuError
from hipsched.gpu.compilation import compilers
from hipsched.gpu.bindings.compilers import (cuda_version_for_ptx_isa, load_target, ptx_isa_of, ptx_isa_of_nvrtc,
                                    select_nvrtc)
from hipsched.gpu.compilation.kernels import KernelCache, cache_key

from fake_cuda_driver import FakeCudaDriver, fake_nvrtc, install


def test_newest_nvrtc_of_the_drivers_cuda_major_is_chosen():
    found = [fake_nvrtc(13, 5), fake_nvrtc(12, 4), fake_nvrtc(12, 9)]
    assert select_nvrtc(found, 12020).version_tuple() == (12, 9)   # R535: minor version compatibility
    assert select_nvrtc(found, 12080).version_tuple() == (12, 9)
    assert select_nvrtc(found, 13000).version_tuple() == (13, 5)
    assert select_nvrtc(found, None).version_tuple() == (13, 5)    # no driver (ahead of time): newest
    # nothing old enough: the newest, whose plan then refuses with the reason
    assert select_nvrtc([fake_nvrtc(13, 0)], 12040).version_tuple() == (13, 0)


def test_cubin_only_for_a_driver_of_the_nvrtcs_major_or_newer():
    assert fake_nvrtc(12, 9).target_for("sm_90", 12020) == "sm_90"
    assert fake_nvrtc(12, 4).target_for("sm_90", 13000) == "sm_90"
    assert fake_nvrtc(13, 5).target_for("sm_90", 13000) == "sm_90"
    assert fake_nvrtc(13, 5).target_for("sm_90", None) == "sm_90"
    with pytest.raises(GpuError) as info:
        fake_nvrtc(13, 5).target_for("sm_90", 12040)
    e = info.value
    assert e.kind == "unavailable" and e.name == "driver-too-old"
    text = str(e)
    assert "nvrtc 13.5" in text and "CUDA 12.4" in text and "12040" in text and "R580" in text
    assert "nvidia-cuda-nvrtc-cu12" in text and "HIPSCHED_NVRTC_LIBRARY" in text


def test_ptx_only_when_the_driver_knows_its_isa():
    # a GPU newer than this NVRTC's CUBIN targets: PTX for the newest arch it has, JIT-compiled by a
    # driver at least as new as the NVRTC
    assert fake_nvrtc(12, 4, archs=(80, 90)).target_for("sm_100", 12080) == "compute_90"
    with pytest.raises(GpuError) as info:    # ISA 8.8 of NVRTC 12.9 is unknown to a 12.4 driver
        fake_nvrtc(12, 9, archs=(80, 90)).target_for("sm_100", 12040)
    assert info.value.kind == "unavailable" and "CUDA 12.9" in str(info.value)
    # the PTX ISA table: the releases that changed the x+4 rule, and the rule itself
    assert ptx_isa_of_nvrtc(12, 6) == (8, 5) and ptx_isa_of_nvrtc(12, 8) == (8, 7)
    assert ptx_isa_of_nvrtc(13, 5) == (9, 5) and cuda_version_for_ptx_isa((9, 5)) == 13050
    assert cuda_version_for_ptx_isa((8, 6)) == 12070 and cuda_version_for_ptx_isa((8, 4)) == 12040
    assert ptx_isa_of(b"//\n.version 8.4\n.target sm_90\n") == (8, 4)


def test_cache_key_changes_with_the_driver():
    base = ("nvrtc", "nvrtc 12.9 libnvrtc.so.12", "sm_90", ("--std=c++17",), "src")
    keys = {cache_key(*base, loader) for loader in ("cuda-driver 12040", "cuda-driver 12080",
                                                    "cuda-driver 13000", "hip-driver 50221153 hip-runtime 50221153",
                                                    "hip-driver 60032830 hip-runtime 60032830")}
    assert len(keys) == 5 and cache_key(*base) not in keys
    assert cache_key(*base, "") == cache_key(*base)   # ahead-of-time entries keep their key


def _runtime(monkeypatch, version, nvrtc, devices=1):
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    driver = install(monkeypatch, FakeCudaDriver(version=version, devices=devices))
    rt = CtypesRuntime("cuda")
    rt._compiler = nvrtc
    return rt, driver


def test_runtime_reports_its_driver_and_picks_nvrtc_by_it(monkeypatch):
    from hipsched.gpu.bindings.ctypes_api import CtypesRuntime
    install(monkeypatch, FakeCudaDriver(version=12040))
    seen = []
    monkeypatch.setattr(compilers, "nvrtc_candidates", lambda: [fake_nvrtc(13, 5), fake_nvrtc(12, 8)])
    real_select = compilers.select_nvrtc
    monkeypatch.setattr(compilers, "select_nvrtc", lambda c, d: seen.append(d) or real_select(c, d))
    rt = CtypesRuntime("cuda")
    assert rt.driver_version() == 12040 and rt.loader_tag() == "cuda-driver 12040"
    assert rt.compiler.version_tuple() == (12, 8) and seen == [12040]


def test_loads_once_per_driver_and_reuses_ahead_of_time_entries(tmp_path, monkeypatch):
    nvrtc = fake_nvrtc(12, 9)
    src = {"k.hip": 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }'}
    old, _ = _runtime(monkeypatch, 12040, nvrtc)
    KernelCache(nvrtc, tmp_path, sources=src).function(old, "k.hip", "k")
    new, _ = _runtime(monkeypatch, 12080, nvrtc)
    KernelCache(nvrtc, tmp_path, sources=src).function(new, "k.hip", "k")
    assert len(nvrtc.compiles) == 2          # another driver, another key
    KernelCache(nvrtc, tmp_path, sources=src).function(new, "k.hip", "k")
    assert len(nvrtc.compiles) == 2          # the same driver again: from disk
    # `python -m hipsched compile` writes with no driver; any driver then uses that entry
    aot = tmp_path / "aot"
    KernelCache(nvrtc, aot, sources=src).code_object("k.hip", "sm_90")
    third, _ = _runtime(monkeypatch, 12090, nvrtc)
    KernelCache(nvrtc, aot, sources=src).function(third, "k.hip", "k")
    assert len(nvrtc.compiles) == 3


def test_driver_older_than_the_only_nvrtc_is_one_reason_and_no_load(tmp_path, monkeypatch):
    rt, driver = _runtime(monkeypatch, 12040, fake_nvrtc(13, 5))
    backend = GpuBackend({"kernel_cache_dir": str(tmp_path)}, runtime=rt)
    assert backend.available is False
    assert "nvrtc 13.5" in backend.unavailable_reason and "CUDA 12.4" in backend.unavailable_reason
    ex = hipsched.Executor(gpu_backend=backend, gpu_min_batch_size=1, telemetry_enabled=True)
    x = np.arange(4096, dtype=np.float32)
    for _ in range(5):
        np.testing.assert_array_equal(ex.add(x, x), x + x)
    assert driver.module_loads == [] and rt.compiler.compiles == []
    assert {e["reason"] for e in ex.events} == {"gpu_unavailable"}
    assert backend.unavailable_reason in ex.capabilities().reasons[0] or \
        "nvrtc 13.5" in "; ".join(ex.capabilities().reasons)
    ex.close()


class LyingNvrtc:
    """Says it is NVRTC 12.9 but writes CUBINs a CUDA 12 driver refuses (as a misreported library would):
    the load itself fails, which no version check foresees."""

    def __new__(cls):
        c = fake_nvrtc(12, 9)
        real = c.compile

        def compile(*args, **kwargs):
            code = real(*args, **kwargs)
            return code[:8] + bytes([8]) + code[9:]
        c.compile = compile
        return c


def test_a_module_the_driver_refuses_is_one_unavailable_reason_not_a_retry_per_call(tmp_path, monkeypatch):
    rt, driver = _runtime(monkeypatch, 12040, LyingNvrtc())
    backend = GpuBackend({"kernel_cache_dir": str(tmp_path)}, runtime=rt)
    assert backend.available, backend.unavailable_reason
    ex = hipsched.Executor(gpu_backend=backend, strategy="gpu_preferred", gpu_min_batch_size=1,
                           telemetry_enabled=True)
    x = np.arange(4096, dtype=np.float32)
    for _ in range(6):
        np.testing.assert_array_equal(ex.add(x, x), x + x)
    assert [status for _, status in driver.module_loads] == [200]      # tried once, never again
    assert len(rt.compiler.compiles) == 1
    assert backend.available is False
    reason = backend.unavailable_reason
    assert "will not load" in reason and "cuda-driver 12040" in reason and "CUDA_ERROR_INVALID_IMAGE" in reason
    # found when the first call's kernels are loaded to judge it, before any launch: that call is
    # decided gpu_unavailable with the reason as its detail; nothing falls back
    assert [e["fallback"] for e in ex.events] == [None] * 6
    assert {e["reason"] for e in ex.events} == {"gpu_unavailable"}
    assert reason in ex.events[0]["detail"] and "detail" not in ex.events[1]
    assert not ex.capabilities().gpu_available
    ex.close()


def _real_nvrtcs():
    try:
        found = compilers.nvrtc_candidates()
    except GpuError:
        return {}
    return {c.version_tuple()[0]: c for c in sorted(found, key=lambda c: c.version_tuple())}


def test_real_nvrtc_libraries_chosen_by_driver_write_the_abi_that_driver_loads():
    found = _real_nvrtcs()
    if not {12, 13} <= set(found):
        # both are in the test extra: missing ones are a broken install, not a reason to skip
        pytest.fail(f"needs CUDA 12 and CUDA 13 NVRTC libraries (found majors {sorted(found)}): pip install -e '.[test]'",
                    pytrace=False)
    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }'
    chosen = select_nvrtc(list(found.values()), 12040)
    assert chosen.version_tuple()[0] == 12
    target = load_target(chosen, "sm_90", 12040)
    cubin = chosen.compile(src, "k.cu", target)
    newest = select_nvrtc(list(found.values()), 13000)
    assert newest.version_tuple()[0] == 13
    cubin13 = newest.compile(src, "k.cu", load_target(newest, "sm_90", 13000))
    assert cubin[:4] == cubin13[:4] == b"\x7fELF"
    assert cubin[8] == 7 and cubin13[8] == 8     # e_ident[EI_ABIVERSION]: the driver family that loads it
    with pytest.raises(GpuError) as info:
        load_target(newest, "sm_90", 12040)
    assert info.value.kind == "unavailable"


def test_info_says_why_no_kernel_would_load(monkeypatch, capsys):
    from hipsched.cli import info
    from hipsched.gpu.bindings import detect
    rt, driver = _runtime(monkeypatch, 12040, fake_nvrtc(13, 5))
    monkeypatch.setattr(detect, "get_runtime", lambda: rt)
    monkeypatch.setattr(detect, "attempts", lambda: [detect.RuntimeAttempt("cuda", True, None)])
    got = info.gather()["kernels"]
    assert got["driver_version"] == 12040 and got["loader"] == "cuda-driver 12040"
    assert "nvrtc 13.5" in got["unavailable"] and "CUDA 12.4" in got["unavailable"]
    info.run(type("Args", (), {"json": False})())
    out = capsys.readouterr().out
    assert "Kernels for this driver (cuda-driver 12040): unavailable: nvrtc 13.5" in out
    rt._compiler = fake_nvrtc(12, 8)
    got = info.gather()["kernels"]
    assert got["target"] == "sm_90" and got["compiler"].startswith("nvrtc 12.8")
    assert driver.module_loads == []
