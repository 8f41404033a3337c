"""The instruction check: what the machine code of the hot kernels does, read from the disassembly of the
real compilers' output for the H100 (sm_90, NVRTC, `cuobjdump -sass`) and MI200 (gfx90a, hiprtc,
`llvm-objdump`; the half attention and qmatmul tile kernels for MI100, gfx908, too). Without a GPU in CI
this is the evidence the kernels are built for the hardware's speed (docs/design/kernel-report.md,
"Instruction check and roofline"): matrix-core instructions (HMMA, v_mfma) in the half-precision attention and qmatmul tile kernels, 128-bit global loads in the
bandwidth kernels, no local memory (spills) in any kernel. The parser itself is checked on fixed
disassembly text, so a change of the tools' format cannot turn the check vacuous."""
import re

import pytest

from hipsched.gpu.compilation.disassembly import _amd_facts, _sass_facts, disassembler, instruction_facts
from hipsched.gpu.compilation.kernels import KernelCache, kernel_sources

from real_compilers import cache_dir, compiler_or_skip  # noqa: F401 (cache_dir is a fixture)
from requires import missing_tool

SOURCES = sorted(kernel_sources())

# Kernels on tensor / matrix cores are named with _mma_ (src_c/hip/attention.hip, quant.hip).
MATRIX = re.compile(r"_mma_")
# Bandwidth-bound kernels whose element loads and stores are 128 bits wide: they must contain 128-bit
# global loads and stores. Narrower ones may stand beside them (the tail past the last 16-byte pack,
# a bias of another length, cosine's rescoring of an extreme-norm pair in double).
_T = "(f32|f16|bf16)"
WIDE = [
    rf"hs_(add|add_bias|scale)_{_T}_v8",
    rf"hs_softmax_regs_{_T}_p[124]",
    rf"hs_softmax_rows_{_T}_v8",
    rf"hs_rms_norm_regs_{_T}_p[124]",
    r"hs_dequantize_q(8|4)_0",
]
# ... and those that load 128 bits at a time but write little (a score or an output per row): loads only.
WIDE_LOADS = [
    r"hs_cosine_f32_q\d+_v4",
    rf"hs_qmatvecn?_{_T}_q(8|4)_0",     # the weights in their 16-byte device layout (a half x: 64-bit loads)
    r"hs_attention_decode_((f16|bf16)_)?d(32|64|128|256)",   # K and V of the cache, 16 bytes a lane and key
]
# Kernels allowed to use local memory, each with the reason: none. (Until issue 34 the four SIMT qmatmat
# kernels with a half x kept one 4-byte value on the stack on sm_90 at 80 registers; their X loader now
# steps one pointer and they take 48-57 registers, no local memory.)
LOCAL_ALLOWED: dict[str, str] = {}


def _facts(arch, source, cache_dir):
    compiler = compiler_or_skip(arch)
    tool = disassembler(compiler.platform)
    if tool is None:
        if compiler.platform == "nvidia":
            pytest.fail("cuobjdump not found: the test extra installs nvidia-cuda-cuobjdump and "
                        "nvidia-cuda-nvdisasm (pip install -e '.[test]')", pytrace=False)
        missing_tool("llvm-objdump", "Debian: apt-get install llvm")
    code = KernelCache(compiler, cache_dir).code_object(source, arch)
    facts = instruction_facts(code, compiler.platform, arch)
    assert facts, f"{tool} read no kernels from {source} for {arch}"
    return facts


@pytest.mark.parametrize("arch", ["sm_90", "gfx90a"])
@pytest.mark.parametrize("source", SOURCES)
def test_hot_kernels_use_the_hardware(source, arch, cache_dir):
    facts = _facts(arch, source, cache_dir)
    problems = []
    for kernel, f in sorted(facts.items()):
        if MATRIX.search(kernel) and f.matrix == 0:
            problems.append(f"{kernel}: no matrix-core instruction (HMMA / v_mfma)")
        if any(re.fullmatch(p, kernel) for p in WIDE + WIDE_LOADS) and f.global_loads_128 == 0:
            problems.append(f"{kernel}: none of its {f.global_loads} global loads is 128-bit")
        if any(re.fullmatch(p, kernel) for p in WIDE) and f.global_stores_128 == 0:
            problems.append(f"{kernel}: none of its {f.global_stores} global stores is 128-bit")
        if f.local and kernel not in LOCAL_ALLOWED:
            problems.append(f"{kernel}: {f.local} local-memory instructions (a spill or a stack array)")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("arch", ["sm_90", "gfx90a", "gfx908"])
