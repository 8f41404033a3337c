"""The numbers the kernels and their launch glue share have one source, hipsched/gpu/compilation/kernel_constants.py:
no kernel file defines them, every kernel source sees the module's values (the preprocessor's own reading,
per vendor and target), the real compilers see them too, the prelude's matrix-core targets are the ones
common.has_mma names, and the glue launches from the module's names rather than copies of their values."""
import ast
import inspect
import re
import shutil
import subprocess

import numpy as np
import pytest

from hipsched.errors import GpuError
from hipsched.gguf_blocks import BLOCK_BYTES, QK
from hipsched.gpu.compilation import kernel_constants as kc
from hipsched.gpu.compilation.kernels import PRELUDE, _source_dir, kernel_sources, prelude
from hipsched.gpu.glue import attention, common, elementwise, graph, linalg, norm, quant, similarity

from real_compilers import compiler_or_skip
from requires import missing_tool

DECLARED = set(kc.MACROS) | set(kc.PRELUDE_MACROS)
GLUE = (attention, common, elementwise, graph, linalg, norm, quant, similarity)
# what a compiler for each target predefines that prelude.h and the generated defines test
TARGET_MACROS = {
    "sm_75": ["-D__CUDA_ARCH__=750"], "sm_80": ["-D__CUDA_ARCH__=800"], "sm_90": ["-D__CUDA_ARCH__=900"],
    **{arch: ["-D__HIPCC_RTC__=1", f"-D__{arch}__=1", f"-D__AMDGCN_WAVEFRONT_SIZE={64 if arch.startswith('gfx9') else 32}"]
       for arch in ("gfx906", "gfx908", "gfx90a", "gfx940", "gfx942", "gfx1030", "gfx1100")},
}


def _kernel_files():
    root = _source_dir()
    return {p.name: p.read_text() for p in root.iterdir() if p.name.endswith(".hip") or p.name == PRELUDE}


def test_no_kernel_file_defines_a_declared_constant():
    """A .hip file or prelude.h that spelled one out again would hold a copy the module no longer changes
    (a redefinition to the same value compiles silently; to another, the kernel's copy wins)."""
    files = _kernel_files()
    assert PRELUDE in files and len(files) > 1
    found = sorted((name, macro) for name, text in files.items()
                   for macro in re.findall(r"^[ \t]*#[ \t]*(?:define|undef)[ \t]+(\w+)", text, re.M)
                   if macro in DECLARED)
    assert found == []


