"""What a kernel's machine code does, read from the disassembly of its code object: how many matrix-core
instructions (tensor cores), how many global loads and stores are 128 bits wide, how many instructions
touch thread-private (local/scratch) memory. Without a GPU these are the evidence that a kernel is built
for the hardware's speed: a half-precision attention kernel with no HMMA or v_mfma runs on SIMT cores, a
bandwidth kernel with 16- or 32-bit loads issues four to eight times the memory instructions a 128-bit one
does, and local memory in a hot loop is a spill to DRAM.

NVIDIA: `cuobjdump -sass` on the CUBIN (PyPI's nvidia-cuda-cuobjdump, the test extra, or a CUDA
toolkit's on PATH). AMD: LLVM's `llvm-objdump -d --mcpu=<gfx>` on the HSACO (Debian's llvm package, or
ROCm's own LLVM). Neither is needed to compile or run anything; `compile --report` says which it used
and prints no instruction columns when it has none."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass

from .codeobject import unbundle


@dataclass(frozen=True)
class InstructionFacts:
    instructions: int
    matrix: int              # HMMA / HGMMA / IMMA (NVIDIA), v_mfma / v_smfmac / v_wmma (AMD)
    global_loads: int        # instructions reading global memory (cp.async's LDGSTS included)
    global_loads_128: int    # ... of them 128 bits per lane
    global_stores: int
    global_stores_128: int
    local: int               # LDL/STL (NVIDIA), scratch_* and private-segment buffer_* (AMD): spills

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# ------------------------------------------------------------------------------------------ finding tools

def _cuobjdump() -> str | None:
    """cuobjdump (and beside it the nvdisasm it runs) from the nvidia-cuda-cuobjdump wheel (nvidia/cu13/bin or nvidia/cuda_cuobjdump/bin in
    site-packages: the wheel's layout changed between CUDA 12 and 13), else one on PATH."""
    site = sysconfig.get_paths()["purelib"]
    for pattern in ("nvidia/cu*/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump"):
        for path in sorted(glob.glob(os.path.join(site, pattern)), reverse=True):
            if os.access(path, os.X_OK):
                return path
    return shutil.which("cuobjdump")


def _llvm_objdump() -> str | None:
    """ROCm's LLVM first (it knows the newest gfx targets), then an llvm-objdump on PATH, then Debian's
    versioned ones, newest first."""
    rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
    candidates = [os.path.join(rocm, "llvm", "bin", "llvm-objdump"), shutil.which("llvm-objdump")]
    candidates += sorted(glob.glob("/usr/lib/llvm-*/bin/llvm-objdump"),
                         key=lambda p: int(re.search(r"llvm-(\d+)", p).group(1)), reverse=True)
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    return None


def disassembler(platform: str) -> str | None:
    """Path of the tool that disassembles `platform`'s code objects here, or None."""
    return _cuobjdump() if platform == "nvidia" else _llvm_objdump()


# ------------------------------------------------------------------------------------------ parsing

def _tally(text: str, function, instruction, kinds) -> dict[str, InstructionFacts]:
    """Per kernel, what a disassembly's instructions are: `function(line)` names the kernel a line
    starts (None: no such line; "": a header that is not a kernel's, whose lines are not counted),
    `instruction(line)` gives an instruction's (opcode, operands) or None, `kinds(opcode, operands)` the
    InstructionFacts fields it counts toward besides `instructions`."""
    counts: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        name = function(line)
        if name is not None:
            current = counts.setdefault(name, dict.fromkeys(_FIELDS, 0)) if name else None
            continue
        ins = instruction(line) if current is not None else None
        if ins is None:
            continue
        current["instructions"] += 1
        for field in kinds(*ins):
            current[field] += 1
    return {k: InstructionFacts(**v) for k, v in counts.items()}


_FIELDS = tuple(InstructionFacts.__dataclass_fields__)

# `/*0480*/   @!P0 LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;` -> the opcode with its modifiers
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_SASS_FUNCTION = re.compile(r"Function : (\S+)")
_SASS_MATRIX = ("HMMA", "HGMMA", "IMMA", "IGMMA", "DMMA", "QGMMA", "BMMA")


def _sass_kinds(op: str, _operands) -> tuple:
    base, *mods = op.split(".")
    wide = "128" in mods
    if base in _SASS_MATRIX:
        return ("matrix",)
    if base in ("LDG", "LDGSTS"):
        return ("global_loads", "global_loads_128") if wide else ("global_loads",)
    if base == "STG":
        return ("global_stores", "global_stores_128") if wide else ("global_stores",)
    return ("local",) if base in ("LDL", "STL") else ()


def _sass_facts(text: str) -> dict[str, InstructionFacts]:
    def function(line):
        m = _SASS_FUNCTION.search(line)
        return m.group(1) if m else None

    def instruction(line):
        m = _SASS_LINE.match(line)
        return (m.group(1), "") if m else None
    return _tally(text, function, instruction, _sass_kinds)


_AMD_FUNCTION = re.compile(r"^[0-9a-f]+ <([A-Za-z_][\w.$]*)>:")
_AMD_LINE = re.compile(r"^\s+([a-z][a-z0-9_]*)\b(.*?)(?://|$)")
_AMD_MATRIX = ("v_mfma", "v_smfmac", "v_wmma", "v_swmmac")


def _amd_kinds(op: str, operands: str) -> tuple:
    wide = op.endswith(("dwordx4", "_b128"))
    if op.startswith(_AMD_MATRIX):
        return ("matrix",)
    if op.startswith("scratch_") or (op.startswith("buffer_") and " off, s[0:3]" in operands):
        return ("local",)   # the private segment (scratch): spills and stack arrays
    if op.startswith(("global_load", "buffer_load", "flat_load")):
        return ("global_loads", "global_loads_128") if wide else ("global_loads",)
    if op.startswith(("global_store", "buffer_store", "flat_store")):
        return ("global_stores", "global_stores_128") if wide else ("global_stores",)
    return ()


def _amd_facts(text: str) -> dict[str, InstructionFacts]:
    def function(line):
        m = _AMD_FUNCTION.match(line)
        # .kd descriptors and local labels are not functions
        return None if m is None else "" if m.group(1).endswith(".kd") else m.group(1)

    def instruction(line):
        m = _AMD_LINE.match(line)
        return (m.group(1), m.group(2)) if m else None
    return _tally(text, function, instruction, _amd_kinds)


def instruction_facts(code: bytes, platform: str, arch: str) -> dict[str, InstructionFacts] | None:
    """{kernel: InstructionFacts} for an ELF code object (CUBIN or HSACO, a clang offload bundle
    unwrapped), or None when no disassembler is found here or the code is not machine code (PTX)."""
    tool = disassembler(platform)
    if tool is None or (platform == "nvidia" and code[:4] != b"\x7fELF"):
        return None
    if platform != "nvidia":
        try:
            code = unbundle(code)
        except ValueError:
            return None
        if code[:4] != b"\x7fELF":
            return None
    with tempfile.TemporaryDirectory(prefix="hs_disasm_") as d:
        path = os.path.join(d, "code.cubin" if platform == "nvidia" else "code.hsaco")
        with open(path, "wb") as f:
            f.write(code)
        gfx = arch.split(":", 1)[0]
        cmd = [tool, "-sass", path] if platform == "nvidia" else [tool, "-d", f"--mcpu={gfx}", path]
        # cuobjdump runs nvdisasm for -sass and finds it on PATH or NVDISASM_PATH only; the wheels put the
        # two side by side
        env = dict(os.environ, NVDISASM_PATH=os.environ.get("NVDISASM_PATH", os.path.dirname(tool)))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        return None
    return _sass_facts(r.stdout) if platform == "nvidia" else _amd_facts(r.stdout)
