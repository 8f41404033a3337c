"""GpuBackend without a GPU: it must report itself unavailable with the runtimes' reasons, refuse to run
with GpuError(unavailable), and answer the scheduler's capability and transfer questions from tables.
Also the contract pieces that need no device: launch-argument conversion, error conversion in run(),
the vendor-BLAS loader's "absent" answer and its half-precision GEMM's argument lists, and that every
kernel the glue names exists in the sources."""
import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gpu_presence import gpu_present

from hipsched.backends import gpu as gpu_backend
from hipsched.backends.gpu import GPU_IMPLS, create_gpu_backend
from hipsched.errors import GpuError
from hipsched.gguf_blocks import QuantizedTensor
from hipsched.gpu.compilation.kernels import kernel_names
from hipsched.ops import OpType
from hipsched.ops.base import Call

ROOT = Path(__file__).resolve().parents[3]


no_gpu_only = pytest.mark.skipif(gpu_present(), reason="a GPU is present: the no-device path cannot be seen")


@pytest.fixture(scope="module")
def backend():
    b = create_gpu_backend()
    yield b
    b.close()


def _in_subprocess(code, **env):
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


@no_gpu_only
def test_real_runtime_reports_unavailable_with_reason(backend):
    assert backend.available is False
    reason = backend.unavailable_reason
    assert reason and isinstance(reason, str)
    # the HIP runtime is installed here and answers "no device"; CUDA's driver library is absent
    assert re.search(r"hip", reason, re.I), reason
    assert re.search(r"cuda", reason, re.I), reason
    assert backend.device_name is None and backend.device_arch is None


@no_gpu_only
def test_run_raises_unavailable(backend):
    a = np.ones(8, np.float32)
    call = Call("add", (a, a), {}, size=8, nbytes=96)
    with pytest.raises(GpuError) as ei:
        backend.run(call)
    assert ei.value.kind == "unavailable"
    assert backend.free_memory() == 0


def test_runtime_none_is_unavailable_everywhere():
    out = _in_subprocess(
        "from hipsched.backends.gpu import create_gpu_backend\n"
        "b = create_gpu_backend()\n"
        "print(b.available, bool(b.unavailable_reason))\n"
        "import numpy as np\n"
        "from hipsched.ops.base import Call\n"
        "from hipsched.errors import GpuError\n"
        "try:\n"
        "    b.run(Call('scale', (np.ones(3, np.float32),), {'alpha': 2.0}, 3, 24))\n"
        "except GpuError as e:\n"
        "    print(e.kind)\n",
        HIPSCHED_GPU_RUNTIME="none")
    assert out.split() == ["False", "True", "unavailable"]


def test_impl_table_covers_every_op():
    assert set(GPU_IMPLS) == {op.value for op in OpType}
    for module, fn in GPU_IMPLS.values():
        assert module.startswith("hipsched.gpu.ops.") and fn


def test_supports_table(backend):
    for op in GPU_IMPLS:
        if op in ("dequantize", "qmatmul"):
            assert backend.supports(op, "q8_0") and backend.supports(op, "q4_0")
            assert not backend.supports(op, "q5_k")
            # qmatmul's Call.dtype names x's dtype beside the quant type when x is half
            half = [f"{q}/{x}" for q in ("q8_0", "q4_0") for x in ("float16", "bfloat16")]
            assert all(backend.supports(op, d) for d in half) == (op == "qmatmul")
        else:
            assert backend.supports(op, "float32")
            assert not backend.supports(op, "float64")
    assert not backend.supports("fft", "float32")
    assert not backend.supports("add", "q8_0")


def test_max_elements_table(backend):
    for op in GPU_IMPLS:
        assert backend.max_elements(op) >= 2**40  # 64-bit indexing everywhere
    assert backend.max_elements("fft") == 0


