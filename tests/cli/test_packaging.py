"""What a new user meets first: a checkout with nothing built. Log analysis must work there with the
standard library alone (performance engineers read logs from GPU machines on laptops), and anything
that needs the compiled modules must say in one line what happened and which command fixes it,
never a circular-import traceback. The README's two commands themselves are run verbatim, in fresh
virtual environments, by .ci/run."""
import os
import shutil
import subprocess
import sys

import pytest

from telemetry_synth import write_known_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# no site-packages (so no NumPy, no installed hipsched), no environment, no user site: the standard
# library and whatever the current directory holds
BARE = [sys.executable, "-S", "-E", "-s"]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the source tree as a fresh clone has it: no compiled modules, no generated C."""
    dst = tmp_path_factory.mktemp("clone") / "hipsched-src"
    ignore = shutil.ignore_patterns("*.so", "*.pyd", "_*.c", "__pycache__", "build", "*.egg-info", ".git",
                                    ".pytest_cache", ".hypothesis", "results")
    for name in ("hipsched", "tools", "src_c"):
        shutil.copytree(os.path.join(ROOT, name), dst / name, ignore=ignore)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), dst / name)
    assert not list(dst.rglob("*.so"))
    return dst


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("log") / "run.jsonl"
    write_known_log(path)
    return str(path)


def _run(cmd, cwd, timeout=120, env=None):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def numpy_only(tmp_path_factory):
    """An environment for a site-less interpreter that sees NumPy but no installed hipsched (an
    editable install's import hook would otherwise fill in the clone's missing modules)."""
    import numpy
    d = tmp_path_factory.mktemp("numpy_only")
    os.symlink(os.path.dirname(numpy.__file__), d / "numpy")
    return dict(os.environ, PYTHONPATH=str(d))


def test_analyze_script_runs_on_the_standard_library_alone(checkout, log, tmp_path):
    r = _run(BARE + [str(checkout / "tools" / "analyze.py"), log, "--trace", str(tmp_path / "t.json")], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Per op and backend" in r.stdout and (tmp_path / "t.json").stat().st_size > 0


def test_analyze_json_output_without_numpy(checkout, log, tmp_path):
    r = _run(BARE + [str(checkout / "tools" / "analyze.py"), log, "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout)


def test_monitor_summary_from_the_unbuilt_checkout(checkout, log):
    r = _run(BARE + ["-m", "hipsched", "monitor", log, "--summary"], checkout)
    assert r.returncode == 0, r.stderr
    assert "matmul" in r.stdout and "0 malformed lines" in r.stdout


def test_importing_telemetry_loads_no_compiled_module_and_no_numpy(checkout):
    code = ("import sys, hipsched.telemetry, hipsched.telemetry.analysis\n"
            "bad = [m for m in sys.modules if m == 'numpy' or m.startswith(('hipsched._', 'hipsched.cpu',"
            " 'hipsched.executor', 'hipsched.gpu'))]\n"
            "assert not bad, bad\n")
    r = _run(BARE + ["-c", code], checkout)
    assert r.returncode == 0, r.stderr


def test_unbuilt_checkout_says_what_to_do_in_one_line(checkout, numpy_only):
    # NumPy present this time, so the demo gets as far as needing the compiled modules
    r = _run([sys.executable, "-S", "-s", "-m", "hipsched", "demo", "--quick", "--no-progress"], checkout,
             env=numpy_only)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "unbuilt source tree" in lines[0] and "pip install -e" in lines[0]
    assert "circular import" not in r.stderr and "Traceback" not in r.stderr


def test_unbuilt_checkout_import_error_names_the_fix(checkout, numpy_only):
    r = _run([sys.executable, "-S", "-s", "-c", "import hipsched; hipsched.Executor"], checkout, env=numpy_only)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("hipsched.errors.BuildMissingError: ") and "pip install -e" in last
    assert "circular import" not in r.stderr
    # `from . import _sched` inside the package reports the same, not Python's circular-import text
    r = _run([sys.executable, "-S", "-s", "-c", "import hipsched.executor"], checkout, env=numpy_only)
    assert "BuildMissingError" in r.stderr and "circular import" not in r.stderr


def test_module_level_names_resolve_lazily():
    import hipsched
    assert {"Executor", "top_k", "QuantizedTensor", "OpType"} <= set(dir(hipsched))
    # what the package imports for its own use is not part of what it offers
    assert not {"os", "threading", "importlib", "annotations"} & set(dir(hipsched))
    assert hipsched.top_k.__doc__ == hipsched.Executor.top_k.__doc__
    with pytest.raises(AttributeError):
        hipsched.no_such_name


def _setup_py(monkeypatch):
    """setup.py's globals and what it hands setup(), run with setup() and cythonize() stood in for."""
    import runpy
    import types
    import setuptools
    captured = {}
    fake = types.ModuleType("Cython.Build")
    fake.cythonize = lambda exts, **kw: captured.update(cythonize=kw) or exts
    monkeypatch.setitem(sys.modules, "Cython", types.ModuleType("Cython"))
    monkeypatch.setitem(sys.modules, "Cython.Build", fake)
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("HIPSCHED_BUILD_JOBS", raising=False)
    monkeypatch.delenv("HIPSCHED_CYTHON_JOBS", raising=False)
    return runpy.run_path(os.path.join(ROOT, "setup.py")), captured


def test_the_build_uses_every_core(monkeypatch):
    """`pip install .` compiled for minutes on one core: Cython and build_ext default to the core count."""
    import setuptools
    g, captured = _setup_py(monkeypatch)
    cores = os.cpu_count()
    assert captured["cythonize"]["nthreads"] == cores
    cmd = captured["cmdclass"]["build_ext"](setuptools.Distribution({"ext_modules": captured["ext_modules"]}))
    cmd.initialize_options()
    cmd.finalize_options()
    assert cmd.parallel == cores


def test_one_extensions_c_files_compile_side_by_side(monkeypatch):
    import threading
    import time
    g, _ = _setup_py(monkeypatch)
    monkeypatch.setitem(g["compile_in_parallel"].__globals__, "_slots", threading.BoundedSemaphore(3))
    monkeypatch.setitem(g["compile_in_parallel"].__globals__, "JOBS", 3)
    state = {"now": 0, "most": 0, "done": []}
    lock = threading.Lock()

    class Compiler:
        def _setup_compile(self, output_dir, macros, include_dirs, sources, depends, extra):
            objs = [s + ".o" for s in sources]
            return macros, objs, extra, [], {o: (s, ".c") for o, s in zip(objs, sources)}

        def _get_cc_args(self, pp_opts, debug, before):
            return []

        def _compile(self, obj, src, ext, cc_args, extra_postargs, pp_opts):
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            time.sleep(0.2)
            with lock:
                state["now"] -= 1
                state["done"].append(obj)

    objs = g["compile_in_parallel"](Compiler(), [f"f{i}.c" for i in range(6)])
    assert objs == [f"f{i}.c.o" for i in range(6)] and sorted(state["done"]) == sorted(objs)
    assert state["most"] == 3   # as many at once as allowed, and no more


def test_dependencies_include_what_the_package_imports():
    from requires import tomllib   # the standard library's, or tomli before Python 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps}
    assert {"numpy", "threadpoolctl", "tqdm"} <= names
