"""Apply each mutant to a copy of the checkout and check that its killing tests fail there."""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mutants.mutant import Mutant

ROOT = Path(__file__).resolve().parents[2]
# the copy needs the sources and what an in-place build left beside them; nothing else
_SKIP_DIRS = {".git", "build", "dist", ".pytest_cache", ".hypothesis", "__pycache__", ".venv", ".whl"}


def all_mutants() -> list[Mutant]:
    import mutants
    found: list[Mutant] = []
    for info in sorted(pkgutil.iter_modules(mutants.__path__), key=lambda i: i.name):
        if info.name in ("mutant", "runner", "__main__"):
            continue
        found += importlib.import_module(f"mutants.{info.name}").MUTANTS
    names = [m.name for m in found]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"mutant names must be unique: {sorted(dup)}")
    return found


def _copy_tree(dst: Path) -> None:
    def ignore(dirpath, names):
        return [n for n in names if n in _SKIP_DIRS or n.endswith(".egg-info")]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def _extension_to_rebuild(path: str) -> str | None:
    """HIPSCHED_BUILD_ONLY's value for a changed file: its .pyx's extension, a .pxd's extensions (its own and
    those that cimport it), or the CPU family whose C it is (src_c/cpu/graph.inc -> graph); "" for a
    shared header (every extension); None when nothing is compiled ahead of time (Python, and the HIP
    sources, compiled at run time)."""
    p = Path(path)
    if p.suffix == ".pyx":
        return p.stem.lstrip("_")
    if p.suffix == ".pxd":
        # a .pxd is compiled into its own extension and into each one that cimports it, directly or
        # through another .pxd (_perfmodel.pxd, inline code with no extension of its own, into four)
        sources = {f: f.read_text() for ext in ("pyx", "pxd") for f in ROOT.glob(f"hipsched/**/*.{ext}")}
        users, todo = {p.stem}, [p.stem]
        while todo:
            name = todo.pop()
            pattern = re.compile(rf"cimport[^\n]*\b{name}\b|\b{name} cimport")
            for f, text in sources.items():
                if f.stem not in users and pattern.search(text):
                    users.add(f.stem)
                    todo.append(f.stem)
        pyx = {f.stem for f in sources if f.suffix == ".pyx"}
        return ",".join(sorted(u.lstrip("_") for u in users & pyx))
    if p.parts[:2] == ("src_c", "cpu"):
        family = p.name.split(".")[0].split("_")[0]
        has_own = list(ROOT.glob(f"hipsched/cpu/_{family}.pyx"))
        return family if has_own else ""
    return None


def run_one(m: Mutant, verbose: bool) -> tuple[bool, str]:
    """(killed, detail)."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        copy = Path(tmp) / "repo"
        _copy_tree(copy)
        target = copy / m.path
        try:
            target.write_text(m.apply(target.read_text()))
        except (ValueError, FileNotFoundError) as e:   # the guarded code moved: this mutant checks nothing now
            return False, str(e)
        env = dict(os.environ, **m.env)
        # the copy's package, not the installed (editable) one: the working directory comes first on
        # sys.path under `python -m pytest`, and PYTHONPATH for any subprocess a test starts
        env["PYTHONPATH"] = str(copy) + os.pathsep + env.get("PYTHONPATH", "")
        only = _extension_to_rebuild(m.path)
        if only is not None:
            build_env = dict(env, HIPSCHED_BUILD_ONLY=only) if only else env
            build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"],
                                   cwd=copy, env=build_env, capture_output=True, text=True)
            if build.returncode != 0:
                return False, "the mutant did not build:\n" + build.stderr[-3000:]
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.pytest_args, *m.kill]
        r = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True)
        tail = "\n".join(r.stdout.splitlines()[-15:])
        if verbose:
            print(tail)
        if r.returncode == 1:
            return True, _first_failure(r.stdout)
        if r.returncode == 0:
            return False, "its tests passed on the mutant:\n" + tail
        return False, f"pytest exited {r.returncode} (not a test failure):\n{tail}\n{r.stderr[-2000:]}"


def _first_failure(out: str) -> str:
    for line in out.splitlines():
        if line.startswith("FAILED ") or line.startswith("ERROR "):
            return line
    return "failed"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/mutants", description=__doc__)
    p.add_argument("names", nargs="*", help="mutants to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and their killing tests")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    ms = all_mutants()
    if a.names:
        unknown = set(a.names) - {m.name for m in ms}
        if unknown:
            p.error(f"no such mutant: {sorted(unknown)}")
        ms = [m for m in ms if m.name in a.names]
    if a.list:
        for m in ms:
            print(f"{m.name}: {m.why}\n    {m.path}\n    killed by: {' '.join(m.kill)}")
        return 0
    if not ms:
        print("no mutants found")
        return 1
    survivors = []
    for m in ms:
        t = time.monotonic()
        killed, detail = run_one(m, a.verbose)
        print(f"{'killed  ' if killed else 'SURVIVED'} {m.name} ({time.monotonic() - t:.0f} s): {detail}", flush=True)
        if not killed:
            survivors.append(m.name)
    print(f"{len(ms) - len(survivors)} killed, {len(survivors)} survived")
    return 1 if survivors else 0