def test_transfer_and_device_bytes_from_the_call(backend):
    q = np.ones(64, np.float32)
    T = np.ones((100, 64), np.float32)
    nbytes = q.nbytes + T.nbytes + 100 * 4
    call = Call("cosine_similarity", (q, T), {}, size=100 * 64, nbytes=nbytes)
    if not backend.available:  # nothing can be resident without a device
        assert backend.transfer_bytes(call) == (q.nbytes + T.nbytes, 400)
    h2d, d2h = backend.transfer_bytes(call)
    assert d2h == 400 and h2d <= q.nbytes + T.nbytes
    assert backend.device_bytes_needed(call) >= nbytes
    topk = Call("top_k", (q, T), {"k": 5}, size=100 * 64, nbytes=nbytes)
    assert backend.device_bytes_needed(topk) >= nbytes + 100 * 4  # the scores live on the device too
    on_dev = Call("add", (q, q), {}, size=64, nbytes=3 * 256, on_device=True)
    assert backend.transfer_bytes(on_dev) == (0, 0)


def test_quantized_inputs_count_their_block_bytes(backend):
    W = QuantizedTensor(np.zeros(34 * 4, np.uint8), (4, 32), "q8_0")   # 4 rows of one Q8_0 block
    x = np.ones(32, np.float32)
    call = Call("qmatmul", (W, x), {}, size=4 * 32, nbytes=34 * 4 + 128 + 16, dtype="q8_0")
    if not backend.available:
        assert backend.transfer_bytes(call) == (34 * 4 + 128, 16)


def test_run_turns_any_failure_into_gpu_error():
    b = gpu_backend.GpuBackend.__new__(gpu_backend.GpuBackend)
    b.available, b._ctx, b._fns = True, object(), {}

    def boom(ctx, call, stream):
        raise ValueError("bad launch config")

    def oom(ctx, call, stream):
        raise MemoryError("no room")

    call = Call("add", (), {}, 0, 0)
    for fn, kind in ((boom, "runtime"), (oom, "oom")):
        b._fns["add"] = fn
        with pytest.raises(GpuError) as ei:
            b.run(call)
        assert ei.value.kind == kind and "add" in str(ei.value)
    with pytest.raises(GpuError) as ei:
        b.run(Call("fft", (), {}, 0, 0))
    assert ei.value.kind == "unsupported"
    b._fns["add"] = lambda ctx, call, stream: stream
    assert b.run(call, stream=None) == 0
    assert b.run(call, stream=type("S", (), {"cuda_stream": 7})()) == 7


class _RecordingRuntime:
    """Just enough runtime for GpuContext to be built and to launch into a list."""
    name, platform = "fake", "nvidia"

    class compiler:
        name = "nvrtc"

    def __init__(self):
        from hipsched.gpu.bindings.runtime import DeviceInfo
        self.info = DeviceInfo(0, "fake", "sm_90", 1 << 30, "nvidia", 32, 4)
        self.launches = []
        self.next_ptr, self.live = 1 << 20, set()

    def malloc(self, nbytes):  # distinct fake addresses: nothing ever dereferences them
        self.next_ptr += max(nbytes, 1) + 256
        self.live.add(self.next_ptr)
        return self.next_ptr

    def free(self, ptr):
        self.live.remove(ptr)

    def set_device(self, i): pass
    def current_device(self): return 0
    def device_info(self, i): return self.info
    def launch(self, fn, grid, block, args, shared_bytes=0, stream=0):
        self.launches.append((fn, grid, block, args, shared_bytes, stream))


def test_context_launch_converts_arguments():
    from hipsched.gpu.launch.context import GpuContext
    from hipsched.gpu.memory.device_array import DeviceArray
    rt = _RecordingRuntime()
    ctx = GpuContext(rt)
    assert ctx.warp_size == 32 and ctx.arch == "sm_90"
    arr = DeviceArray(0x1000, (4,), np.float32, rt)
    ctx.launch(99, 3, (128, 2), (arr, None, ctypes.c_int64(5), ctypes.c_float(1.5)), shared=64, stream=11)
    fn, grid, block, args, shared, stream = rt.launches[0]
    assert (fn, grid, block, shared, stream) == (99, (3, 1, 1), (128, 2, 1), 64, 11)
    assert [type(a) for a in args] == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
    assert args[0].value == 0x1000 and not args[1].value and args[2].value == 5
    with pytest.raises(TypeError):
        ctx.launch(1, 1, 1, (3,))  # a bare Python int has no declared C type: refuse, never guess
    # grid-stride launches never ask for more blocks than fill the device
    assert ctx.blocks_for(10, 256) == 1
    assert ctx.blocks_for(10**9, 256) == 4 * 16


