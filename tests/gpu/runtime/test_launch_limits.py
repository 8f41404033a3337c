"""Launch limits per target (hipsched/gpu/compilation/targets.py), the resources read out of real code objects
(hipsched/gpu/compilation/codeobject.py), the CI sweep of every op's launch configurations over its shape range
for sm_80, sm_90, gfx906, gfx908, gfx90a and gfx1030 with register and shared-memory counts from
compiling the kernels for that target, and the executor treating "unsupported" (a call the device
cannot run) as no sign of GPU ill-health."""
import re
import struct

import numpy as np
import pytest

from hipsched.errors import GpuError
from hipsched.gpu.glue import attention, common, elementwise, graph, linalg, norm, quant, similarity
from hipsched.gpu.compilation import kernel_constants
from hipsched.gpu.compilation.codeobject import KernelResources, _msgpack, kernel_resources, with_ptxas_spills
from hipsched.gpu.compilation.kernels import KernelCache
from hipsched.gpu.compilation.targets import TARGETS, check_launch, target_for

from real_compilers import cache_dir, compiler_or_skip  # noqa: F401 (cache_dir is a fixture)

ARCHS = ["sm_80", "sm_90", "gfx906", "gfx908", "gfx90a", "gfx1030"]


_CODE = {}


def code_objects(arch, cache_dir):
    """{source: code object} for every kernel source compiled for `arch` (once per module; the
    code objects come from the session's cache when test_kernels_compile.py made them)."""
    if arch not in _CODE:
        cache = KernelCache(compiler_or_skip(arch), cache_dir)
        _CODE[arch] = {src: cache.code_object(src, arch) for src in cache.sources}
    return _CODE[arch]


def resources(arch, cache_dir):
    out = {}
    for src, code in code_objects(arch, cache_dir).items():
        for k, r in kernel_resources(code).items():
            out[k] = (src[:-len(".hip")], r)
    return out


# ------------------------------------------------------------------------------------ code objects

def test_msgpack_reader_types():
    data = bytes([0x86,                                  # map of 6
                  0xA1, ord("a"), 0x05,                  # "a": 5
                  0xA1, ord("b"), 0xCD, 0x04, 0x00,      # "b": uint16 1024
                  0xA1, ord("c"), 0x92, 0xC3, 0xFF,      # "c": [true, -1]
                  0xA1, ord("d"), 0xD9, 3, ord("x"), ord("y"), ord("z"),   # "d": str8 "xyz"
                  0xA1, ord("e"), 0xCB]) + struct.pack(">d", 1.5) + bytes([  # "e": 1.5
                  0xA1, ord("f"), 0xDE, 0x00, 0x01, 0xA1, ord("g"), 0xC0])   # "f": map16 {"g": None}
    value, end = _msgpack(data)
    assert value == {"a": 5, "b": 1024, "c": [True, -1], "d": "xyz", "e": 1.5, "f": {"g": None}}
    assert end == len(data)
    with pytest.raises(ValueError):
        _msgpack(bytes([0xC1]))          # never used by msgpack


def test_not_a_code_object_has_no_resources():
    assert kernel_resources(b"") == {}
    assert kernel_resources(b".entry k(") == {}            # PTX text
    with open("/bin/sh", "rb") as f:                       # an ELF with neither AMD notes nor .nv.info
        assert kernel_resources(f.read()) == {}


def _elf_symbols(code):
    """{name: (value, section index)} of .symtab/.dynsym, and section (addr, offset) by index."""
    shoff, = struct.unpack_from("<Q", code, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", code, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", code, shoff + i * shentsize) for i in range(shnum)]
    syms = {}
    for _n, stype, _f, _a, off, size, link, _i, _al, entsize in secs:
        if stype in (2, 11):
            strtab = secs[link][4]
            for pos in range(off, off + size, entsize):
                st_name, _info, _other, shndx, value, _sz = struct.unpack_from("<IBBHQQ", code, pos)
                name = code[strtab + st_name:code.index(b"\0", strtab + st_name)].decode()
                syms[name] = (value, shndx)
    return syms, [(s[3], s[4]) for s in secs]


