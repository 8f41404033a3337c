"""The import graph points one way (docs/architecture.md): public API -> executor/dispatch -> backends
(hipsched/backends) -> kernels (hipsched/cpu, hipsched/gpu), with the op specs (hipsched/ops) a registry
below the backends that imports neither backends, executor nor kernels, and leaf modules that any layer
may import because they import nothing of hipsched above them. Python files are read through their
syntax tree, .pyx/.pxd files' imports and cimports from their text, so the rule is checked on a machine
without a GPU and without building anything; the import graph, imports inside functions included, has no
cycle."""
import ast
import os
import re

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "hipsched")
LEAVES = ("broadcast.py", "dlpack_devices.py", "gguf_blocks.py", "openmp_runtime.py", "resident_array.py")


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
    """The `ext` files of hipsched/`sub`, its subfolders' included (the GPU layer is a folder per concern)."""
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(PKG, sub)) for f in fs if f.endswith(ext))


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
          "hipsched.scheduling", "hipsched.dask", "hipsched.splitting")
    wrong = [(os.path.basename(f), name, line) for f in _files("gpu") for name, line in _imports(f)
             if name.startswith(up)]
    pattern = re.compile(r"^\s*(?:from|import)\s+(?:\.\.|hipsched\.)(ops|executor|backends|dask)\b", re.M)
    wrong += [(os.path.basename(f), m.group(0).strip()) for f in _files("cpu", ".pyx")
              for m in pattern.finditer(open(f).read())]
    assert wrong == []


# ---- Every layer, .pyx/.pxd included, and no import cycles -------------------------------------------
#
# The ranks of docs/architecture.md's diagram: an arrow from a module to one of a higher rank points up.
# The op specs are a registry below the backends (the backends read it) and above the kernels (which
# never import it); the specs themselves import nothing of hipsched but the specs and the leaves
# (test_op_specs_import_only_specs_and_leaves). Modules outside the diagram (config, scheduling, cli,
# dask, ...) are not ranked here.
RANKS = (
    ("hipsched", 5),                                               # public API (hipsched/__init__.py)
    ("hipsched.executor", 4), ("hipsched.chunking", 4), ("hipsched.calibration", 4), ("hipsched.splitting", 4),
    ("hipsched.upload_sharing", 4), ("hipsched.further_gpus", 4), ("hipsched._queued_timing", 4), ("hipsched.priors", 4),
    ("hipsched._dispatch", 4), ("hipsched._sched", 4), ("hipsched._perfmodel", 4), ("hipsched._load", 4),
    ("hipsched._health", 4), ("hipsched._link", 4), ("hipsched.submission", 4), ("hipsched.batch", 4),
    ("hipsched.batch_plan", 4),
    ("hipsched.backends", 3),
    ("hipsched.ops", 2),
    ("hipsched.cpu", 1), ("hipsched.gpu", 1),
    *((f"hipsched.{leaf[:-3]}", 0) for leaf in LEAVES), ("hipsched.errors", 0), ("hipsched.telemetry", 0),
    ("hipsched._clock", 0),
)
# The two arrows that still skip a layer (docs/architecture.md, "Two arrows still skip a layer"):
# ops/validation.py's as_device_array wraps a foreign device array in gpu.memory.device_array.DeviceArray (on
# first use), and the dispatcher takes gpu.memory.streams.as_stream_handle and
# gpu.memory.device_array.consumer_stream. The second points down, so
# the rank rule lets it be; the first is the one exception to the specs' own rule, named here so that no
# other slips in.
SPEC_EXCEPTIONS = {("hipsched/ops/validation.py", "hipsched.gpu.memory.device_array")}
# One arrow points up, inside a function: Executor.capabilities takes hipsched.cpu_features (the
# package's, which reports an unbuilt _features module as BuildMissingError).
UP_EXCEPTIONS = {("hipsched/executor.py", "hipsched")}

_PYX_IMPORT = re.compile(r"^([ \t]*)(?:from[ \t]+(\.*[\w.]*)[ \t]+c?import[ \t]+\(?([\w., \t]+)|c?import[ \t]+([\w.]+))",
                         re.M)
