"""The vendor BLAS for matmul, through ctypes: hipBLAS or rocBLAS on AMD, cuBLAS on NVIDIA.

All three share sgemm_strided_batched's argument list (handle, opA, opB, m, n, k, &alpha, A, lda,
strideA, B, ldb, strideB, &beta, C, ldc, strideC, batch); only the symbol names and the "no transpose"
constant differ, so one class serves them through a small table. They are column-major: a row-major
C = A @ B is computed as the column-major C^T = B^T @ A^T, which reads the same memory with no copy.

`load_blas(platform, driver_version)` returns None when no library can be opened (the tiled kernel in
matmul.hip then runs, and `last_reasons()` says why). HIPSCHED_BLAS=none forces that fallback;
HIPSCHED_BLAS_LIBRARY names a library file to use. A cuBLAS of a newer CUDA major than the driver
(cuBLAS 13 on a CUDA 12 driver) cannot create a handle there, so it is skipped for an older one.

float16 and bfloat16 go through the mixed-precision GEMM: A, B and C of the half type, float32 compute
(CUBLAS_COMPUTE_32F / rocblas f32_r) and float32 alpha/beta, as PyTorch's at::cuda::blas::gemm<at::Half>
and <at::BFloat16> call it (aten/src/ATen/cuda/CUDABlas.cpp). A single product (batch 1, what
torch.matmul of two matrices is) calls the plain cublasGemmEx / rocblas_gemm_ex as PyTorch does, not the
strided-batched form with one batch: the library's heuristic then chooses among the kernels it chooses
for PyTorch. cuBLAS's algorithm is CUBLAS_GEMM_DEFAULT_TENSOR_OP, PyTorch's (the same heuristic as
CUBLAS_GEMM_DEFAULT since cuBLAS 11). The math mode is the handle's default, CUBLAS_DEFAULT_MATH, which
is what PyTorch sets with torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction (and its
bf16 twin) at their default True: cuBLAS may reduce split-K partial sums in the half type. Batches
(torch.bmm's case) use the strided-batched form, as PyTorch's bgemm does.
hipBLAS's Ex call changed its type enums between hipBLAS 1.x (hipblasDatatype_t) and 2.x (hipDataType,
hipblasComputeType_t), so it is not called blind: with hipBLAS, half matmul runs the tiled kernel."""
from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
import threading

from ...errors import GpuError

log = logging.getLogger("hipsched")
_CUBLAS_MAJOR_VERSION = 0      # libraryPropertyType MAJOR_VERSION
_last_reasons: list[str] = []

# name -> (platform, library files, create, destroy, set_stream, sgemm_strided_batched, op_none)
FLAVOURS = {
    "hipblas": ("amd", ["libhipblas.so", "libhipblas.so.3", "libhipblas.so.2", "libhipblas.so.1", "libhipblas.so.0"],
                "hipblasCreate", "hipblasDestroy", "hipblasSetStream", "hipblasSgemmStridedBatched", 111),
    "rocblas": ("amd", ["librocblas.so", "librocblas.so.5", "librocblas.so.4", "librocblas.so.3", "librocblas.so.0"],
                "rocblas_create_handle", "rocblas_destroy_handle", "rocblas_set_stream",
                "rocblas_sgemm_strided_batched", 111),
    "cublas": ("nvidia", ["libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"],
               "cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSgemmStridedBatched", 0),
}


# flavour -> (strided-batched Ex symbol, {dtype: library's type enum}, float32 compute type, algorithm,
# single-product Ex symbol)
GEMM_EX = {
    # cudaDataType CUDA_R_16F = 2, CUDA_R_16BF = 14; CUBLAS_COMPUTE_32F = 68;
    # CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 (PyTorch's)
    "cublas": ("cublasGemmStridedBatchedEx", {"float16": 2, "bfloat16": 14}, 68, 99, "cublasGemmEx"),
    # rocblas_datatype f16_r = 150, bf16_r = 168, f32_r = 151; rocblas_gemm_algo_standard = 0
    "rocblas": ("rocblas_gemm_strided_batched_ex", {"float16": 150, "bfloat16": 168}, 151, 0, "rocblas_gemm_ex"),
}