def test_blas_absent_means_none(monkeypatch):
    from hipsched.gpu.launch import blas
    monkeypatch.setenv("HIPSCHED_BLAS", "none")
    assert blas.load_blas("nvidia") is None
    monkeypatch.delenv("HIPSCHED_BLAS")
    monkeypatch.setenv("HIPSCHED_BLAS_LIBRARY", "/nonexistent/libcublas.so")
    assert blas.load_blas("nvidia") is None and blas.load_blas("amd") is None


@pytest.mark.parametrize("flavour", ["cublas", "rocblas"])
def test_gemm_ex_arguments_follow_the_library_signature(flavour):
    """The mixed-precision GEMM's argument lists, against the declared argtypes and the vendors'
    documented order (no library needed: the calls are captured). Row-major C = A @ B is the column-major
    C^T = B^T A^T, as for sgemm: B first, then A, with m = N and n = M. A batch goes to the
    strided-batched call; a single product to the plain Ex call (cublasGemmEx / rocblas_gemm_ex), as
    PyTorch's gemm<at::Half> makes it: float32 compute, CUBLAS_GEMM_DEFAULT_TENSOR_OP on cuBLAS."""
    import threading

    from hipsched.gpu.launch.blas import FLAVOURS, GEMM_EX, Blas
    blas = Blas.__new__(Blas)
    blas.flavour, blas._op_n = flavour, FLAVOURS[flavour][6]
    blas._handle, blas._lock = ctypes.c_void_p(7), threading.Lock()
    blas._alpha, blas._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    _, blas._ex_types, blas._ex_compute, blas._ex_algo, _ = GEMM_EX[flavour]
    batched, single = [], []
    blas._gemm_ex = lambda *args: batched.append(args) or 0
    blas._gemm_ex1 = lambda *args: single.append(args) or 0
    blas._set_stream = lambda handle, stream: 0
    assert blas.supports_dtype("float16") and blas.supports_dtype("bfloat16") and not blas.supports_dtype("int8")
    M, N, K = 3, 5, 4
    blas.gemm_ex_rowmajor(1000, 2000, 3000, M, N, K, 2, M * K, 0, M * N, 0, "bfloat16")
    (args,) = batched
    assert len(args) == len(Blas._ex_argtypes(flavour)) and not single
    t = GEMM_EX[flavour][1]["bfloat16"]
    assert args[3:6] == (N, M, K)
    assert (args[7].value, args[8], args[9], args[10]) == (2000, t, N, 0)        # B^T: ld N, broadcast
    assert (args[11].value, args[12], args[13], args[14]) == (1000, t, K, M * K)  # A^T: ld K
    assert (args[16].value, args[17], args[18], args[19]) == (3000, t, N, M * N)  # C^T: ld N
    if flavour == "rocblas":   # D = C, then batch, f32_r compute, standard algorithm, solution 0, flags 0
        assert (args[20].value, args[21], args[22], args[23]) == (3000, t, N, M * N)
        assert args[24:] == (2, 151, 0, 0, 0)
    else:                      # batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP
        assert args[20:] == (2, 68, 99)
    blas.gemm_ex_rowmajor(1000, 2000, 3000, M, N, K, 1, 0, 0, M * N, 0, "float16")
    (args,) = single
    assert len(args) == len(Blas._ex_argtypes(flavour, batched=False)) and len(batched) == 1
    t = GEMM_EX[flavour][1]["float16"]
    assert args[3:6] == (N, M, K)
    assert (args[7].value, args[8], args[9]) == (2000, t, N)     # B^T
    assert (args[10].value, args[11], args[12]) == (1000, t, K)  # A^T
    assert (args[14].value, args[15], args[16]) == (3000, t, N)  # C^T
    if flavour == "rocblas":   # D = C, f32_r compute, standard algorithm, solution 0, flags 0
        assert (args[17].value, args[18], args[19]) == (3000, t, N)
        assert args[20:] == (151, 0, 0, 0)
    else:
        assert args[17:] == (68, 99)
    with pytest.raises(GpuError):
        blas.gemm_ex_rowmajor(1000, 2000, 3000, M, N, K, 1, 0, 0, 0, 0, "float32")