@pytest.mark.parametrize("arch", ["gfx906", "gfx908", "gfx90a", "gfx1030"])
def test_amd_metadata_agrees_with_kernel_descriptors(arch, cache_dir):
    """The msgpack note against a second record in the same file: each kernel's 64-byte descriptor
    (`<name>.kd`) holds the LDS and scratch sizes and the granulated VGPR count the hardware uses."""
    enc = 8 if arch in ("gfx90a", "gfx1030") else 4   # VGPR encoding granule (wave32 / gfx90a: 8)
    seen = 0
    for src, code in code_objects(arch, cache_dir).items():
        res = kernel_resources(code)
        assert res, f"{src}: no AMDGPU metadata read"
        syms, secs = _elf_symbols(code)
        for name, r in res.items():
            value, shndx = syms[name + ".kd"]
            addr, off = secs[shndx]
            kd = code[off + value - addr:off + value - addr + 64]
            group, private = struct.unpack_from("<II", kd, 0)
            rsrc1, = struct.unpack_from("<I", kd, 48)
            blocks = (rsrc1 & 0x3F) + 1
            assert (group, private) == (r.static_shared, r.private), name
            assert (blocks - 1) * enc < max(r.registers, 1) <= blocks * enc, (name, r.registers, blocks)
            assert r.wavefront == (32 if arch == "gfx1030" else 64)
            seen += 1
    assert seen >= 30


def _ptxas(arch, source_name):
    """(code object, ptxas -v log) of one source, compiled with the real NVRTC."""
    compiler = compiler_or_skip(arch)
    cache = KernelCache(compiler)
    return compiler.compile_with_log(cache.source(source_name), source_name, arch, ("--ptxas-options=-v",))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", ["attention.hip", "similarity.hip", "softmax.hip"])
def test_cubin_resources_agree_with_ptxas(arch, source):
    """Registers, static shared memory (sm_90 cubins count the reserved 1 KiB in .nv.shared.<k>) and
    stack frame read from the CUBIN equal what ptxas prints for the same compile."""
    code, log = _ptxas(arch, source)
    res = with_ptxas_spills(kernel_resources(code), log)
    stats = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) bytes stack frame", line)
        if m and current:
            stats.setdefault(current, {})["frame"] = int(m.group(1))
        m = re.search(r"Used (\d+) registers.*?(?:, (\d+) bytes smem)?(?:,|$)", line)
        if m and current:
            smem = re.search(r"(\d+) bytes smem", line)
            stats.setdefault(current, {}).update(regs=int(m.group(1)), smem=int(smem.group(1)) if smem else 0)
    assert set(stats) == set(res), (set(stats), set(res))
    for k, r in res.items():
        assert (r.registers, r.static_shared, r.private) == (stats[k]["regs"], stats[k]["smem"], stats[k]["frame"]), k
        assert r.spill_store_bytes is not None and r.spill_load_bytes is not None
        assert r.max_threads == (128 if k.startswith("hs_attention") else 1024)


# ------------------------------------------------------------------------------------ limits

def _res(**kw):
    base = dict(name="k", registers=32, static_shared=0, private=0, max_threads=1024, wavefront=32)
    base.update(kw)
    return KernelResources(**base)


def _limits(target, res, grid, block, shared=0, warp=None):
    found = {limit for limit, _ in target.launch_problems(res, grid, block, shared, warp)}
    assert target.fits(res, grid, block, shared, warp) == (not found)
    return found