def _candidate_files(names, platform) -> list[str]:
    roots = [os.environ.get("ROCM_PATH"), "/opt/rocm"] if platform == "amd" else \
        [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    paths = []
    for root in filter(None, roots):
        paths += [os.path.join(root, sub, n) for sub in ("lib", "lib64") for n in names]
    if platform == "nvidia":  # pip wheels: site-packages/nvidia/{cu13,cublas}/lib
        for entry in sys.path:
            for pattern in ("nvidia/cu*/lib/libcublas.so*", "nvidia/cublas/lib/libcublas.so*"):
                paths += sorted((p for p in glob.glob(os.path.join(entry or ".", pattern)) if "Lt" not in p),
                                reverse=True)
    out, seen = [], set()
    for p in paths + list(names):
        key = os.path.realpath(p) if os.path.isabs(p) else p
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _cuda_major(lib) -> int | None:
    """The CUDA major a cuBLAS belongs to (cublasGetProperty needs no handle, hence no device)."""
    fn = getattr(lib, "cublasGetProperty", None)
    if fn is None:
        return None
    v = ctypes.c_int(0)
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    return v.value if fn(_CUBLAS_MAJOR_VERSION, ctypes.byref(v)) == 0 and v.value > 0 else None


def last_reasons() -> list[str]:
    """Why the last load_blas call that found nothing skipped each library it tried."""
    return list(_last_reasons)


class Blas:
    """One opened vendor BLAS with a handle bound to the current device."""

    def __init__(self, flavour: str, lib: ctypes.CDLL, path: str):
        self.flavour = flavour
        self.path = path
        _, _, create, destroy, set_stream, gemm, self._op_n = FLAVOURS[flavour]
        self._lib = lib
        self._destroy = getattr(lib, destroy)
        self._set_stream = getattr(lib, set_stream)
        self._set_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._gemm = getattr(lib, gemm)
        i, i64, p = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
        self._gemm.argtypes = [p, i, i, i, i, i, p, p, i, i64, p, i, i64, p, p, i, i64, i]
        self._handle = ctypes.c_void_p()
        self._check(getattr(lib, create)(ctypes.byref(self._handle)), create)
        self._lock = threading.Lock()  # a handle's stream is shared state
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._gemm_ex, self._gemm_ex1, self._ex_types = None, None, {}
        if flavour in GEMM_EX:
            symbol, self._ex_types, self._ex_compute, self._ex_algo, single = GEMM_EX[flavour]
            self._gemm_ex = getattr(lib, symbol, None)
            if self._gemm_ex is not None:
                self._gemm_ex.argtypes = self._ex_argtypes(flavour)
                self._gemm_ex1 = getattr(lib, single, None)
                if self._gemm_ex1 is not None:
                    self._gemm_ex1.argtypes = self._ex_argtypes(flavour, batched=False)

    @staticmethod
    def _ex_argtypes(flavour, batched=True):
        """The Ex call's argument types; `batched` False: the single-product form (no strides, no batch)."""
        i, i64, p = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
        head = [p, i, i, i, i, i, p]                  # handle, opA, opB, m, n, k, alpha
        operand = [p, i, i, i64] if batched else [p, i, i]   # pointer, type, leading dimension[, stride]
        batch = [i] if batched else []
        if flavour == "rocblas":                      # ..., beta, C, D, [batch,] compute, algo, solution, flags
            return head + operand + operand + [p] + operand + operand + batch + [i, i, ctypes.c_int32, ctypes.c_uint32]
        return head + operand + operand + [p] + operand + batch + [i, i]   # ..., beta, C, [batch,] compute, algo

    def supports_dtype(self, dtype: str) -> bool:
        """Whether matmul in this dtype (a Call.dtype name) runs in this library."""
        return dtype == "float32" or (self._gemm_ex is not None and dtype in self._ex_types)

    def _check(self, status: int, what: str):
        if status != 0:
            kind = "oom" if (self.flavour == "cublas" and status == 3) else "launch"
            raise GpuError(kind, f"{self.flavour} {what} returned status {status}", name=f"{self.flavour}_status_{status}")

    def sgemm_rowmajor(self, a, b, c, M, N, K, batch=1, stride_a=0, stride_b=0, stride_c=0, stream=0):
        """Row-major C (M, N) = A (M, K) @ B (K, N) for `batch` matrices at the given element strides
        (0 broadcasts that operand); device pointers or objects with .ptr."""
        if max(M, N, K, batch) >= 2**31:
            raise GpuError("unsupported", f"{self.flavour}: {batch}x{M}x{N}x{K} exceeds 32-bit BLAS dimensions")
        pa, pb, pc = (ctypes.c_void_p(int(getattr(x, "ptr", x))) for x in (a, b, c))
        with self._lock:
            self._check(self._set_stream(self._handle, ctypes.c_void_p(int(stream or 0))), "set_stream")
            # column-major C^T (N x M) = B^T (N x K) @ A^T (K x M)
            self._check(self._gemm(self._handle, self._op_n, self._op_n, N, M, K, ctypes.byref(self._alpha),
                                   pb, N, stride_b, pa, K, stride_a, ctypes.byref(self._beta), pc, N,
                                   stride_c or M * N, batch), "sgemm_strided_batched")

    def gemm_ex_rowmajor(self, a, b, c, M, N, K, batch, stride_a, stride_b, stride_c, stream, dtype: str):
        """sgemm_rowmajor for float16/bfloat16 A, B and C, float32 accumulation (supports_dtype first)."""
        if not self.supports_dtype(dtype) or dtype == "float32":
            raise GpuError("unsupported", f"{self.flavour}: no mixed-precision GEMM for {dtype}")
        if max(M, N, K, batch) >= 2**31:
            raise GpuError("unsupported", f"{self.flavour}: {batch}x{M}x{N}x{K} exceeds 32-bit BLAS dimensions")
        t = self._ex_types[dtype]
        pa, pb, pc = (ctypes.c_void_p(int(getattr(x, "ptr", x))) for x in (a, b, c))
        if batch == 1 and self._gemm_ex1 is not None:   # one product: the plain Ex call, as PyTorch's gemm
            fn, what = self._gemm_ex1, "gemm_ex"
            args = [self._handle, self._op_n, self._op_n, N, M, K, ctypes.byref(self._alpha),
                    pb, t, N, pa, t, K, ctypes.byref(self._beta), pc, t, N]
            if self.flavour == "rocblas":   # D = C in place
                args += [pc, t, N, self._ex_compute, self._ex_algo, 0, 0]
            else:
                args += [self._ex_compute, self._ex_algo]
        else:
            fn, what = self._gemm_ex, "gemm_strided_batched_ex"
            sc = stride_c or M * N
            args = [self._handle, self._op_n, self._op_n, N, M, K, ctypes.byref(self._alpha),
                    pb, t, N, stride_b, pa, t, K, stride_a, ctypes.byref(self._beta), pc, t, N, sc]
            if self.flavour == "rocblas":   # D = C in place
                args += [pc, t, N, sc, batch, self._ex_compute, self._ex_algo, 0, 0]
            else:
                args += [batch, self._ex_compute, self._ex_algo]
        with self._lock:
            self._check(self._set_stream(self._handle, ctypes.c_void_p(int(stream or 0))), "set_stream")
            # column-major C^T (N x M) = B^T (N x K) @ A^T (K x M), as sgemm_rowmajor
            self._check(fn(*args), what)

    def close(self):
        if self._handle:
            try:
                self._destroy(self._handle)
            except Exception:
                pass
            self._handle = ctypes.c_void_p()


def load_blas(platform: str, flavours=None, driver_version: int | None = None) -> Blas | None:
    """The first vendor BLAS for `platform` ("amd" | "nvidia") that opens and creates a handle, or None
    (last_reasons() then says why). `driver_version` (cuDriverGetVersion) skips a cuBLAS of a newer
    CUDA major than the driver. Call with the runtime's device current (the handle binds to it)."""
    reasons = []
    _last_reasons[:] = reasons
    if os.environ.get("HIPSCHED_BLAS", "").lower() == "none":
        _last_reasons[:] = ["HIPSCHED_BLAS=none"]
        return None
    override = os.environ.get("HIPSCHED_BLAS_LIBRARY")
    for flavour in flavours or [f for f, spec in FLAVOURS.items() if spec[0] == platform]:
        plat, names = FLAVOURS[flavour][:2]
        for path in ([override] if override else _candidate_files(names, plat)):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            if flavour == "cublas" and driver_version:
                major = _cuda_major(lib)
                if major is not None and major > driver_version // 1000:
                    reasons.append(f"{path}: cuBLAS {major}.x needs a CUDA {major} driver, this one is "
                                   f"{driver_version // 1000}.{driver_version % 1000 // 10}")
                    continue
            try:
                return Blas(flavour, lib, path)
            except (AttributeError, GpuError) as e:
                # unusable here (wrong flavour, no device, a driver too old for it): the next file may do
                reasons.append(f"{path}: {type(e).__name__}: {e}")
    _last_reasons[:] = reasons
    return None
