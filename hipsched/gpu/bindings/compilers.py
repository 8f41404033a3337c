"""Runtime compilers: hiprtc (AMD code objects) and NVRTC (NVIDIA CUBIN/PTX), with no device needed.

Both have the same C API shape (create program, compile with options, log, code, destroy) under
different prefixes, so one class drives either through a small symbol table, as CuPy's
_softlink does. ROCm 5.x hiprtc aborts the whole process (not an error code) for targets it does
not know -- gfx11xx, gfx94x, misspelled names, or a feature flag the target lacks (gfx1030:xnack-):
targets are therefore checked against an allow-list measured for that compiler version, and for a
compiler version with no list the target is tried once in a child process before this process ever
hands it to hiprtc."""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading

from ...errors import GpuError
from . import libs
from .runtime import Compiler

# ROCm 5.x (libamdhip64.so.5) hiprtc: base targets it compiles, and the target features each
# accepts. Measured on libamdhip64.so.5.2.21153 by compiling a kernel for every combination in a
# child process; anything else aborted the process.
_HIPRTC_ROCM5_TARGETS = {
    **{t: () for t in ("gfx700", "gfx701", "gfx802", "gfx803",
                       "gfx805", "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036")},
    **{t: ("xnack",) for t in ("gfx801", "gfx810", "gfx900", "gfx902", "gfx904", "gfx909", "gfx90c",
                               "gfx1010", "gfx1011", "gfx1012", "gfx1013")},
    **{t: ("sramecc", "xnack") for t in ("gfx906", "gfx908", "gfx90a")},
}

_TARGET_RE = re.compile(r"^(gfx[0-9a-f]+)((?::[a-z]+[+-])*)$")
_SM_RE = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def split_amd_target(arch: str) -> tuple[str, dict[str, str]]:
    """"gfx90a:sramecc+:xnack-" -> ("gfx90a", {"sramecc": "+", "xnack": "-"}); GpuError if malformed."""
    m = _TARGET_RE.match(arch or "")
    if not m:
        raise GpuError("unsupported", f"not an AMD target id: {arch!r} (expected e.g. gfx90a or gfx90a:xnack-)")
    feats = {}
    for part in filter(None, m.group(2).split(":")):
        feats[part[:-1]] = part[-1]
    return m.group(1), feats


def canonical_amd_target(arch: str) -> str:
    """Target id with features in LLVM's canonical (alphabetical) order."""
    base, feats = split_amd_target(arch)
    return base + "".join(f":{k}{v}" for k, v in sorted(feats.items()))


def platform_of(arch: str) -> str:
    """"amd" for gfx targets, "nvidia" for sm_/compute_ targets; GpuError otherwise."""
    if (arch or "").startswith("gfx"):
        return "amd"
    if _SM_RE.match(arch or ""):
        return "nvidia"
    raise GpuError("unsupported", f"unknown GPU target {arch!r} (expected gfxNNN[:feature±] or sm_NN)")