def test_nvidia_limits_each_named():
    t = TARGETS["sm_90"]
    ok = _res()
    assert _limits(t, ok, (2**31 - 1, 65535, 65535), (1024, 1, 1), 0, 32) == set()
    assert _limits(t, ok, (2**31, 1, 1), (32, 1, 1)) == {"grid-x"}
    assert _limits(t, ok, (1, 65536, 1), (32, 1, 1)) == {"grid-y"}
    assert _limits(t, ok, (1, 1, 65536), (32, 1, 1)) == {"grid-z"}
    assert _limits(t, ok, (0, 1, 1), (32, 1, 1)) == {"grid-x"}
    assert _limits(t, ok, (1, 1, 1), (1056, 1, 1)) == {"block-dims", "threads-per-block", "launch-bounds"}
    assert _limits(t, ok, (1, 1, 1), (32, 1, 65)) == {"block-dims", "threads-per-block", "launch-bounds",
                                                      "registers"}   # 65 warps x 32 x 32 registers
    # 48 KB of static + dynamic shared memory without the opt-in attribute, which hipsched never sets
    assert _limits(t, _res(static_shared=128), (1, 1, 1), (32, 1, 1), 48 * 1024 - 128) == set()
    assert _limits(t, _res(static_shared=128), (1, 1, 1), (32, 1, 1), 48 * 1024 - 127) == {"shared-memory"}
    # registers: allocated per warp in units of 256, 64K per block
    assert _limits(t, _res(registers=64), (1, 1, 1), (1024, 1, 1)) == set()
    assert _limits(t, _res(registers=65), (1, 1, 1), (1024, 1, 1)) == {"registers"}
    assert _limits(t, _res(registers=255), (1, 1, 1), (256, 1, 1)) == set()
    assert _limits(t, _res(max_threads=128), (1, 1, 1), (256, 1, 1)) == {"launch-bounds"}
    # the warp size the glue planned with, and whole warps per block
    assert _limits(t, ok, (1, 1, 1), (64, 1, 1), 0, 64) == {"wavefront"}
    assert _limits(t, ok, (1, 1, 1), (48, 1, 1), 0, 32) == {"wavefront"}


def test_amd_limits_each_named():
    t = TARGETS["gfx90a"]
    res = _res(wavefront=64, registers=128, sgprs=40)
    assert _limits(t, res, (2**31 - 1, 1, 1), (1, 1, 1), 0) == set()
    assert _limits(t, res, (2**31 - 1, 1, 1), (256, 1, 1), 0) == {"work-items"}     # 32-bit HSA grid
    assert _limits(t, res, (2**24 - 1, 65535, 1), (256, 1, 1), 0, 64) == set()
    assert _limits(t, res, (1, 1, 1), (64, 1, 1), 64 * 1024) == set()
    assert _limits(t, res, (1, 1, 1), (64, 1, 1), 64 * 1024 + 1) == {"shared-memory"}
    assert _limits(t, _res(wavefront=64, max_threads=256), (1, 1, 1), (512, 1, 1)) == {"launch-bounds"}
    # 16 waves of 1024 threads need 4 per SIMD: 512 / 4 = 128 VGPRs each at most (granule 8)
    assert _limits(t, _res(wavefront=64, registers=128), (1, 1, 1), (1024, 1, 1)) == set()
    assert _limits(t, _res(wavefront=64, registers=129), (1, 1, 1), (1024, 1, 1)) == {"registers"}
    assert _limits(TARGETS["gfx906"], _res(wavefront=64, registers=65), (1, 1, 1), (1024, 1, 1)) == {"registers"}
    assert _limits(t, res, (1, 1, 1), (96, 1, 1), 0, 64) == {"wavefront"}


def test_check_launch_error_names_the_limit():
    with pytest.raises(GpuError) as e:
        check_launch(TARGETS["sm_80"], "hs_x", _res(), (1, 70000, 1), (256, 1, 1), 0, 32)
    assert e.value.kind == "unsupported" and e.value.name == "launch-limit-grid-y"
    assert "hs_x" in str(e.value) and "sm_80" in str(e.value) and "grid y = 70000" in str(e.value)
    with pytest.raises(GpuError) as e:
        check_launch(TARGETS["sm_90"], "hs_x", _res(), (1, 1, 1), (64, 1, 1), 49 * 1024, 32)
    assert e.value.name == "launch-limit-shared-memory" and "cuFuncSetAttribute" in str(e.value)


def test_target_lookup():
    assert target_for("gfx90a:sramecc+:xnack-") is TARGETS["gfx90a"]
    assert target_for("sm_90a") is TARGETS["sm_90"] and target_for("compute_80") is TARGETS["sm_80"]
    other = target_for("sm_86")
    assert not other.known and other.platform == "nvidia" and other.shared_per_block == 48 * 1024
    assert target_for("gfx1100", 32).wavefront == 32 and not target_for("gfx1100").known
    with pytest.raises(GpuError):
        target_for("tpu")