_ALL = ("hipsched/__init__.py", *(os.path.relpath(os.path.join(d, f), os.path.dirname(PKG)).replace(os.sep, "/")
                                  for d, _, fs in os.walk(PKG) for f in fs
                                  if f.endswith((".py", ".pyx", ".pxd")) and d != PKG or
                                  (d == PKG and f.endswith((".py", ".pyx", ".pxd")) and f != "__init__.py")))


def _module_of(rel):
    """'hipsched/gpu/memory/streams.py' -> 'hipsched.gpu.memory.streams'; a package's __init__ is the package."""
    name = rel.rsplit(".", 1)[0].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _absolute(package, level, module):
    if not level:
        return module or ""
    base = package.split(".")[:len(package.split(".")) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(rel, text=None):
    """(hipsched module, line, inside a function) for every import in the source `rel` (a path from the
    repository root, 'hipsched/x/y.pyx'): Python's through its syntax tree; a .pyx/.pxd's cimports and
    imports read from its text, an indented one counting as inside a function. `text` stands in for the
    file's contents (the tests of the checker feed it imports that are wrong)."""
    if text is None:
        text = open(os.path.join(os.path.dirname(PKG), rel)).read()
    me = _module_of(rel)
    package = me if rel.endswith("__init__.py") else me.rsplit(".", 1)[0]
    found = []
    if rel.endswith(".py"):
        def visit(node, local):
            for child in ast.iter_child_nodes(node):
                inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.ImportFrom):
                    name = _absolute(package, child.level, child.module)
                    names = [name] if child.module else [f"{name}.{a.name}" for a in child.names]
                    found.extend((n, child.lineno, local) for n in names)
                elif isinstance(child, ast.Import):
                    found.extend((a.name, child.lineno, local) for a in child.names)
                visit(child, inner)
        visit(ast.parse(text), False)
    else:
        for m in _PYX_IMPORT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            if m.group(4):
                names = [m.group(4)]
            else:
                level = len(m.group(2)) - len(m.group(2).lstrip("."))
                name = _absolute(package, level, m.group(2).lstrip(".") or None)
                names = [name] if m.group(2).lstrip(".") else [f"{name}.{a.split()[0]}" for a in
                                                                 m.group(3).split(",") if a.strip()]
            found.extend((n, line, bool(m.group(1))) for n in names)
    return [(n, line, local) for n, line, local in found if n == "hipsched" or n.startswith("hipsched.")]


def _rank(module):
    best = None
    for prefix, rank in RANKS:
        if (module == prefix or (prefix != "hipsched" and module.startswith(prefix + "."))) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank)
    return None if best is None else best[1]


