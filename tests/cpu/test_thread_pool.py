"""hipsched's CPU thread pool beside the process's other pools: threadpoolctl lists it by name and limits
it (hipsched/cpu/threadpool.py), and the cap reaches every kernel family's module, those loaded later
included (each module keeps its own copy: src_c/cpu/cpu_features.h)."""
import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
import threadpoolctl   # a dependency of hipsched's, not an optional test package

import hipsched
import hipsched.cpu

FAMILIES = ("attention", "elementwise", "graph", "norm", "quant", "similarity", "features")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _caps():
    return {f: importlib.import_module(f"hipsched.cpu._{f}")._get_num_threads() for f in FAMILIES}


def _hipsched_pools():
    return [i for i in threadpoolctl.threadpool_info() if i["internal_api"] == "hipsched"]


@pytest.mark.parametrize("policy", [None, "ACTIVE"])
def test_threadpool_info_lists_hipsched_once_its_compute_is_loaded(policy):
    # (`import hipsched` alone loads nothing compiled, so that log tools run on a bare checkout: the pool's
    # library is loaded, and registered, with the Executor or the first op)
    code = ("import hipsched, threadpoolctl\n"
            "hipsched.Executor\n"
            "print([i['internal_api'] for i in threadpoolctl.threadpool_info()].count('hipsched'))\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:   # the user's own wait policy: hipsched then leaves libgomp's loading alone
        env["OMP_WAIT_POLICY"] = policy
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1"]


def test_threadpool_info_describes_hipsched():
    pools = _hipsched_pools()
    assert len(pools) == 1
    info = pools[0]
    assert info["user_api"] == "openmp" and info["version"] == hipsched.__version__
    assert "hipsched" in info["filepath"] and os.path.basename(info["filepath"]).startswith("_features")
    assert info["num_threads"] == hipsched.cpu_features()["threads"] == hipsched.cpu.get_num_threads()


@pytest.mark.parametrize("user_api", [None, "openmp"])
def test_threadpool_limits_limits_every_family_and_restores(user_api):
    before = _caps()
    assert len(set(before.values())) == 1
    with threadpoolctl.threadpool_limits(limits=1, user_api=user_api):
        assert _caps() == {f: 1 for f in FAMILIES}
        assert _hipsched_pools()[0]["num_threads"] == 1 == hipsched.cpu_features()["threads"]
        # the kernels still give the same results on one thread
        x = np.random.default_rng(0).standard_normal((64, 300), dtype=np.float32)
        np.testing.assert_array_equal(hipsched.scale(x, 3.0), x * np.float32(3.0))
    assert _caps() == before


def test_set_num_threads_validates_and_resets():
    default = hipsched.cpu.get_num_threads()
    try:
        hipsched.cpu.set_num_threads(3)
        assert set(_caps().values()) == {3}
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="set_num_threads"):
                hipsched.cpu.set_num_threads(bad)
    finally:
        hipsched.cpu.set_num_threads(None)
    assert set(_caps().values()) == {default}


def test_a_family_loaded_after_the_limit_starts_with_it():
    code = ("import threadpoolctl, sys, hipsched.cpu\n"
            "assert 'hipsched.cpu._graph' not in sys.modules\n"
            # hipsched's pool alone (limiting libgomp as well would lower the late module's default to 1)
            "with threadpoolctl.ThreadpoolController().select(internal_api='hipsched').limit(limits=1):\n"
            "    from hipsched.cpu import _graph\n"
            "    print(_graph._get_num_threads())\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HIPSCHED_NUM_THREADS="2"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1"]
