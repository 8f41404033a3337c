"""The CPU kernels' OpenMP threads sleep between parallel regions instead of spinning (hipsched/cpu/
__init__.py says why: on the H100's host, threads left spinning after each region made 15-100% of a
demo's CPU top_k calls take ~7 ms instead of ~0.3 ms, which taught the scheduler a CPU 20x slower than
it is). libgomp reports its settings with OMP_DISPLAY_ENV=VERBOSE when it is loaded: GOMP_SPINCOUNT is
0 when the policy is passive, 300000 by default."""
import os
import subprocess
import sys

import pytest
from requires import need

PROBE = ("import os, hipsched, hipsched.cpu._similarity; "
         "print('env after import:', os.environ.get('OMP_WAIT_POLICY'))")


def _run(env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(env_extra, OMP_DISPLAY_ENV="VERBOSE")
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def _setting(out, name):
    for line in out.splitlines():
        if line.strip().startswith(name + " ="):
            return line.split("=", 1)[1].strip().strip("'")
    pytest.fail(f"libgomp did not report {name}:\n{out}")


def test_openmp_threads_sleep_between_regions_and_the_environment_is_left_alone():
    out = _run({})
    assert _setting(out, "GOMP_SPINCOUNT") == "0"
    assert "env after import: None" in out       # set only around loading libgomp


def test_a_users_wait_policy_is_kept():
    out = _run({"OMP_WAIT_POLICY": "ACTIVE"})
    assert _setting(out, "OMP_WAIT_POLICY") == "ACTIVE"
    assert _setting(out, "GOMP_SPINCOUNT") != "0"
    assert "env after import: ACTIVE" in out


def test_a_torch_imported_after_hipsched_shares_its_sleeping_runtime():
    # torch's libgomp has the soname of the system's: whichever loads first runs both libraries' regions.
    # Loaded at the first CPU call, hipsched's came after a torch imported in between, and spun.
    need("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    probe = ("import hipsched, torch, hipsched.cpu._similarity; "
             "print('wait:', hipsched.cpu_features()['omp_wait'])")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert [_setting(line, "GOMP_SPINCOUNT") for line in out.splitlines() if "GOMP_SPINCOUNT" in line] == ["0"], out
    assert "wait: passive" in out


def test_a_spinning_runtime_loaded_before_hipsched_is_reported():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    probe = ("import ctypes, ctypes.util; ctypes.CDLL(ctypes.util.find_library('gomp') or 'libgomp.so.1'); "
             "import hipsched; print('wait:', hipsched.cpu_features()['omp_wait'])")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wait: spin: " in r.stdout and "libgomp" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                       env={**env, "OMP_WAIT_POLICY": "passive"})
    assert "wait: as OMP_WAIT_POLICY=passive" in r.stdout, r.stdout + r.stderr
