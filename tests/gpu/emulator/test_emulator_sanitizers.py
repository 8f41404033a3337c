"""The kernel emulator's memcheck (AddressSanitizer + UBSan) and racecheck (ThreadSanitizer) must catch
what they are there for, so each is run on kernels with a planted bug: one element past the end of a
device allocation, past the end of dynamic shared memory, a misaligned float4 load, and a block reduction
with one barrier removed. Each bug kernel has a twin without the bug that must run clean, so a checker
that reports everything fails here too. The real kernels run under both checkers in CI's separate steps
(docs/design/emulator-and-proof.md, "Memcheck and racecheck on the emulator").

A sanitized kernel only loads into a process that started with the sanitizer's runtime, and a finding
ends that process, so each launch runs in a child Python under gpu_emulator.sanitizer_env."""
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hipsched.errors import GpuError
from hipsched.gpu.compilation.kernels import prelude

import gpu_emulator

pytestmark = pytest.mark.skipif(not gpu_emulator.available(), reason="needs g++ (C++20) for the kernel emulator")

TESTS = Path(__file__).resolve().parents[2] / "support"   # gpu_emulator.py and its helpers
PRELUDE = prelude()   # what kernels.py puts before every kernel source

PLANTED = r"""
// y[i] = x[i] over n elements; `over` extra iterations run past the end (the planted overflow)
HS_KERNEL void planted_copy(const float* x, float* y, hs_i64 n, hs_i64 over) {
    for (hs_i64 i = hs_gid(); i < n + over; i += hs_gstride()) y[i] = x[i];
}

// every thread writes its own slot of dynamic shared memory, shifted by `off` (1: the last one is past it)
HS_KERNEL void planted_smem(const float* x, float* y, hs_i64 off) {
    extern __shared__ float buf[];
    buf[threadIdx.x + off] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = buf[threadIdx.x];
}

// a float4 load at x + off: off = 1 is 4 bytes past a 16-byte boundary
HS_KERNEL void planted_float4(const float* x, float* y, hs_i64 off) {
    const float4 v = *(const float4*)(x + off);
    y[threadIdx.x] = v.x + v.y + v.z + v.w;
}

// hs_block_reduce (prelude.h) with the barrier between the warps' partial sums and warp 0 reading them
// present only when `synced`: without it warp 0 reads scratch[w] while warp w's lane 0 writes it
HS_KERNEL void planted_block_sum(const float* x, float* out, hs_i64 synced) {
    __shared__ float scratch[HS_MAX_WARPS];
    const int lane = threadIdx.x % HS_WARP, wid = threadIdx.x / HS_WARP;
    const int nw = blockDim.x / HS_WARP;
    float v = hs_warp_reduce<HsSum>(x[blockIdx.x * blockDim.x + threadIdx.x]);
    if (lane == 0) scratch[wid] = v;
    if (synced) __syncthreads();
    if (wid == 0) {
        v = lane < nw ? scratch[lane] : 0.0f;
        v = hs_warp_reduce<HsSum>(v);
        if (lane == 0) out[blockIdx.x] = v;
    }
}

// a barrier only the first `half` threads reach: on a GPU the block hangs
HS_KERNEL void planted_divergent_sync(const float* x, float* y, hs_i64 half) {
    if ((hs_i64)threadIdx.x < half) __syncthreads();
    y[threadIdx.x] = x[threadIdx.x];
}
"""

