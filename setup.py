"""Build: one Cython extension per CPU op family (hipsched/cpu/_<family>.pyx + src_c/cpu/<family>*.c)
plus the scheduler core and the telemetry's event recorder. No global -mavx2/-march: SIMD variants are selected per translation unit
(src_c/cpu/*_avx2.c, *_avx512.c and the AVX512_BF16 *_bf16dot.c carry `#pragma GCC target`, and run only
where cpu_features.h finds the CPU has them), so the Cython glue stays portable.
HIPSCHED_BUILD_ONLY=name1,name2 limits the build to some extensions (development only)."""
import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

C_FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-Wno-unused-function"]
only = {s for s in os.environ.get("HIPSCHED_BUILD_ONLY", "").split(",") if s}


def cpu_extension(pyx):
    family = os.path.basename(pyx)[1:-4]
    sources = [pyx] + sorted(glob.glob(f"src_c/cpu/{family}.c") + glob.glob(f"src_c/cpu/{family}_*.c"))
    # .inc bodies and shared headers are not compiled on their own: list them so an edit rebuilds.
    depends = sorted(glob.glob(f"src_c/cpu/{family}*.inc") + glob.glob("src_c/cpu/*.h"))
    return Extension(f"hipsched.cpu._{family}", sources, include_dirs=[np.get_include(), "src_c/cpu"],
                     depends=depends,
                     extra_compile_args=C_FLAGS, extra_link_args=["-fopenmp"],
                     define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])


def core_extension(pyx):
    name = pyx[:-4].replace("/", ".")
    return Extension(name, [pyx], include_dirs=[np.get_include()], extra_compile_args=["-O3"],
                     define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])


extensions = [cpu_extension(p) for p in sorted(glob.glob("hipsched/cpu/_*.pyx"))]
extensions += [core_extension(p) for p in sorted(glob.glob("hipsched/_*.pyx") + glob.glob("hipsched/telemetry/_*.pyx")
                                                  + glob.glob("hipsched/gpu/*/_*.pyx"))]
if only:
    extensions = [e for e in extensions if e.name.rsplit(".", 1)[-1].lstrip("_") in only]

setup(
    packages=["hipsched", "hipsched.ops", "hipsched.backends", "hipsched.cpu", "hipsched.gpu", "hipsched.gpu.bindings",
              "hipsched.gpu.compilation", "hipsched.gpu.memory", "hipsched.gpu.launch", "hipsched.gpu.ops",
              "hipsched.telemetry", "hipsched.cli", "hipsched.hip_src", "hipsched.dask"],
    package_dir={"hipsched.hip_src": "src_c/hip"},
    package_data={"hipsched.hip_src": ["*.hip", "*.h"], "hipsched.telemetry": ["*.json"]},
    ext_modules=cythonize(extensions, language_level=3, nthreads=int(os.environ.get("HIPSCHED_CYTHON_JOBS", "0")),
                          compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True}),
    zip_safe=False,
)