class _RtcCompiler(Compiler):
    """hiprtc or NVRTC through ctypes. Subclasses give the library kind and the symbol table."""

    library_kind: str
    prefix: str                  # "hiprtc" | "nvrtc"
    default_options: tuple[str, ...] = ()

    def __init__(self, opened=None):
        """`opened`: (handle, path) of a library already open (one of several NVRTCs found)."""
        self._lib, self.library_path = opened or libs.open_library(self.library_kind)  # LibraryNotFound if absent
        self._lock = threading.Lock()
        self._version = None
        sym = self._sym
        sym("GetErrorString").restype = ctypes.c_char_p
        sym("GetErrorString").argtypes = [ctypes.c_int]
        sym("CreateProgram").argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        sym("CompileProgram").argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        sym("DestroyProgram").argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        for name in ("GetProgramLogSize",) + self._code_symbols(False)[:1] + self._code_symbols(True)[:1]:
            sym(name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        for name in ("GetProgramLog",) + self._code_symbols(False)[1:] + self._code_symbols(True)[1:]:
            sym(name).argtypes = [ctypes.c_void_p, ctypes.c_char_p]

    def _sym(self, name):
        return getattr(self._lib, self.prefix + name)

    def _check(self, status: int, what: str):
        if status != 0:
            err = self._sym("GetErrorString")(status)
            name = err.decode(errors="replace") if err else f"{self.prefix} error {status}"
            raise GpuError("compile", f"{self.prefix}{what} failed: {name} ({status})", name=name)

    def version_tuple(self) -> tuple[int, int]:
        """(major, minor) as the library reports it (nvrtcVersion / hiprtcVersion)."""
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._sym("Version")(ctypes.byref(major), ctypes.byref(minor)), "Version")
        return major.value, minor.value

    def version(self) -> str:
        if self._version is None:
            major, minor = self.version_tuple()
            # The library file name carries the release (libamdhip64.so.5.2.21153) where the
            # reported version does not (ROCm 5.2 hiprtc says 9.0).
            self._version = f"{self.prefix} {major}.{minor} {os.path.basename(self.library_path)}"
        return self._version

    def _code_symbols(self, ptx: bool) -> tuple[str, str]:
        raise NotImplementedError

    def _target_option(self, arch: str) -> str:
        return f"--gpu-architecture={arch}"

    def compile(self, source: str, name: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
        return self.compile_with_log(source, name, arch, options)[0]

    def compile_with_log(self, source: str, name: str, arch: str, options: tuple[str, ...] = ()) -> tuple[bytes, str]:
        """`compile`, with the compiler's log of a successful compile too (warnings; with NVRTC's
        --ptxas-options=-v, ptxas's registers, shared memory and spills per kernel)."""
        if not self.supports(arch):
            raise GpuError("compile", f"{self.version()} cannot compile for {arch!r}: {self.why_unsupported(arch)}",
                           name="unsupported-target")
        arch = self.normalise_arch(arch)
        opts = [self._target_option(arch), *self.default_options, *options]
        c_opts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        prog = ctypes.c_void_p()
        with self._lock:  # ROCm 5.x hiprtc is not documented as thread safe; compiles are rare
            self._check(self._sym("CreateProgram")(ctypes.byref(prog), source.encode(), name.encode(), 0, None,
                                                   None), "CreateProgram")
            try:
                status = self._sym("CompileProgram")(prog, len(opts), c_opts)
                log = self._log(prog)
                if status != 0:
                    err = self._sym("GetErrorString")(status)
                    err_name = err.decode(errors="replace") if err else str(status)
                    raise GpuError("compile", f"{self.prefix} failed to compile {name} for {arch} ({err_name}):\n"
                                   f"{log.strip()}", name=err_name)
                size_fn, get_fn = self._code_symbols(arch.startswith("compute_"))
                n = ctypes.c_size_t()
                self._check(self._sym(size_fn)(prog, ctypes.byref(n)), size_fn)
                buf = ctypes.create_string_buffer(n.value)
                self._check(self._sym(get_fn)(prog, buf), get_fn)
                code = buf.raw[:n.value]
            finally:
                self._sym("DestroyProgram")(ctypes.byref(prog))
        if not code:
            raise GpuError("compile", f"{self.prefix} produced an empty code object for {name} ({arch})")
        return code, log

    def _log(self, prog) -> str:
        n = ctypes.c_size_t()
        if self._sym("GetProgramLogSize")(prog, ctypes.byref(n)) != 0 or n.value <= 1:
            return ""
        buf = ctypes.create_string_buffer(n.value)
        self._sym("GetProgramLog")(prog, buf)
        return buf.value.decode(errors="replace")

    def normalise_arch(self, arch: str) -> str:
        return arch

    def why_unsupported(self, arch: str) -> str:
        return "target not supported"


class HiprtcCompiler(_RtcCompiler):
    """HIP source -> AMD code object (HSACO) for a gfx target id."""

    name = "hiprtc"
    platform = "amd"
    library_kind = "hiprtc"
    prefix = "hiprtc"
    default_options = ("-O3",)

    def __init__(self):
        super().__init__()
        self._probed: dict[str, bool] = {}

    def _code_symbols(self, ptx):
        return ("GetCodeSize", "GetCode")

    def normalise_arch(self, arch):
        return canonical_amd_target(arch)

    def _allow_list(self):
        # Only ROCm 5.2 was measured (a bare .so.5 of unknown minor gets the same, conservative list);
        # other releases know other targets (5.7 adds gfx11xx), so they are probed per target instead.
        name = os.path.basename(self.library_path)
        return _HIPRTC_ROCM5_TARGETS if re.search(r"\.so\.5(\.2\.|$)", name) else None

    def why_unsupported(self, arch):
        try:
            base, feats = split_amd_target(arch)
        except GpuError as e:
            return str(e)
        allowed = self._allow_list()
        if allowed is None:
            return "a trial compile in a child process failed (this hiprtc would abort on it)"
        if base not in allowed:
            return (f"{base} is not a target this hiprtc knows (it would abort the process); known: "
                    f"{', '.join(sorted(allowed, key=lambda t: (len(t), t)))}")
        bad = sorted(set(feats) - set(allowed[base]))
        return f"{base} has no target feature {', '.join(bad)} (allowed: {', '.join(allowed[base]) or 'none'})"

    def supports(self, arch: str) -> bool:
        try:
            base, feats = split_amd_target(arch)
        except GpuError:
            return False
        allowed = self._allow_list()
        if allowed is not None:
            return base in allowed and set(feats) <= set(allowed[base])
        arch = canonical_amd_target(arch)
        if arch not in self._probed:
            self._probed[arch] = _probe_in_child(arch)
        return self._probed[arch]


class NvrtcCompiler(_RtcCompiler):
    """The same HIP source (through src_c/hip/prelude.h) -> CUBIN for sm_NN, or PTX for compute_NN."""

    name = "nvrtc"
    platform = "nvidia"
    library_kind = "nvrtc"
    prefix = "nvrtc"
    # NVRTC rejects -O3 (it optimises by default); the prelude needs C++17.
    default_options = ("--std=c++17",)

    def _code_symbols(self, ptx):
        return ("GetPTXSize", "GetPTX") if ptx else ("GetCUBINSize", "GetCUBIN")

    def supported_archs(self) -> list[int]:
        n = ctypes.c_int()
        if self._sym("GetNumSupportedArchs")(ctypes.byref(n)) != 0:
            return []
        arr = (ctypes.c_int * n.value)()
        self._sym("GetSupportedArchs")(arr)
        return list(arr)

    def supports(self, arch: str) -> bool:
        m = _SM_RE.match(arch or "")
        return bool(m) and int(m.group(2)) in self.supported_archs()

    def why_unsupported(self, arch):
        return f"this NVRTC supports sm_/compute_ {', '.join(map(str, self.supported_archs()))}"

    def target_for(self, arch: str, driver_version: int | None) -> str:
        """What to compile for device `arch` so that a driver of `driver_version` (cuDriverGetVersion:
        12040 is CUDA 12.4) loads it: `sm_NN` (a CUBIN) or `compute_MM` (PTX the driver JIT-compiles).
        Raises GpuError(kind="unavailable") saying why neither would load. None: driver unknown, CUBIN.

        - A CUBIN loads on a driver of its NVRTC's CUDA major or newer (minor version compatibility:
          NVRTC 12.9's CUBIN loads on a CUDA 12.2 driver), never on an older major: NVRTC 13 writes
          ELF ABI version 8, which CUDA 12 drivers (R525-R575) reject.
        - PTX loads when the driver knows its ISA version, i.e. the driver is at least as new as the
          NVRTC (PTX ISA 9.x needs CUDA 13.x). It runs on any newer GPU, so it also serves a device
          this NVRTC has no CUBIN target for."""
        m = _SM_RE.match(arch or "")
        if not m:
            raise GpuError("unsupported", f"not an NVIDIA target: {arch!r}")
        if not driver_version:
            return arch
        major, minor = self.version_tuple()
        driver = driver_version // 1000
        sm = int(m.group(2))
        if major <= driver and self.supports(f"sm_{sm}{m.group(3)}"):
            return f"sm_{sm}{m.group(3)}"
        isa = ptx_isa_of_nvrtc(major, minor)
        if cuda_version_for_ptx_isa(isa) <= driver_version:
            lower = [a for a in self.supported_archs() if a <= sm]
            if lower:
                return f"compute_{max(lower)}"
        raise GpuError("unavailable", self._driver_reason(arch, driver_version, (major, minor), isa),
                       name="driver-too-old" if major > driver else "unsupported-target")

    def _driver_reason(self, arch, driver_version, version, isa) -> str:
        major, minor = version
        drv = f"CUDA {_cuda_text(driver_version)} (cuDriverGetVersion {driver_version})"
        if major > driver_version // 1000:
            return (f"{self.version()} writes CUBINs that need a CUDA {major}.x driver (R{MIN_DRIVER.get(major, '?')}+) "
                    f"and PTX ISA {isa[0]}.{isa[1]}, which needs CUDA {_cuda_text(cuda_version_for_ptx_isa(isa))}; "
                    f"this driver is {drv}, so nothing it compiles for {arch} would load. Install an NVRTC of "
                    f"CUDA {driver_version // 1000}.x ({NVRTC_PACKAGE.get(driver_version // 1000, 'a CUDA toolkit')}), "
                    f"point HIPSCHED_NVRTC_LIBRARY at one, or update the driver")
        return (f"{self.version()} cannot compile for {arch} ({self.why_unsupported(arch)}), and its PTX "
                f"(ISA {isa[0]}.{isa[1]}) needs CUDA {_cuda_text(cuda_version_for_ptx_isa(isa))}; this driver is "
                f"{drv}")


# The oldest driver branch of each CUDA major (CUDA Compatibility guide, minor version compatibility).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
# Where an NVRTC of each CUDA major comes from on PyPI.
NVRTC_PACKAGE = {11: "pip install nvidia-cuda-nvrtc-cu11", 12: "pip install 'hipsched[nvrtc]', i.e. nvidia-cuda-nvrtc-cu12",
                 13: "pip install 'hipsched[nvrtc-cu13]', i.e. nvidia-cuda-nvrtc 13.x"}

# PTX ISA version -> the first CUDA release that loads it (PTX ISA release history). From ISA 7.0 on,
# ISA x.y belongs to CUDA (x+4).y, except where CUDA 12.6 kept 8.5.
_PTX_ISA_CUDA = {(7, 0): 11000, (7, 1): 11010, (7, 2): 11020, (7, 3): 11030, (7, 4): 11040, (7, 5): 11050,
                 (7, 6): 11060, (7, 7): 11070, (7, 8): 11080, (8, 0): 12000, (8, 1): 12010, (8, 2): 12020,
                 (8, 3): 12030, (8, 4): 12040, (8, 5): 12050, (8, 6): 12070, (8, 7): 12080, (8, 8): 12090,
                 (9, 0): 13000, (9, 1): 13010}


def cuda_version_for_ptx_isa(isa: tuple[int, int]) -> int:
    """The oldest driver (as cuDriverGetVersion reports it) that JIT-compiles PTX of ISA `isa`."""
    if isa in _PTX_ISA_CUDA:
        return _PTX_ISA_CUDA[isa]
    return (isa[0] + 4) * 1000 + isa[1] * 10


def ptx_isa_of_nvrtc(major: int, minor: int) -> tuple[int, int]:
    """The PTX ISA version NVRTC `major.minor` writes: the newest its CUDA release defines."""
    cuda = major * 1000 + minor * 10
    known = [isa for isa, v in _PTX_ISA_CUDA.items() if v <= cuda]
    if cuda > max(_PTX_ISA_CUDA.values()) or not known:
        return (major - 4, minor)
    return max(known)


def ptx_isa_of(ptx: bytes) -> tuple[int, int] | None:
    """The `.version X.Y` a PTX text declares, or None."""
    m = re.search(rb"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.M)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _cuda_text(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


_PROBE = """
import sys
from hipsched.gpu.bindings.compilers import HiprtcCompiler
c = HiprtcCompiler()
c.supports = lambda arch: True
c.compile('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }', "probe.hip", sys.argv[1])
"""


def _probe_in_child(arch: str) -> bool:
    """Compile a one-line kernel for `arch` in a child process: True if it neither failed nor aborted."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, arch], capture_output=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


_compilers: dict = {}
_compilers_lock = threading.Lock()


def nvrtc_candidates() -> list[NvrtcCompiler]:
    """One NvrtcCompiler per distinct NVRTC library found (HIPSCHED_NVRTC_LIBRARY: that one alone), in
    search order. Each is opened once per process."""
    with _compilers_lock:
        if "nvrtc-all" not in _compilers:
            found = []
            for opened in libs.open_all("nvrtc"):
                try:
                    c = NvrtcCompiler(opened)
                    c.version_tuple()
                except (AttributeError, GpuError):   # not an NVRTC after all, or one that cannot say its version
                    continue
                found.append(c)
            _compilers["nvrtc-all"] = found
        return list(_compilers["nvrtc-all"])


def select_nvrtc(candidates, driver_version: int | None):
    """The NVRTC to use with a driver of `driver_version` (None: no driver, e.g. ahead-of-time compiles):
    the newest whose CUDA major is not above the driver's, since its CUBINs load there; without a
    driver, or when every one found is newer than the driver, simply the newest (whose `target_for`
    then says why nothing it makes would load)."""
    if not candidates:
        return None
    ranked = sorted(candidates, key=lambda c: c.version_tuple(), reverse=True)
    if driver_version:
        loadable = [c for c in ranked if c.version_tuple()[0] <= driver_version // 1000]
        if loadable:
            return loadable[0]
    return ranked[0]


def get_compiler(target: str, driver_version: int | None = None) -> Compiler:
    """The compiler for a platform ("amd" | "nvidia") or a target (gfx90a, sm_90). Works with no GPU.
    For NVIDIA, `driver_version` (cuDriverGetVersion) picks among the NVRTCs found (select_nvrtc).
    Raises GpuError(kind="unavailable") naming the missing library."""
    platform = target if target in ("amd", "nvidia") else platform_of(target)
    if platform == "nvidia":
        chosen = select_nvrtc(nvrtc_candidates(), driver_version)
        if chosen is None:
            try:
                libs.open_library("nvrtc")
            except libs.LibraryNotFound as e:
                raise GpuError("unavailable", f"nvrtc not available: {e}", name="nvrtc-missing") from None
            raise GpuError("unavailable", "nvrtc not available: no library found reports an NVRTC version",
                           name="nvrtc-missing")
        return chosen
    with _compilers_lock:
        if platform not in _compilers:
            try:
                _compilers[platform] = HiprtcCompiler()
            except (libs.LibraryNotFound, AttributeError) as e:
                raise GpuError("unavailable", f"hiprtc not available: {e}", name="hiprtc-missing") from None
        return _compilers[platform]


def load_target(compiler, arch: str, driver_version: int | None) -> str:
    """What `compiler` must compile for a device of `arch` whose driver is `driver_version`: the arch
    itself, or the PTX target for an NVIDIA driver older than the CUBINs (NvrtcCompiler.target_for).
    Raises GpuError(kind="unavailable" | "compile") when nothing it makes would load."""
    plan = getattr(compiler, "target_for", None)
    if plan is not None:
        target = plan(arch, driver_version)
    else:
        target = arch
    if not compiler.supports(target):
        why = getattr(compiler, "why_unsupported", lambda a: f"{compiler.name} cannot target {a}")
        raise GpuError("unavailable", why(target), name="unsupported-target")
    return target