def test_occupancy_against_hand_computed_values():
    # sm_80, 168 registers, 128 threads: 5376 registers per warp, 3 warps per sub-partition -> 12 warps,
    # 3 blocks of 4 warps: 12 / 64 (what the CUDA occupancy calculator gives)
    occ = TARGETS["sm_80"].occupancy(_res(registers=168, static_shared=32768, max_threads=128), 128)
    assert (occ.blocks, occ.waves, occ.limiter) == (3, 12, "registers")
    # sm_90, 256 threads, 32 KB of shared memory + 1 KB reserved per block: 228 / 33 = 6 blocks; with 32
    # registers (8 blocks' worth) shared memory binds, with 64 (2048 per warp: 4 blocks) registers do
    occ = TARGETS["sm_90"].occupancy(_res(registers=32, static_shared=32768), 256)
    assert (occ.blocks, occ.waves, occ.limiter) == (6, 48, "shared memory")
    occ = TARGETS["sm_90"].occupancy(_res(registers=64, static_shared=32768), 256)
    assert (occ.blocks, occ.limiter) == (4, "registers")
    assert TARGETS["sm_90"].occupancy(_res(registers=32), 256).fraction == 1.0
    # gfx906: 148 VGPRs -> 1 wave per SIMD; gfx90a: 160 of 512 -> 3; gfx1030 wave32: 144 of 1024 -> 7
    amd = _res(wavefront=64, registers=148, sgprs=40, max_threads=128)
    assert TARGETS["gfx906"].occupancy(amd, 128).waves == 1
    assert TARGETS["gfx90a"].occupancy(_res(wavefront=64, registers=158, sgprs=40), 128).waves == 3
    assert TARGETS["gfx1030"].occupancy(_res(wavefront=32, registers=140), 128).waves == 7
    # gfx9 SGPRs: more than 100 allow 7 waves
    occ = TARGETS["gfx906"].occupancy(_res(wavefront=64, registers=24, sgprs=104), 256)
    assert (occ.waves, occ.limiter) == (7, "sgprs")
    occ = TARGETS["gfx906"].occupancy(_res(wavefront=64, registers=24, sgprs=24, static_shared=24832), 256)
    assert (occ.blocks, occ.limiter) == (2, "shared memory")   # 64 KiB / 24.5 KiB


# ------------------------------------------------------------------------------------ the CI sweep

BIG = 2**40
SEG = kernel_constants.HS_TOPK_SEG