def _macros(text: str, flags) -> dict[str, str]:
    """{name: definition after the name} of every macro defined at the end of `text`, as g++'s
    preprocessor reads it (a function-like one keeps its parameter list)."""
    if shutil.which("g++") is None:
        missing_tool("g++ (the preprocessor that reads the kernel sources here)", "apt-get install g++")
    r = subprocess.run(["g++", "-E", "-dM", "-x", "c++", *flags, "-"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return dict(re.findall(r"^#define (\w+)(.*)$", r.stdout, re.M))


def _expected(name, vendor: str) -> str:
    """The module's value of `name` as the text after a `#define NAME` that means it."""
    value = getattr(kc, name)
    if isinstance(value, kc.PerVendor):
        value = getattr(value, vendor)

    def number(v):
        return f"{float(v)!r}f" if isinstance(v, float) else str(v)
    if isinstance(value, dict):
        return f"(Q8) ((Q8) ? {number(value['q8_0'])} : {number(value['q4_0'])})"
    return f" {number(value)}"


@pytest.mark.parametrize("arch", ["sm_90", "gfx90a"])
def test_every_kernel_source_sees_the_modules_values(arch):
    vendor = "nvidia" if arch.startswith("sm_") else "amd"
    for name, text in kernel_sources().items():
        seen = _macros(text, TARGET_MACROS[arch])
        wrong = {m: seen.get(m) for m in kc.MACROS if seen.get(m) != _expected(m, vendor)}
        assert wrong == {}, f"{name} for {arch}: {wrong}"


@pytest.mark.parametrize("arch", sorted(TARGET_MACROS))
def test_the_preludes_matrix_core_targets_are_has_mmas(arch):
    """prelude.h defines HS_MMA_M16N8K16 / HS_MFMA_16X16X16 (the `_mma_` kernels) from the module's
    MMA_MIN_SM and MFMA_TARGETS, for exactly the targets the glue's has_mma launches them on."""
    seen = _macros(prelude(), TARGET_MACROS[arch])
    assert ("HS_MMA_M16N8K16" in seen or "HS_MFMA_16X16X16" in seen) == common.has_mma(arch)
    assert "HS_MM16" in seen if common.has_mma(arch) else "HS_MM16" not in seen


def _asserts(vendor: str, wrong: str | None = None) -> str:
    """static_asserts of every declared integer and float constant's value (`wrong`'s off by one)."""
    lines = []
    for name in kc.MACROS:
        value = getattr(kc, name)
        if isinstance(value, kc.PerVendor):
            value = getattr(value, vendor)
        pairs = ([(f"{name}(1)", value["q8_0"]), (f"{name}(0)", value["q4_0"])] if isinstance(value, dict)
                 else [(name, value)])
        for expr, v in pairs:
            v = v + 1 if name == wrong else v
            lines.append(f'static_assert({expr} == {float(v)!r}f, "{name}");' if isinstance(v, float)
                         else f'static_assert({expr} == {v}, "{name}");')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("arch", ["sm_90", "gfx90a"])
def test_the_real_compilers_see_the_modules_values(arch):
    """The defines reach NVRTC and hiprtc: a probe after the prelude, as every .hip is, asserts each value
    at compile time and compiles; the same probe with one value off does not."""
    compiler = compiler_or_skip(arch)
    vendor = "nvidia" if arch.startswith("sm_") else "amd"
    matrix = "HS_MMA_M16N8K16" if vendor == "nvidia" else "HS_MFMA_16X16X16"
    probe = (f"#if !defined({matrix})\n#error no matrix-core kernels for {arch}\n#endif\n"
             'HS_KERNEL void hs_constants_probe(int* x) { x[0] = HSQ_NR; }\n')
    head = prelude() + '#line 1 "constants_probe.hip"\n'
    assert compiler.compile(head + _asserts(vendor) + probe, "constants_probe.hip", arch, ())[:4] == b"\x7fELF"
    with pytest.raises(GpuError) as info:
        compiler.compile(head + _asserts(vendor, wrong="HSQ_NR") + probe, "constants_probe.hip", arch, ())
    assert info.value.kind == "compile" and "HSQ_NR" in str(info.value)


# ---- the glue reads the module's names, not copies of their values

def _glue_constants(module) -> list[str]:
    """The names `module` imports from kernel_constants."""
    tree = ast.parse(inspect.getsource(module))
    return sorted(a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                  and (node.module or "").endswith("compilation.kernel_constants") for a in node.names)


class _Recorder:
    """A GpuContext's part that the cosine glue's loop over the queries uses, writing down each launch's
    kernel and q0 (it stands for the device arrays too: an aligned pointer)."""
    warp_size, multiprocessors, ptr = 32, 132, 256

    def __init__(self):
        self.runs = []

    def scratch(self, *args):
        return self

    def run(self, launch, args, stream):
        self.runs.append((launch.kernel, args[-1].value))


def _probe(module):
    """What the glue makes of its constants: every launch it reports (both warp widths and vendors), and
    for the quant layout and the target test, their own results; an exception counts as a result."""
    for fn in vars(module).values():
        if hasattr(fn, "cache_clear") and getattr(fn, "__module__", None) == module.__name__:
            fn.cache_clear()   # pure_plan keeps plans: a changed constant must be planned anew

    def outcome(fn):
        try:
            return fn()
        except Exception as e:   # a geometry the other code no longer fits is a difference too
            return type(e).__name__
    found = []
    report = getattr(module, "report_launches", None)
    for warp, arch in ((32, "sm_90"), (64, "gfx90a")):
        if report is not None:
            extra = {"arch": arch} if "arch" in inspect.signature(report).parameters else {}
            found.append(outcome(lambda: report(warp, 132, **extra)))
        found.append(outcome(lambda: common.has_mma(arch)))
    if module is quant:   # its report's shapes leave most column counts out
        found += [outcome(lambda: quant.qmatmul_launches(1000, m, qt, 32, "f16", True))
                  for qt in BLOCK_BYTES for m in (2, 9, 16, 17, 100, 300)]
    if module is similarity:   # the scoring kernel's launches per group of queries
        rec = _Recorder()
        found.append(outcome(lambda: similarity._cosine_scores(rec, rec, rec, 20, 100, 64, None, rec) and rec.runs))
    if module is quant:
        rng = np.random.default_rng(0)
        for qtype in BLOCK_BYTES:
            blocks = rng.integers(0, 256, (3, 40 * BLOCK_BYTES[qtype]), dtype=np.uint8)
            found.append(outcome(lambda: quant.device_layout(blocks, qtype).tobytes()))
            found.append(outcome(lambda: quant.host_layout(quant.device_layout(blocks, qtype), 3, 40 * QK, qtype)
                                 .tobytes()))
    return found


def _changes(value):
    """Other values of a constant, one up and one down (a threshold shows its change on one side only)."""
    if isinstance(value, kc.PerVendor):
        return [kc.PerVendor(value.nvidia * 2, value.amd * 2), kc.PerVendor(value.nvidia // 2, value.amd // 2)]
    if isinstance(value, dict):
        return [{k: v * 2 for k, v in value.items()}, {k: v // 2 for k, v in value.items()}]
    if isinstance(value, tuple):
        return [(), value[:1]]
    return [value * 2, value // 2]


@pytest.mark.parametrize("module, name", [(m, n) for m in GLUE for n in _glue_constants(m)],
                         ids=lambda v: v if isinstance(v, str) else v.__name__.rsplit(".", 1)[-1])
def test_the_glue_follows_each_constant_it_imports(module, name, monkeypatch):
    """Changing a constant where the glue holds it changes what the glue launches (or lays out): a use
    that went back to a literal copy would not follow the module, which the kernels do."""
    assert name in DECLARED or name in ("MMA_MIN_SM", "MFMA_TARGETS")
    before = _probe(module)
    after = []
    for value in _changes(getattr(module, name)):
        monkeypatch.setattr(module, name, value)
        after.append(_probe(module))
    monkeypatch.undo()
    _probe(module)   # no plan made with a changed value outlives the test
    assert any(a != before for a in after), f"{module.__name__} imports {name} but launches the same without it"


def test_every_glue_module_takes_its_geometry_from_the_module():
    """The glue modules whose kernels read a declared constant import it (the rule above then holds
    them to it): each .hip's glue names at least one."""
    users = {m.__name__.rsplit(".", 1)[-1] for m in GLUE if _glue_constants(m)}
    assert {"attention", "common", "elementwise", "graph", "linalg", "quant", "similarity"} <= users