@pytest.mark.parametrize("family", ["attention", "quant"])
def test_the_glues_matrix_kernels_are_built_and_use_matrix_cores(family, arch, cache_dir):
    """Every half attention and qmatmul kernel the glue picks on a target with matrix cores is in that
    target's code object and contains HMMA / v_mfma (gfx908 too: its bfloat16 product is another
    instruction). The rule above checks only the kernels it finds: a prelude condition that left them out
    of a target's build would leave it nothing to check, and the glue launching a kernel that is not there."""
    from hipsched.gpu.compilation.targets import TARGETS
    from hipsched.gpu.glue import attention, quant
    module = {"attention": attention, "quant": quant}[family]
    facts = _facts(arch, f"{family}.hip", cache_dir)
    planned = {launch.kernel for launch in module.report_launches(TARGETS[arch].wavefront, 1, arch=arch)
               if MATRIX.search(launch.kernel)}
    assert planned == ({f"hs_attention_{t}_mma_d{d}" for t in ("f16", "bf16") for d in attention.MMA_CLASSES[TARGETS[arch].wavefront]}
                       if family == "attention" else
                       {f"hs_qmatmat_{t}_mma_{q}" for t in ("f16", "bf16") for q in ("q8_0", "q4_0")})
    for kernel in sorted(planned):
        assert kernel in facts, f"{kernel} is not built for {arch}"
        assert facts[kernel].matrix > 0, f"{kernel}: no matrix-core instruction on {arch}"


def test_every_rule_names_a_kernel(cache_dir):
    """A renamed kernel must not leave a rule matching nothing (that rule would pass forever)."""
    compiler = compiler_or_skip("sm_90")
    if disassembler("nvidia") is None:
        pytest.fail("cuobjdump not found (the test extra installs it)", pytrace=False)
    names = set()
    for source in SOURCES:
        names |= set(instruction_facts(KernelCache(compiler, cache_dir).code_object(source, "sm_90"),
                                       "nvidia", "sm_90"))
    for pattern in WIDE + WIDE_LOADS:
        assert any(re.fullmatch(pattern, n) for n in names), f"the rule {pattern!r} matches no kernel"
    for name in LOCAL_ALLOWED:
        assert name in names, f"LOCAL_ALLOWED names {name!r}, which no source defines"


SASS = """
        code for sm_90
                Function : hs_demo_mma_d64
        .headerflags    @"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                 /* 0x00000a00ff017b82 */
        /*0010*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;              /* 0x0000000402047981 */
        /*0020*/              @!P0 LDG.E.U16.CONSTANT R8, desc[UR4][R2.64+0x10] ;         /* 0x0000100402088981 */
        /*0030*/                   LDGSTS.E.BYPASS.LTC128B.128 [R9], desc[UR4][R2.64] ;   /* 0x0000000002097fae */
        /*0040*/                   HMMA.16816.F32 R12, R4, R6, R12 ;                      /* 0x000000060c0c723c */
        /*0050*/                   STL.64 [R1], R12 ;                                     /* 0x0000000c01007387 */
        /*0060*/                   LDL.64 R12, [R1] ;                                     /* 0x0000000001107983 */
        /*0070*/                   STG.E.128 desc[UR4][R2.64], R12 ;                      /* 0x0000000c02007986 */
        /*0080*/                   EXIT ;                                                 /* 0x000000000000794d */
                ..........
                Function : hs_demo_plain
        /*0000*/                   STG.E desc[UR4][R2.64], R0 ;                           /* 0x0000000002007986 */
"""

AMD = """
/tmp/code.hsaco:	file format elf64-amdgpu

Disassembly of section .text:

0000000000001000 <hs_demo_mma_d64>:
	global_load_dwordx4 v[0:3], v[4:5], off                    // 000000001000: DC5C8000 00000004
	global_load_ushort v6, v[4:5], off offset:16               // 000000001008: DC488010 067F0004
	v_mfma_f32_16x16x16f16 a[0:3], v[0:1], v[2:3], a[0:3]      // 000000001010: D3CD8000 04020500
	buffer_store_dword v1, off, s[0:3], 0 offset:4             // 000000001018: E0700004 80000100
	scratch_load_dword v1, off, s0                             // 000000001020: DC514000 017D0000
	global_store_dwordx4 v[4:5], v[0:3], off                   // 000000001028: DC7C8000 007F0004
	s_endpgm                                                   // 000000001030: BF810000
0000000000001100 <hs_demo_plain>:
	global_store_dword v[4:5], v0, off                         // 000000001100: DC708000 007F0004
"""


@pytest.mark.parametrize("parse,text", [(_sass_facts, SASS), (_amd_facts, AMD)], ids=["sass", "amdgcn"])
def test_parser_counts_each_kind(parse, text):
    facts = parse(text)
    assert set(facts) == {"hs_demo_mma_d64", "hs_demo_plain"}
    f = facts["hs_demo_mma_d64"]
    assert (f.matrix, f.local, f.global_stores, f.global_stores_128) == (1, 2, 1, 1)
    assert f.global_loads_128 == (2 if parse is _sass_facts else 1)   # LDGSTS .128 is a 128-bit read
    assert f.global_loads == f.global_loads_128 + 1
    p = facts["hs_demo_plain"]
    assert (p.instructions, p.global_stores, p.global_stores_128, p.matrix) == (1, 1, 0, 0)