def sweep(warp, cus, amd, arch):
    """(op, shape, launches, expected): every op's launch plan over its shape range, edges included.
    `expected` is None (the device must take every launch), a set of limit names one of which must be
    reported, or "glue" (the glue itself refuses the shape with GpuError "unsupported")."""
    def work_items(blocks, threads):
        # AMD dispatches grid x block as a 32-bit work-item count per dimension (ROCm refuses more)
        return {"work-items"} if amd and blocks * threads > 2**32 - 1 else None
    def plan(op, shape, fn, *args, expect=None):
        try:
            launches = fn(*args)
        except GpuError as e:
            assert e.kind == "unsupported", (op, shape, e)
            assert expect == "glue", (op, shape, e)
            return (op, shape, [], expect)
        assert expect != "glue", (op, shape, "the glue did not refuse")
        return (op, shape, launches, expect)

    # the element types only rename the kernel (same grid and block; softmax keeps rows as float32 in
    # shared memory whatever the type), so each shape is planned for each. `vec`: the pointers are
    # 16-byte aligned (the planners pick the 16-byte kernels where the lengths allow them)
    for sfx in common.KERNEL_SUFFIX.values():
        for n in (1, 3, 4, 8, 255, 256, 257, 2**20 + 4, 2**20 + 8, 2**31 + 4, BIG):
            for nb in sorted({n, 1, 4, 8, 12}):
                if n % nb:
                    continue
                for vec in (False, True):
                    yield plan("add", (n, nb, vec, sfx), elementwise.add_launches, n, nb, vec, cus, sfx)
            for vec in (False, True):
                yield plan("scale", (n, vec, sfx), elementwise.scale_launches, n, vec, cus, sfx)
                yield plan("silu_mul", (n, vec, sfx), elementwise.silu_mul_launches, n, vec, cus, sfx)
                yield plan("gelu", (n, vec, sfx), elementwise.gelu_launches, n, vec, cus, sfx)
            yield plan("rope", (n, sfx), elementwise.rope_launches, n, cus, sfx)   # n pairs
        cached = elementwise.SOFTMAX_CACHED_LEN
        regs = elementwise.SOFTMAX_REGS_MAX_LEN
        for length in (1, 3, 4, 63, 64, 511, 512, 2047, 2048, 4095, 4096, 4104, cached - 1, cached, cached + 1,
                       cached + 4, 16383, 16384, regs, regs + 4, regs + 8, 2**20, 2**31):
            for outer in (1, 7, 2**20, 2**20 + 1, 2**31 - 1):
                for vec in (False, True):
                    yield plan("softmax", (outer, length, 1, vec, sfx), elementwise.softmax_launches, outer, length, 1,
                               vec, cus, sfx)
        for outer, length, inner in ((1, 1, 2), (2**20, 3, 2**10), (1, 2**20, 2**40), (2**31, 2, 2**31)):
            yield plan("softmax", (outer, length, inner, sfx), elementwise.softmax_launches, outer, length, inner,
                       False, cus, sfx)
        for rows in (1, 7, 2**20, 2**20 + 1, 2**40):
            for length in (1, 63, 64, 1023, 1024, 4096, 4104, 16383, 16384, 16392, 2**31):
                for vec in (False, True):
                    yield plan("rms_norm", (rows, length, sfx, vec), norm.rms_norm_launches, rows, length, sfx, vec)
    for m in (1, 2, 8, 9, 65535, 65536, 8 * 65535 + 1, 2**31):
        for n in (1, 2**20, 2**31):
            for d in (1, 4, 4096):
                for vec in {False, d % 4 == 0}:
                    for sfx in common.KERNEL_SUFFIX.values():
                        yield plan("cosine_similarity", (m, n, d, vec, sfx), similarity.cosine_launches, m, n, d, vec,
                                   warp, cus, sfx)
    for m in (1, 2, 9, 65535, 65536):
        for n in (1, 2, SEG - 1, SEG, SEG + 1, 2**20, 65535 * SEG, 65535 * SEG + 1):
            for k in (1, 2, 511, 512, similarity.TOPK_MAX_K, similarity.TOPK_MAX_K + 1):
                kout = min(k, n)
                for d in (0, 3, 4):
                    expect = ("glue" if kout > similarity.TOPK_MAX_K or n > 65535 * SEG
                              else {"grid-y"} if m > 65535 else None)
                    # the element type renames only the scoring kernels, which cosine_similarity sweeps
                    sfx = ("f32", "f16", "bf16")[(m + d) % 3]
                    yield plan("top_k", (m, n, d, kout, sfx), similarity.top_k_launches, m, n, d, kout, d % 4 == 0,
                               warp, cus, sfx, expect=expect)
    for batch, M, N, K, expect in ((1, 1, 1, 1, None), (1, 65535 * 64, 1, 7, None), (65535, 64, 64, 64, None),
                                   (1, 1, 2**30 - 64, 1, None), (1, 1, 2**30, 1, work_items(2**24, 256)),
                                   (1, 1, 2**31 - 1, 1, work_items(2**25, 256)), (3, 1000, 1000, 2**31 - 1, None),
                                   (65536, 1, 1, 1, {"grid-z"}), (1, 65535 * 64 + 1, 1, 1, {"grid-y"}),
                                   (1, 2**31, 1, 1, "glue")):
        for sfx in common.KERNEL_SUFFIX.values():
            yield plan("matmul", (batch, M, N, K, sfx), linalg.matmul_launches, batch, M, N, K, sfx, expect=expect)
    for hd in (1, 16, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257):
        for b, h, sq in ((1, 1, 1), (1, 1, 2**20), (8, 64, 32768), (2**16, 2**10, 2**20)):
            expect = "glue" if hd > attention.MAX_HEAD_DIM else (
                {"grid-x", "work-items"} if b * h * sq >= 2**34 else None)
            for sfx in common.KERNEL_SUFFIX.values():
                # the matrix-core kernels where the target has them (every NVIDIA target here is sm_80+;
                # gfx90a has MFMA, gfx1030 neither MFMA nor a usable WMMA)
                for mma in {False, common.has_mma(arch)}:
                    yield plan("attention", (b, h, sq, hd, sfx, mma), attention.attention_launches, b, h, sq, hd,
                               sfx, mma, warp, expect=expect)
    # one query per head: the split-K decode kernels and their combine (grouped heads, a group of 16 in two
    # head blocks, caches from 1 key to 2^20)
    for hd in (1, 16, 33, 64, 100, 128, 200, 256, 257):
        for b, h, hkv, sk in ((1, 1, 1, 1), (1, 32, 8, 4096), (8, 64, 8, 131072), (64, 128, 8, 2**20), (3, 16, 1, 77)):
            for sfx in common.KERNEL_SUFFIX.values():
                yield plan("attention-decode", (b, h, hkv, sk, hd, sfx),
                           lambda *a: attention.decode_launches(*a)[0], b, h, hkv, sk, hd, sfx, cus,
                           expect="glue" if hd > attention.MAX_HEAD_DIM else None)
    for n in (1, 255, 2**20, 2**31, BIG):
        for dtype in (np.int32, np.int64):
            yield plan("spread_activation", (n, dtype.__name__), graph.spread_launches, n, dtype, cus)
    for qtype in ("q8_0", "q4_0"):
        for n, k in ((1, 32), (2**20, 1024), (BIG // 1024, 1024), (1, BIG)):
            yield plan("dequantize", (n, k, qtype), quant.dequantize_launches, n, k, qtype, cus)
        # mat-vecs: blocks of 128 threads, 4 teams of 32 lanes whatever the warp, 2 rows a team for a
        # vector, 4 (Q8_0) or 2 (Q4_0) for 2..16 columns (grid y: chunks of 8 columns)
        for n in (1, 2, 3, 2**20, 2**25, 2**27 - 4, 2**27, 2**28, 2**30 - 64, 2**30):
            for m in (1, 2, 7, 8, 9, 16, 17, 65, 65535 * 64, 65535 * 64 + 1):
                if m > 65535 * 64:
                    expect = {"grid-y"}
                elif m == 1:
                    expect = work_items(-(-n // 8), 128)
                elif m <= 16:
                    expect = work_items(-(-n // (16 if qtype == "q8_0" else 8)), 128)
                else:
                    expect = work_items(-(-n // 64), 256)
                # x's element type only renames the kernel (the same grid and block), as above; past 16
                # columns a half x takes the matrix-core tiles where the target has them (the same grid,
                # 4 warps: 256 threads at wave64, so the same work-items)
                for sfx in common.KERNEL_SUFFIX.values():
                    for mma in {False, common.has_mma(arch)}:
                        yield plan("qmatmul", (n, m, qtype, sfx, mma), quant.qmatmul_launches, n, m, qtype, warp,
                                   sfx, mma, expect=expect)


# multiprocessor counts: one, a small part, A100 / H100 / MI250X GCD / MI100 sizes, and more than any
CUS = (1, 2, 108, 132, 110, 120, 1000)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_launch_config_fits_the_target(arch, cache_dir):
    target = TARGETS[arch]
    res = resources(arch, cache_dir)
    warp = target.wavefront
    planned, failures, checked = set(), [], 0
    for cus in CUS:
        for op, shape, launches, expect in sweep(warp, cus, target.platform == "amd", arch):
            found = set()
            for launch in launches:
                assert launch.kernel in res, f"{op} {shape}: {launch.kernel} is not compiled for {arch}"
                src, r = res[launch.kernel]
                assert src == launch.source, (launch.kernel, src, launch.source)
                planned.add(launch.kernel)
                problems = target.launch_problems(r, launch.grid, launch.block, launch.shared, warp)
                # the fast path every launch takes agrees with the full list
                assert target.fits(r, launch.grid, launch.block, launch.shared, warp) == (not problems)
                found |= {limit for limit, _ in problems}
                checked += 1
                if expect is None and problems:
                    failures.append(f"{op} {shape} cus={cus}: {launch.kernel} grid {launch.grid} block "
                                    f"{launch.block} shared {launch.shared}: {problems}")
            if isinstance(expect, set) and not found & expect:
                failures.append(f"{op} {shape} cus={cus}: expected the device to refuse ({expect}), it would not")
    assert not failures, "\n".join(failures[:30])
    # every kernel the sources define is reached by some op's plan: none escapes the sweep
    assert planned == set(res), set(res) - planned
    assert checked > 10000


class _CompileOnlyRuntime:
    """A real compiler and no device: GpuContext compiles real code objects and reads their resources;
    module loads and launches are only recorded, so a refused launch shows as one never made."""
    name = "compile-only"

    def __init__(self, arch, warp):
        from hipsched.gpu.bindings.runtime import DeviceInfo
        self.compiler = compiler_or_skip(arch)
        self.platform = self.compiler.platform
        self.info = DeviceInfo(0, "compile-only", arch, 1 << 30, self.platform, warp, 4)
        self.launches = []

    def set_device(self, i): pass
    def current_device(self): return 0
    def device_info(self, i): return self.info
    def module_load(self, image): return 1
    def module_function(self, module, name): return 0x1000 + sum(map(ord, name)) * 7919
    def launch(self, fn, grid, block, args, shared_bytes=0, stream=0):
        self.launches.append((fn, grid, block, shared_bytes))


@pytest.mark.parametrize("arch,warp,kernel,block,limit", [
    ("sm_90", 32, ("similarity", "hs_cosine_f32_q8"), 1024, "registers"),       # 80 registers x 1024
    ("sm_90", 32, ("attention", "hs_attention_d64"), 256, "launch-bounds"),
    ("gfx90a", 64, ("attention", "hs_attention_d64"), 256, "launch-bounds"),
    ("gfx90a", 64, ("quant", "hs_qmatmat_f32_q8_0"), 512, "launch-bounds"),
])
def test_context_refuses_before_the_runtime_sees_the_launch(arch, warp, kernel, block, limit, cache_dir):
    import ctypes
    from hipsched.gpu.launch.context import GpuContext
    rt = _CompileOnlyRuntime(arch, warp)
    ctx = GpuContext(rt, cache_dir=str(cache_dir))
    fn = ctx.function(*kernel)
    assert ctx.resources(kernel[0])[kernel[1]].registers > 0       # read from the real code object
    args = (ctypes.c_void_p(0),)
    with pytest.raises(GpuError) as e:
        ctx.launch(fn, 1, block, args)
    assert e.value.kind == "unsupported" and e.value.name == f"launch-limit-{limit}", str(e.value)
    assert kernel[1] in str(e.value) and arch in str(e.value)
    assert rt.launches == []
    ctx.launch(fn, 1, 128, args)          # within every limit: reaches the runtime
    assert len(rt.launches) == 1


def test_grid_stride_kernels_never_exceed_the_grid():
    from hipsched.gpu.launch.context import grid_stride_blocks
    for cus in CUS:
        for n in (0, 1, 2**31, 2**62):
            assert 1 <= grid_stride_blocks(n, 256, cus) <= 16 * cus


# ------------------------------------------------------------------------------------ executor

def test_unsupported_falls_back_without_feeding_the_breaker():
    from hipsched import Executor
    from fake_gpu import FakeGpuBackend

    gpu = FakeGpuBackend(ops=("add",), fail=lambda call: "unsupported")
    ex = Executor(gpu_backend=gpu, persist_model=False, telemetry_path=None, strategy="gpu_preferred",
                  breaker_failures=2)
    a = np.ones((64, 64), np.float32)
    for _ in range(10):
        np.testing.assert_array_equal(ex.add(a, a), a + a)
    health = ex.gpu_health("add")
    assert health["state"] == "closed" and health["failures"] == 0 and health["consecutive_failures"] == 0
    assert gpu.runs == 10                         # every call still tried the GPU and reran on the CPU
    assert ex.stats().fallback_operations == 10

    # the same failures as a device error ("launch") do open it: the test above can fail
    bad = Executor(gpu_backend=FakeGpuBackend(ops=("add",), fail=lambda call: "launch"), persist_model=False,
                   telemetry_path=None, strategy="gpu_preferred", breaker_failures=2)
    for _ in range(3):
        bad.add(a, a)
    assert bad.gpu_health("add")["state"] == "open"


def test_unsupported_half_open_probe_does_not_wedge_the_breaker():
    from fake_gpu import breaker_open_for_add

    mode = {"kind": "launch"}
    gpu, ex, a = breaker_open_for_add(lambda call: mode["kind"], breaker_failures=3)
    mode["kind"] = "unsupported"
    runs = gpu.runs
    ex.add(a, a)                                  # the probe: the call cannot run on this GPU
    assert gpu.runs == runs + 1
    h = ex.gpu_health("add")
    assert h["state"] == "open" and h["failures"] == 3    # not half-open for good, and not counted
    mode["kind"] = None
    ex.add(a, a)                                  # cooldown already served: this call probes and closes it
    assert gpu.runs == runs + 2
    assert ex.gpu_health("add")["state"] == "closed"


# ------------------------------------------------------------------------------------ the report

def test_report_covers_every_kernel_at_the_glues_block_sizes(cache_dir):
    from hipsched.gpu.compilation.report import glue_launches
    for arch in ("sm_90", "gfx90a", "gfx1030"):
        names = set(resources(arch, cache_dir))
        assert set(glue_launches(TARGETS[arch].wavefront, arch=arch)) == names, arch
    sizes = glue_launches(32)
    assert sizes["hs_softmax_rows_f32"] == {64: 2044, 256: 16380, 512: elementwise.SOFTMAX_CACHED_LEN * 4}
    assert sizes["hs_attention_d256"] == {128: 0} and sizes["hs_topk_select_f32"] == {256: 0}


def test_compile_report_command(cache_dir):
    import json
    from hipsched.gpu.compilation.disassembly import disassembler
    import subprocess
    import sys
    for arch in ("sm_90", "gfx90a"):
        compiler_or_skip(arch)
    r = subprocess.run([sys.executable, "-m", "hipsched", "compile", "--arch", "sm_90", "--arch", "gfx90a",
                        "--cache-dir", str(cache_dir), "--report", "--json"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    for arch in ("sm_90", "gfx90a"):
        report = [k for row in rows if row["arch"] == arch for k in row["report"]]
        assert {k["kernel"] for k in report} == set(resources(arch, cache_dir))
        for k in report:
            assert 0 < k["occupancy"] <= 1 and k["limited_by"] in (
                "-", "registers", "sgprs", "shared memory", "threads", "blocks", "waves", "barriers"), k
            assert k["block"] <= k["max_threads"]
            if arch == "sm_90":   # spills from ptxas -v, for the same compile
                assert k["spill_store_bytes"] is not None and k["spill_load_bytes"] is not None
                # cuobjdump comes with the test extra: the machine code is always read for NVIDIA
                assert k["instructions"]["instructions"] > 0, k
            else:
                assert k["vgpr_spills"] is not None and k["sgprs"] > 0
    text = subprocess.run([sys.executable, "-m", "hipsched", "compile", "--arch", "gfx90a", "--cache-dir",
                           str(cache_dir), "--report"], capture_output=True, text=True, timeout=600)
    assert text.returncode == 0, text.stderr
    assert "gfx90a kernel report" in text.stdout and "limited by" in text.stdout
    if disassembler("amd"):
        assert "ld128/ld" in text.stdout and "machine code read with" in text.stdout
    assert all(k in text.stdout for k in resources("gfx90a", cache_dir))