# One launch in a child process: exact-size zeroed buffers, x holding 0, 1, 2, ...; prints the output.
CHILD = r"""
import ctypes, json, sys
import numpy as np
sys.path.insert(0, {tests!r})
import gpu_emulator
spec = json.loads(sys.argv[1])
rt = gpu_emulator.EmuRuntime(spec["warp"], spec["sanitize"])
with open(spec["image"], "rb") as f:
    fn = rt.module_function(rt.module_load(f.read()), spec["kernel"])
x = np.arange(spec["nx"], dtype=np.float32)
xd, yd = rt.malloc(x.nbytes), rt.malloc(4 * spec["ny"])
rt.memcpy_htod(xd, x.ctypes.data, x.nbytes)
rt.memset(yd, 0, 4 * spec["ny"])
args = (ctypes.c_void_p(xd), ctypes.c_void_p(yd)) + tuple(ctypes.c_int64(v) for v in spec["ints"])
rt.launch(fn, (spec["grid"], 1, 1), (spec["block"], 1, 1), args, spec.get("shared", 0))
y = np.empty(spec["ny"], np.float32)
rt.memcpy_dtoh(y.ctypes.data, yd, y.nbytes)
rt.synchronize()
print("result", json.dumps(y.tolist()))
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The planted kernels built once per checker (a sanitized build takes seconds)."""
    d = tmp_path_factory.mktemp("planted")
    source = PRELUDE + '#line 1 "planted.hip"\n' + PLANTED
    built = {}

    def image(kind):
        if kind not in built:
            path = d / f"planted_{kind}.so"
            path.write_bytes(gpu_emulator.EmuCompiler(32, kind).compile(source, "planted.hip", "sm_90"))
            built[kind] = str(path)
        return built[kind]
    return image


def line(text):
    """planted.hip's line number of the first line holding `text`, as reports give it."""
    return f"planted.hip:{next(i for i, t in enumerate(PLANTED.split(chr(10)), 1) if text in t)}"


def launch(images, kind, kernel, ints, nx=100, ny=100, grid=1, block=64, shared=0):
    spec = dict(sanitize=kind, warp=32, image=images(kind), kernel=kernel, ints=list(ints), nx=nx, ny=ny,
                grid=grid, block=block, shared=shared)
    return subprocess.run([sys.executable, "-c", CHILD.format(tests=str(TESTS)), json.dumps(spec)],
                          env=gpu_emulator.sanitizer_env(kind), capture_output=True, text=True, timeout=600)


def result(r):
    assert r.returncode == 0, f"clean kernel reported ({r.returncode}):\n{r.stderr[-6000:]}"
    return json.loads(r.stdout.split("result ", 1)[1])


def report(r):
    assert r.returncode != 0 and "result" not in r.stdout, f"planted bug not reported:\n{r.stdout}\n{r.stderr}"
    return r.stderr


def test_one_element_past_the_end_of_a_device_allocation(images):
    assert result(launch(images, "address", "planted_copy", [100, 0])) == list(range(100))
    err = report(launch(images, "address", "planted_copy", [100, 1]))
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in err
    assert "0 bytes to the right of 400-byte region" in err   # exactly at the end: no rounding up
    assert "planted_copy" in err and line("y[i] = x[i];") in err   # the kernel and the line of the access


def test_one_element_past_the_end_of_dynamic_shared_memory(images):
    assert result(launch(images, "address", "planted_smem", [0], nx=64, ny=64, shared=256)) == list(range(64))
    err = report(launch(images, "address", "planted_smem", [1], nx=64, ny=64, shared=256))
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in err
    assert "0 bytes to the right of 256-byte region" in err
    assert line("buf[threadIdx.x + off] =") in err


def test_misaligned_float4_load(images):
    assert result(launch(images, "address", "planted_float4", [0], ny=64))[0] == 0 + 1 + 2 + 3
    err = report(launch(images, "address", "planted_float4", [1], ny=64))
    assert "runtime error: " in err and " misaligned address " in err   # (the load binds a const float4&)
    assert "'const struct float4', which requires 16 byte alignment" in err
    assert line("*(const float4*)(x + off)") in err


def test_reduction_with_a_barrier_removed_is_a_data_race(images):
    out = result(launch(images, "thread", "planted_block_sum", [1], nx=256, ny=2, grid=2, block=128))
    assert out == [sum(range(128)), sum(range(128, 256))]
    err = report(launch(images, "thread", "planted_block_sum", [0], nx=256, ny=2, grid=2, block=128))
    assert "WARNING: ThreadSanitizer: data race" in err
    # the two sides: lane 0 of warp 1 writing its partial sum, warp 0 reading it
    assert "planted_block_sum" in err
    assert line("scratch[wid] = v") in err and line("scratch[lane] :") in err


