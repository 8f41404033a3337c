"""hipsched: run each numeric operation on the processor that finishes it first.

Everything that needs the compiled modules (the Executor, the ops, the scheduling types) is loaded on
first use, so `hipsched.telemetry`, `python -m hipsched analyze` and `monitor` work from a checkout
with nothing built, on a laptop that only reads logs copied from a GPU machine."""
from __future__ import annotations

import importlib
import os
import threading

from .errors import BuildMissingError, GpuError, HipschedError
from .config import ConfigError, HybridConfig

__version__ = "0.1.0"

# before anything else can load torch's (hipsched/openmp_runtime.py says why)
from . import openmp_runtime as _openmp_runtime  # noqa: E402
_openmp_runtime.load()

# public name -> module that defines it (all of these import the compiled scheduler core)
_LAZY = {
    "Executor": ".executor",
    "BackendSelection": ".scheduling", "ExecutionStrategy": ".scheduling", "ExecutorCapabilities": ".scheduling",
    "OpCapability": ".scheduling", "PerformanceTracker": ".scheduling", "SelectionReason": ".scheduling",
    "OpType": ".ops",
    "QuantizedTensor": ".ops.quant", "quantize": ".ops.quant",
    "ResidentArray": ".resident",
}
# the compiled extension modules, as `from . import _sched` asks for them
_COMPILED = ("_sched", "_dispatch")

_NAMES = ["BuildMissingError", "ConfigError", "GpuError", "HipschedError", "HybridConfig", "cpu_features",
          "default_executor", *_LAZY]


def _op_names() -> tuple:
    """The public ops, read from the op specs. Imported on first use: the specs need NumPy, and the log
    tools (telemetry, analyze) must import this package without it."""
    return tuple(importlib.import_module(".ops", __name__).OPS)


def _op_names_or_none() -> tuple:
    # `from hipsched import telemetry` asks hasattr first: without NumPy that is "no such op", not an error
    try:
        return _op_names()
    except ImportError:
        return ()


def _source_tree() -> str | None:
    """The checkout this package was imported from, when it was imported from one (setup.py beside it)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root if os.path.isfile(os.path.join(root, "setup.py")) else None


def _build_missing(exc: ImportError) -> BuildMissingError:
    here = os.path.dirname(os.path.abspath(__file__))
    tree = _source_tree()
    if tree is None:
        return BuildMissingError(f"hipsched at {here} is missing its compiled modules ({exc}); reinstall it: "
                                 f"pip install --force-reinstall hipsched")
    return BuildMissingError(
        f"hipsched was imported from its unbuilt source tree {here} (the current directory shadows any installed "
        f"copy): build it in place with `pip install -e {tree}`, or run the installed `hipsched` command "
        f"(or python from another directory)")


def _import_compiled(module: str):
    try:
        return importlib.import_module(module, __name__)
    except ImportError as e:
        # only a missing compiled module means "not built"; any other ImportError is a real bug to show
        if isinstance(e, BuildMissingError) or not _is_missing_extension(e):
            raise
        raise _build_missing(e) from None


def _is_missing_extension(e: ImportError) -> bool:
    name = getattr(e, "name", None) or ""
    return isinstance(e, ModuleNotFoundError) and name.startswith("hipsched.") and \
        name.rsplit(".", 1)[-1].startswith("_")


def __getattr__(name):
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'hipsched' has no attribute {name!r}")
    if name in _LAZY:
        value = getattr(_import_compiled(_LAZY[name]), name)
    elif name == "OPS":
        value = _op_names()
    elif name == "__all__":
        value = _NAMES + list(_op_names())
    elif name in _COMPILED:
        # `from . import _sched` asks the package first (hasattr): import the extension here, so an
        # unbuilt one is reported as such instead of as Python's circular-import message
        value = _import_compiled("." + name)
    elif not name.startswith("_") and name in _op_names_or_none():
        value = _forward(name)
    else:
        raise AttributeError(f"module 'hipsched' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    # the public names, dunders and the package's own submodules; not what this file imports for itself
    # (os, threading, importlib, the __future__ feature `annotations`)
    own = {n for n, v in globals().items()
           if n.startswith("__") or getattr(v, "__name__", "").startswith(__name__ + ".")}
    return sorted(own | set(__getattr__("__all__")))


def cpu_features() -> dict:
    """The SIMD level the CPU kernels use ("avx512", "avx2" or "scalar"), the one detected, the one
    HIPSCHED_CPU_FEATURES requested, the thread count, whether the CPU has AVX512_BF16 / AVX512_FP16, and
    `bf16_dot`: whether bfloat16 matmul and attention's Q.K^T multiply on vdpbf16ps (AVX512_BF16, not
    turned off by HIPSCHED_CPU_FEATURES=avx512; it flushes bf16 denormals to zero). The avx512 level has
    its own kernels for elementwise, similarity, norm, attention and quant; graph has no kernels per level
    (plain C, with an AVX2 index check at the avx2 and avx512 levels: docs/guide/cpu.md, "CPU SIMD levels").
    `omp_wait` says how the kernels' OpenMP threads wait between calls: "passive" (they sleep), or "spin"
    and the runtime loaded before hipsched that spins them (hipsched/openmp_runtime.py)."""
    features = _import_compiled(".cpu._features").cpu_features()
    features["omp_wait"] = _openmp_runtime.wait
    return features


_default = None
_default_lock = threading.Lock()


def default_executor():
    """The process-wide executor behind the module-level ops (created on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = __getattr__("Executor")()
    return _default


def _forget_default_in_child():
    # The parent's default executor lives on in a forked child without its telemetry writer thread (and
    # with the parent's run id): the child builds its own on first use.
    global _default
    _default = None


os.register_at_fork(after_in_child=_forget_default_in_child)


def _forward(name):
    executor_cls = __getattr__("Executor")
    method = getattr(executor_cls, name)

    def op(*args, **kwargs):
        # one frame over the Executor method: the module-level ops are the tiny-call path too
        ex = _default
        return method(default_executor() if ex is None else ex, *args, **kwargs)
    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = method.__doc__
    # the method's parameters without self (help() and inspect.signature show them; calls bind nothing)
    signature = importlib.import_module("inspect").signature(method)
    op.__signature__ = signature.replace(parameters=tuple(signature.parameters.values())[1:])
    return op
