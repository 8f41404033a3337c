"""Build: one Cython extension per CPU op family (hipsched/cpu/_<family>.pyx + src_c/cpu/<family>*.c)
plus the scheduler core and the telemetry's event recorder. No global -mavx2/-march: SIMD variants are selected per translation unit
(src_c/cpu/*_avx2.c, *_avx512.c and the AVX512_BF16 *_bf16dot.c carry `#pragma GCC target`, and run only
where cpu_features.h finds the CPU has them), so the Cython glue stays portable.
HIPSCHED_BUILD_ONLY=name1,name2 limits the build to some extensions (development only).

The build uses every core: Cython translates the .pyx files in parallel, and build_ext compiles the
extensions' C files in parallel (`parallel` defaults to the core count; `-j N` or HIPSCHED_BUILD_JOBS=N
sets it), as `pip install .` and `python -m build` give no way to pass -j. The C is compiled without
debug information (-g0 after Python's own -g): it made the objects several times larger and the build
slower, and a user's install has no debugger reading it."""
import concurrent.futures
import glob
import os
import threading

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

C_FLAGS = ["-O3", "-g0", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-Wno-unused-function"]
JOBS = int(os.environ.get("HIPSCHED_BUILD_JOBS", "0")) or os.cpu_count() or 1


# at most JOBS compiler processes at once, whichever extension they belong to
_slots = threading.BoundedSemaphore(JOBS)


def compile_in_parallel(compiler, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                        extra_preargs=None, extra_postargs=None, depends=None):
    """CCompiler.compile with the sources compiled side by side (its own loop is one at a time): the
    largest extension, similarity, is nine C files, and alone took most of a two-core build."""
    macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        src, ext = build[obj]
        with _slots:
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
        list(pool.map(one, [o for o in objects if o in build]))
    return objects


class build_ext(_build_ext):
    """build_ext on every core unless told otherwise (setuptools' default is one): extensions side by
    side, and each extension's C files side by side."""

    def finalize_options(self):
        if not self.parallel:
            self.parallel = JOBS
        super().finalize_options()

    def build_extension(self, ext):
        compiler = self.compiler
        compiler.compile = lambda sources, **kw: compile_in_parallel(compiler, sources, **kw)
        super().build_extension(ext)
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
    return Extension(name, [pyx], include_dirs=[np.get_include()], extra_compile_args=["-O3", "-g0"],
                     define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])


extensions = [cpu_extension(p) for p in sorted(glob.glob("hipsched/cpu/_*.pyx"))]
extensions += [core_extension(p) for p in sorted(glob.glob("hipsched/_*.pyx") + glob.glob("hipsched/telemetry/_*.pyx")
                                                  + glob.glob("hipsched/gpu/*/_*.pyx"))]
if only:
    extensions = [e for e in extensions if e.name.rsplit(".", 1)[-1].lstrip("_") in only]

setup(
    packages=["hipsched", "hipsched.ops", "hipsched.backends", "hipsched.cpu", "hipsched.gpu", "hipsched.gpu.bindings",
              "hipsched.gpu.compilation", "hipsched.gpu.memory", "hipsched.gpu.launch", "hipsched.gpu.glue",
              "hipsched.telemetry", "hipsched.cli", "hipsched.hip_src", "hipsched.dask"],
    package_dir={"hipsched.hip_src": "src_c/hip"},
    package_data={"hipsched.hip_src": ["*.hip", "*.h"], "hipsched.telemetry": ["*.json"]},
    cmdclass={"build_ext": build_ext},
    ext_modules=cythonize(extensions, language_level=3, nthreads=int(os.environ.get("HIPSCHED_CYTHON_JOBS", JOBS)),
                          compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True}),
    zip_safe=False,
)