def test_a_barrier_that_part_of_a_block_never_reaches_is_an_error_not_a_hang():
    """The emulator runs a block's threads as fibers that give way at barriers; when every thread left
    waits at one the others have passed by, the launch fails naming the kernel (a GPU would hang)."""
    rt = gpu_emulator.EmuRuntime(32, "")
    fn = rt.module_function(rt.module_load(gpu_emulator.EmuCompiler(32, "").compile(
        PRELUDE + '#line 1 "planted.hip"\n' + PLANTED, "planted.hip", "sm_90")), "planted_divergent_sync")
    x = rt.malloc(4 * 64)
    rt.memset(x, 0, 4 * 64)
    args = (ctypes.c_void_p(x), ctypes.c_void_p(x))
    rt.launch(fn, (1, 1, 1), (64, 1, 1), args + (ctypes.c_int64(64),))   # every thread reaches it
    rt.synchronize()
    with pytest.raises(GpuError, match="planted_divergent_sync: threads of a block wait at a barrier"):
        rt.launch(fn, (1, 1, 1), (64, 1, 1), args + (ctypes.c_int64(32),))
        rt.synchronize()


def test_sanitized_build_refuses_a_process_without_the_runtime():
    if gpu_emulator.sanitizer_loaded("address"):
        pytest.skip("this process already has the ASan runtime")
    with pytest.raises(RuntimeError, match="LD_PRELOAD=.*libasan"):
        gpu_emulator.EmuRuntime(32, "address")


def test_sanitizer_selected_by_environment_and_part_of_the_cache_key(monkeypatch):
    monkeypatch.setenv("HIPSCHED_EMU_SANITIZE", "thread")
    assert gpu_emulator.sanitize_from_env() == "thread"
    monkeypatch.setenv("HIPSCHED_EMU_SANITIZE", "memory")
    with pytest.raises(ValueError):
        gpu_emulator.sanitize_from_env()
    versions = {gpu_emulator.EmuCompiler(32, k).version() for k in ("", "address", "thread")}
    assert len(versions) == 3   # a sanitized code object is never served for a plain build, nor the reverse


def test_wrapper_preloads_the_runtime_and_keeps_reports_out_of_pytests_capture(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import gpu_emulator, sys\n"
                     "def test_probe():\n"
                     "    assert gpu_emulator.sanitizer_loaded('thread') and gpu_emulator.sanitize_from_env() == 'thread'\n"
                     "    assert '--capture=sys' in sys.argv\n")
    # the caller's PYTHONPATH stays behind the helpers': the child imports the hipsched under test
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, str(TESTS / "gpu_emulator.py"), "thread", "-m", "pytest", "-q", "-p",
                        "no:cacheprovider", str(probe)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=path))
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_memcheck_gives_each_scratch_temporary_an_exact_size_allocation(tmp_path):
    """The glue keeps scratch buffers (256 bytes at least, reused when large enough), so a planted write
    one past a top-k pass's 120-byte partial results goes unreported there; memcheck turns reuse off."""
    code = ("import sys, numpy as np\n"
            f"sys.path.insert(0, {str(TESTS)!r})\n"
            "import gpu_emulator\n"
            "from hipsched.gpu.launch.context import GpuContext\n"
            f"ctx = GpuContext(gpu_emulator.EmuRuntime(32), cache_dir={str(tmp_path)!r})\n"
            "a = ctx.scratch('partial', (30,), np.float32, 0)\n"
            "print('bytes', a.owner.nbytes)\n")
    sizes = {}
    for kind in ("address", "thread"):
        r = subprocess.run([sys.executable, "-c", code], env=gpu_emulator.sanitizer_env(kind), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        sizes[kind] = int(r.stdout.split("bytes ", 1)[1])
    assert sizes == {"address": 120, "thread": 256}   # racecheck keeps the glue's reuse as it is