def test_every_kernel_named_by_the_glue_exists():
    glue = "".join(p.read_text() for p in (ROOT / "hipsched" / "gpu" / "ops").glob("*.py"))
    named = re.findall(r'(?:ctx\.function|Launch\.of)\("(\w+)",\s*(?:"(\w+)"|name)', glue)
    sources = {p.stem: p.read_text() for p in (ROOT / "src_c" / "hip").glob("*.hip")}
    # kernel_names: spelled out, or stamped per element type by HS_FOR_EACH_FLOAT (hs_add_##S...)
    kernels = {stem: set(kernel_names(text)) for stem, text in sources.items()}
    literal = [(src, k) for src, k in named if k]
    assert literal, "no kernel names found in the glue"
    for src, k in literal:
        assert k in kernels.get(src, ()), f"{k} not in {src}.hip"
    # names built at run time (element type suffix, _v4, query count): every variant the glue forms
    from hipsched.gpu.ops import elementwise, linalg, norm, quant, similarity
    for warp in (32, 64):
        for launch in (elementwise.report_launches(warp, 2) + similarity.report_launches(warp, 2)
                       + linalg.report_launches(warp, 2) + norm.report_launches(warp, 2)
                       + quant.report_launches(warp, 2)):
            assert launch.kernel in kernels[launch.source], f"{launch.kernel} not in {launch.source}.hip"
    for sfx in ("f32", "f16", "bf16"):
        for base in (f"hs_cosine_{sfx}_q1", f"hs_cosine_{sfx}_q8"):
            assert {base, base + "_v4"} <= kernels["similarity"]


def test_glue_matmul_shapes_follow_numpy():
    from hipsched.gpu.ops.linalg import _matmul_shapes
    cases = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
             ((3, 4), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)), ((0, 4), (4, 5)), ((3, 0), (0, 5))]
    for sa, sb in cases:
        batch, M, N, K, stride_a, stride_b, out = _matmul_shapes(sa, sb)
        assert out == np.matmul(np.ones(sa), np.ones(sb)).shape, (sa, sb)
        assert batch * M * N == int(np.prod(out)) or 0 in out
    with pytest.raises(GpuError):
        _matmul_shapes((3, 4), (5, 6))


def test_context_scratch_reuse_rules():
    import threading
    from hipsched.gpu.launch.context import SCRATCH_KEEP_BYTES, GpuContext
    rt = _RecordingRuntime()
    ctx = GpuContext(rt)
    a = ctx.scratch("scores", (10, 10), np.float32, 5)
    assert a.shape == (10, 10) and a.dtype == np.float32
    assert ctx.scratch("scores", (20,), np.int64, 5).ptr == a.ptr          # fits: same buffer, new view
    assert ctx.scratch("qinv", (10,), np.float32, 5).ptr != a.ptr          # another temporary
    assert ctx.scratch("scores", (10, 10), np.float32, 6).ptr != a.ptr     # another stream
    grown = ctx.scratch("scores", (1000,), np.float32, 5)
    assert grown.ptr != a.ptr and ctx.scratch("scores", (5,), np.float32, 5).ptr == grown.ptr
    other = []
    t = threading.Thread(target=lambda: other.append(ctx.scratch("scores", (5,), np.float32, 5).ptr))
    t.start(); t.join()
    assert other[0] != grown.ptr                                           # another thread
    huge = SCRATCH_KEEP_BYTES // 4 + 1
    assert ctx.scratch("big", (huge,), np.float32, 5).ptr != ctx.scratch("big", (huge,), np.float32, 5).ptr
    del a, grown
    ctx.close()
    import gc
    gc.collect()
    assert not rt.live  # every buffer went back once nothing viewed it
