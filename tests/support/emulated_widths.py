"""Builds a kernel body at both emulated lane widths (emu_lanes.h) into temporary libraries, with
setup.py's flags for the C kernels (-O3, OpenMP, no errno, no trapping math), for the width tests."""
import ctypes
import os
import shutil
import subprocess

import pytest
from requires import tools_required

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src_c", "cpu")
SUPPORT = os.path.dirname(os.path.abspath(__file__))

# a width test's module mark: without gcc it skips, where CI requires the tools it fails (requires.py)
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None and not tools_required(),
                               reason="needs gcc to build the emulated widths")


def build_widths(directory, harness: str, widths=(8, 16)) -> dict:
    """{width: ctypes.CDLL} of `harness` (C source that includes simd.h, emu_lanes.h and a body) built
    with EMU_W = width; a compile error fails with gcc's message."""
    src = os.path.join(str(directory), "emu.c")
    with open(src, "w") as f:
        f.write(harness)
    libs = {}
    for w in widths:
        so = os.path.join(str(directory), f"emu{w}.so")
        r = subprocess.run(["gcc", "-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared",
                            "-Wall", "-Wno-unused-function", f"-DEMU_W={w}", f"-I{SRC}", f"-I{SUPPORT}", src,
                            "-o", so, "-lm"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        libs[w] = ctypes.CDLL(so)
    return libs
