"""The import graph points one way (docs/architecture.md): public API -> executor/dispatch -> op specs
(hipsched/ops) -> backends (hipsched/backends, hipsched/cpu, hipsched/gpu) -> kernels, with leaf modules
that any layer may import because they import nothing of hipsched. Read from the source text, so the
rule is checked on a machine without a GPU and without building anything."""
import ast
import os
import re

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "hipsched")
LEAVES = ("device_arrays.py", "gguf_blocks.py", "resident.py")


def _imports(path, module_level_only=False):
    """Absolute names of the hipsched modules `path` imports ('hipsched.x.y'), with the line of each."""
    rel = os.path.relpath(path, os.path.dirname(PKG)).replace(os.sep, ".")[:-3]
    package = rel.rsplit(".", 1)[0] if not rel.endswith("__init__") else rel[:-len(".__init__")]
    tree = ast.parse(open(path).read())
    nodes = tree.body if module_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            names = [name] if node.module else [f"{name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(n, node.lineno) for n in names if n == "hipsched" or n.startswith("hipsched.")]
    return found


def _files(sub, ext=".py"):
    folder = os.path.join(PKG, sub)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(ext))


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaf_modules_import_nothing_of_hipsched(leaf):
    assert _imports(os.path.join(PKG, leaf)) == []


def test_op_specs_load_no_backend_at_import():
    """hipsched.ops names its kernels as (module, function), resolved on first use: importing the specs
    loads no CPU extension and no GPU code, which may be absent or broken."""
    allowed = ("hipsched.ops", "hipsched.errors", *(f"hipsched.{leaf[:-3]}" for leaf in LEAVES))
    wrong = [(os.path.basename(f), name, line) for f in _files("ops") for name, line in _imports(f, True)
             if not name.startswith(allowed)]
    assert wrong == []


def test_op_specs_never_import_a_cpu_kernel_module():
    wrong = [(os.path.basename(f), name, line) for f in _files("ops") for name, line in _imports(f)
             if name.startswith(("hipsched.cpu", "hipsched.backends"))]
    assert wrong == []


def test_kernel_wrappers_and_gpu_glue_point_down_only():
    up = ("hipsched.ops", "hipsched.executor", "hipsched.backends", "hipsched.chunking", "hipsched.calibration",
          "hipsched.scheduling", "hipsched.dask")
    wrong = [(os.path.basename(f), name, line) for f in _files("gpu") for name, line in _imports(f)
             if name.startswith(up)]
    pattern = re.compile(r"^\s*(?:from|import)\s+(?:\.\.|hipsched\.)(ops|executor|backends|dask)\b", re.M)
    wrong += [(os.path.basename(f), m.group(0).strip()) for f in _files("cpu", ".pyx")
              for m in pattern.finditer(open(f).read())]
    assert wrong == []
