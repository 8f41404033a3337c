"""The CPU kernels' OpenMP threads sleep between parallel regions instead of spinning (hipsched/
openmp_runtime.py says why: libgomp's default spin of ~8 ms after each region made 15-100% of a demo's
CPU top_k calls on the H100's host take ~7 ms instead of ~0.3 ms, and even a short spin made calls 1.3-3x
slower beside other work). libgomp reports its settings with OMP_DISPLAY_ENV=VERBOSE when it is loaded:
GOMP_SPINCOUNT is 0 when the policy is passive, 300000 by default."""
import os
import subprocess
import sys

import pytest
from requires import need


PROBE = ("import os, hipsched, hipsched.cpu._similarity; "
         "print('env after import:', os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT')); "
         "print('wait:', hipsched.cpu_features()['omp_wait'])")
_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _run(env_extra, probe=PROBE, display=True):
    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    env.update(env_extra)
    if display:
        env["OMP_DISPLAY_ENV"] = "VERBOSE"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def _settings(out, name):
    """Every value libgomp reported for `name` (one per runtime loaded)."""
    got = [line.split("=", 1)[1].strip().strip("'") for line in out.splitlines()
           if line.strip().startswith(name + " =")]
    if not got:
        pytest.fail(f"libgomp did not report {name}:\n{out}")
    return got


def test_openmp_threads_sleep_between_regions_and_the_environment_is_left_alone():
    out = _run({})
    assert _settings(out, "GOMP_SPINCOUNT") == ["0"]
    assert "env after import: None None" in out  # set only around loading libgomp
    assert "wait: passive" in out


@pytest.mark.parametrize("var,value", [("OMP_WAIT_POLICY", "ACTIVE"), ("OMP_WAIT_POLICY", "PASSIVE"),
                                       ("GOMP_SPINCOUNT", "12345")])
def test_a_users_wait_setting_is_kept(var, value):
    out = _run({var: value})
    if var == "OMP_WAIT_POLICY":
        assert _settings(out, "OMP_WAIT_POLICY") == [value]
        spins = _settings(out, "GOMP_SPINCOUNT")
        assert spins == ["0"] if value == "PASSIVE" else len(spins) == 1 and int(spins[0]) > 300000
        assert f"env after import: {value} None" in out
    else:
        assert _settings(out, "GOMP_SPINCOUNT") == [value]
        assert f"env after import: None {value}" in out
    assert f"wait: as {var}={value}" in out


def test_a_torch_imported_after_hipsched_shares_its_runtime():
    # torch's libgomp has the soname of the system's: whichever loads first runs both libraries' regions.
    # Loaded at the first CPU call, hipsched's came after a torch imported in between, and spun ~8 ms.
    need("torch")
    out = _run({}, probe="import hipsched, torch, hipsched.cpu._similarity; "
                         "print('wait:', hipsched.cpu_features()['omp_wait'])")
    assert _settings(out, "GOMP_SPINCOUNT") == ["0"], out
    assert "wait: passive" in out


def test_a_spinning_runtime_loaded_before_hipsched_is_reported():
    probe = ("import ctypes, ctypes.util; ctypes.CDLL(ctypes.util.find_library('gomp') or 'libgomp.so.1'); "
             "import hipsched; print('wait:', hipsched.cpu_features()['omp_wait'])")
    out = _run({}, probe=probe, display=False)
    assert "wait: spin: " in out and "libgomp" in out and "OMP_WAIT_POLICY=PASSIVE" in out, out