def _existing(name, modules):
    """The module `name` stands for: itself, or for 'pkg.attr' (from pkg import attr) the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def arrows_up(sources):
    """(file, imported module, line) for each import in `sources` ({rel: text or None}) that points from
    a ranked layer to a higher one, or from a leaf to anything of hipsched but a leaf."""
    wrong = []
    modules = {_module_of(rel) for rel in (*_ALL, *sources)}
    for rel, text in sources.items():
        mine = _rank(_module_of(rel))
        if mine is None:
            continue
        for name, line, _ in imports_of(rel, text):
            name = _existing(name, modules)   # 'from . import cpu_features' is the package's
            if (rel, name) in UP_EXCEPTIONS:
                continue
            theirs = _rank(name)
            if theirs is not None and (theirs > mine or (mine == 0 and theirs != 0)):
                wrong.append((rel, name, line))
            elif mine == 0 and theirs is None:
                wrong.append((rel, name, line))
    return wrong


def spec_imports_out(sources):
    """(file, module, line) for each import by an op spec of anything but the specs and the leaves,
    less SPEC_EXCEPTIONS."""
    return [(rel, name, line) for rel, text in sources.items() if rel.startswith("hipsched/ops/")
            for name, line, _ in imports_of(rel, text)
            if _rank(name) not in (0, 2) and (rel, name) not in SPEC_EXCEPTIONS]


def import_cycles(sources):
    """Cycles of the import graph of `sources`, module-level imports and imports inside functions
    alike (a deferred import closes a cycle just the same): a list of module lists."""
    modules = {_module_of(rel) for rel in sources}
    graph = {m: set() for m in modules}
    for rel, text in sources.items():
        me = _module_of(rel)
        for name, _, _ in imports_of(rel, text):
            target = _existing(name, modules)
            # 'from . import x' in a package's own __init__ and a module importing its own package's
            # names are the package machinery, not an arrow: only arrows between different modules
            if target and target != me and not me.startswith(target + "."):
                graph[me].add(target)
    # Tarjan's strongly connected components
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return cycles


def _tree():
    return {rel: None for rel in _ALL}


def test_every_source_file_is_read():
    """.pyx and .pxd files and the backends are part of the graph."""
    assert {"hipsched/_dispatch.pyx", "hipsched/_sched.pxd", "hipsched/cpu/_hot.pxd",
            "hipsched/backends/gpu.py", "hipsched/telemetry/_record.pyx"} <= set(_ALL)
    cimports = {(name, local) for name, _, local in imports_of("hipsched/_dispatch.pyx")}
    assert {("hipsched.cpu._hot", False), ("hipsched.gpu.launch._callpath", False)} <= cimports


def test_the_diagram_names_every_ranked_module():
    """docs/architecture.md's layer diagram is the rule's picture: each module or package RANKS ranks is
    in it, as a file (executor.py, _perfmodel.pxd) or a folder (hipsched/ops/)."""
    doc = open(os.path.join(os.path.dirname(PKG), "docs", "architecture.md")).read()
    diagram = doc.split("## Layers, and the one-way rule", 1)[1].split("```")[1]
    missing = [prefix for prefix, _ in RANKS if prefix != "hipsched" and not re.search(
        rf"(?<![\w.]){re.escape(prefix.split('.', 1)[1])}(?:\.pyx?|\.pxd|/)", diagram)]
    assert missing == []


def test_no_arrow_points_up_a_layer():
    assert arrows_up(_tree()) == []


def test_checker_reports_an_attribute_of_the_package_as_the_package():
    assert arrows_up({"hipsched/backends/_bad.py": "def f():\n    from .. import cpu_features\n"}) == \
        [("hipsched/backends/_bad.py", "hipsched", 2)]


def test_op_specs_import_only_specs_and_leaves():
    assert spec_imports_out(_tree()) == []
    assert all((name in {n for n, _, _ in imports_of(rel)}) for rel, name in SPEC_EXCEPTIONS), \
        "an exception no longer used: take it out of SPEC_EXCEPTIONS and docs/architecture.md"


# Inside the GPU layer the folders are concerns with an order of their own: the glue (gpu/glue) runs through
# gpu/launch, which uses gpu/memory and gpu/compilation, and all of them stand on gpu/bindings, which
# imports nothing of the others (its compilers and the registry of destroyed streams live in it).
GPU_RANKS = (("hipsched.gpu.glue", 4), ("hipsched.gpu.launch", 3), ("hipsched.gpu.memory", 2),
             ("hipsched.gpu.compilation", 2), ("hipsched.gpu.bindings", 1))


def _gpu_rank(module):
    for prefix, rank in GPU_RANKS:
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def gpu_arrows_up(sources):
    """(file, module, line) of each import inside hipsched/gpu that points to a folder of a higher GPU
    rank, or across between the two of rank 2 (memory and compilation are independent)."""
    wrong = []
    for rel, text in sources.items():
        me = _module_of(rel)
        mine = _gpu_rank(me)
        if mine is None:
            continue
        for name, line, _ in imports_of(rel, text):
            theirs = _gpu_rank(name)
            if theirs is None or name.split(".")[2] == me.split(".")[2]:
                continue
            if theirs >= mine:
                wrong.append((rel, name, line))
    return wrong


def test_the_gpu_folders_point_down_only():
    assert gpu_arrows_up(_tree()) == []


def test_checker_reports_the_bindings_importing_a_folder_above_them():
    bad = {"hipsched/gpu/bindings/ctypes_api.py": "from ..compilation.compilers import get_compiler\n",
           "hipsched/gpu/bindings/_driver.pyx": "from ..memory.streams import _retired_streams\n",
           "hipsched/gpu/launch/context.py": "from ..memory.device_array import DeviceArray\n"}
    assert sorted(m for _, m, _ in gpu_arrows_up(bad)) == ["hipsched.gpu.compilation.compilers",
                                                          "hipsched.gpu.memory.streams"]


def test_no_import_cycles_including_deferred_imports():
    assert import_cycles(_tree()) == []


# The checker can fail: imports that are wrong, fed to it as source text.

def test_checker_reports_a_pyx_cimport_up_the_layers():
    bad = {"hipsched/cpu/_bad.pyx": "from libc.math cimport exp\nfrom hipsched._sched cimport CPU\n",
           "hipsched/backends/_bad.pxd": "from ..executor cimport Executor\n",
           "hipsched/gpu/_bad.pyx": "def f():\n    from hipsched.ops import OPS\n"}
    assert sorted(arrows_up(bad)) == [("hipsched/backends/_bad.pxd", "hipsched.executor", 1),
                                      ("hipsched/cpu/_bad.pyx", "hipsched._sched", 2),
                                      ("hipsched/gpu/_bad.pyx", "hipsched.ops", 2)]


def test_checker_reports_specs_importing_a_backend_and_leaves_importing_up():
    bad = {"hipsched/ops/_bad.py": "from ..backends.cpu import CpuBackend\nfrom .base import Call\n",
           "hipsched/resident_array.py": "def f():\n    from .gpu import memory\n",
           "hipsched/telemetry/_bad.pyx": "from hipsched.executor import Executor\n"}
    assert sorted(arrows_up(bad)) == [("hipsched/ops/_bad.py", "hipsched.backends.cpu", 1),
                                      ("hipsched/resident_array.py", "hipsched.gpu", 2),
                                      ("hipsched/telemetry/_bad.pyx", "hipsched.executor", 1)]
    assert spec_imports_out(bad) == [("hipsched/ops/_bad.py", "hipsched.backends.cpu", 1)]


def test_checker_reports_a_cycle_closed_inside_a_function():
    bad = {"hipsched/gpu/memory/device_array.py": "from .streams import as_stream_handle\n",
           "hipsched/gpu/memory/streams.py": "def close():\n    from .device_array import retire_stream\n",
           "hipsched/gpu/compilation/kernels.py": "from ..memory import streams\n"}
    assert import_cycles(bad) == [["hipsched.gpu.memory.device_array", "hipsched.gpu.memory.streams"]]
    bad["hipsched/gpu/memory/streams.py"] = "def close():\n    pass\n"
    assert import_cycles(bad) == []


def undocumented_deferred_imports(sources):
    """(file, line) of each import inside a function (.py) that gives no reason: a comment on its line,
    or above the run of imports it belongs to. An import is deferred only to put off a heavy or optional
    dependency (or the GPU layer, which may be missing or broken), never to hide a cycle."""
    found = []
    for rel, text in sources.items():
        if not rel.endswith(".py"):
            continue
        text = open(os.path.join(os.path.dirname(PKG), rel)).read() if text is None else text
        lines = text.split("\n")
        tree = ast.parse(text)

        def visit(node, local):
            for child in ast.iter_child_nodes(node):
                inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if local and isinstance(child, (ast.Import, ast.ImportFrom)):
                    i = child.lineno - 1
                    while "#" not in lines[i] and i > 0 and re.match(r"\s+(from|import) ", lines[i]):
                        i -= 1
                    if "#" not in lines[i]:
                        found.append((rel, child.lineno))
                visit(child, inner)
        visit(tree, False)
    return found


def test_every_deferred_import_says_why():
    assert undocumented_deferred_imports(_tree()) == []


def test_checker_reports_a_deferred_import_without_a_reason():
    bad = {"hipsched/gpu/_bad.py": "def f():\n    import json  # deferred: a reason\n    from . import a\n"
                                   "    from . import b\n\n\ndef g():\n    x = 1\n    from . import c\n"}
    assert undocumented_deferred_imports(bad) == [("hipsched/gpu/_bad.py", 9)]
