"""HybridConfig sources and validation, fault-spec parsing, and the persisted model (round trip across
executors, corrupt and foreign files ignored with a warning)."""
import json
import os

import numpy as np
import pytest

from hipsched import Executor
from hipsched.config import ConfigError, HybridConfig
from hipsched.faults import parse_fault_spec
from hipsched import model_store

from fake_gpu import FakeGpuBackend


def test_seed_defaults():
    c = HybridConfig(config_file=False, env={})
    assert (c.gpu_min_batch_size, c.gpu_success_rate_threshold, c.performance_window_size, c.force_cpu_mode,
            c.telemetry_enabled, c.strategy, c.gpu_speedup_threshold) == (64, 0.95, 100, False, True, "automatic", 1.0)


def test_precedence_defaults_toml_env_args(tmp_path):
    toml = tmp_path / "hipsched.toml"
    toml.write_text('[hipsched]\ngpu_min_batch_size = 128\nstrategy = "cpu_preferred"\nmin_samples = 5\n')
    env = {"HIPSCHED_CONFIG": str(toml), "HIPSCHED_STRATEGY": "gpu_preferred", "HIPSCHED_MIN_SAMPLES": "7",
           "HIPSCHED_FORCE_CPU_MODE": "yes"}
    c = HybridConfig(env=env, min_samples=9)
    assert c.gpu_min_batch_size == 128          # TOML over default
    assert c.strategy == "gpu_preferred"        # env over TOML
    assert c.min_samples == 9                   # argument over env
    assert c.force_cpu_mode is True
    assert c.performance_window_size == 100     # untouched default


def test_toml_top_level_keys_and_no_fallback_env(tmp_path):
    toml = tmp_path / "x.toml"
    toml.write_text("gpu_speedup_threshold = 1.5\n")
    c = HybridConfig(config_file=str(toml), env={"HIPSCHED_NO_FALLBACK": "1"})
    assert c.gpu_speedup_threshold == 1.5 and c.allow_fallback is False


@pytest.mark.parametrize("kwargs,words", [
    ({"gpu_success_rate_threshold": 1.5}, ["gpu_success_rate_threshold", "1.5", "[0, 1]"]),
    ({"strategy": "fastest"}, ["strategy", "'fastest'", "automatic, gpu_preferred"]),
    ({"performance_window_size": 0}, ["performance_window_size", "0", "[1, 100000]"]),
    ({"gpu_min_batch_size": "big"}, ["gpu_min_batch_size", "'big'", "an integer"]),
    ({"force_cpu_mode": 1}, ["force_cpu_mode", "1", "true or false"]),
    ({"min_samples": 500}, ["min_samples", "500", "performance_window_size"]),
    ({"fault_inject": "launch=2"}, ["fault_inject", "launch=2", "outside [0, 1]"]),
    ({"no_such_key": 1}, ["unknown key", "no_such_key", "known keys"]),
])
def test_validation_names_key_value_and_allowed(kwargs, words):
    with pytest.raises(ConfigError) as ei:
        HybridConfig(config_file=False, env={}, **kwargs)
    for w in words:
        assert w in str(ei.value)


def test_env_errors_name_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="HIPSCHED_PERFORMANCE_WINDOW_SIZE"):
        HybridConfig(config_file=False, env={"HIPSCHED_PERFORMANCE_WINDOW_SIZE": "lots"})
    with pytest.raises(ConfigError, match=r"gpu_min_batch_size=-1 \(from environment variable"):
        HybridConfig(config_file=False, env={"HIPSCHED_GPU_MIN_BATCH_SIZE": "-1"})
    bad = tmp_path / "bad.toml"
    bad.write_text("strategy = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        HybridConfig(config_file=str(bad), env={})


def test_num_threads_is_a_read_only_mirror(monkeypatch):
    monkeypatch.setenv("HIPSCHED_NUM_THREADS", "3")
    assert HybridConfig(config_file=False).num_threads == 3
    with pytest.raises(ConfigError, match="unknown key"):
        HybridConfig(config_file=False, env={}, num_threads=4)


def test_fault_spec_parsing():
    assert parse_fault_spec("launch=0.2,oom=0.05,seed=7") == ({"launch": 0.2, "oom": 0.05}, 7)
    for bad, msg in [("boom=0.1", "unknown"), ("launch", "key=value"), ("launch=x", "not a number"),
                     ("launch=0.7,oom=0.6", "add up"), ("seed=x", "not an integer")]:
        with pytest.raises(ValueError, match=msg):
            parse_fault_spec(bad)


def _learn(ex, rng):
    x = rng.standard_normal((64, 64), dtype=np.float32)
    for _ in range(4):
        ex.add(x, x, backend="cpu")
        ex.add(x, x, backend="gpu")


def test_model_round_trip(tmp_path, rng):
    gpu = FakeGpuBackend()
    a = Executor(gpu_backend=gpu, cache_dir=str(tmp_path), telemetry_enabled=False)
    _learn(a, rng)
    sel_a = a.select_backend("add", size=4096, nbytes=49152)
    a.close()
    files = list(tmp_path.glob("model-*.json"))
    assert len(files) == 1
    b = Executor(gpu_backend=FakeGpuBackend(), cache_dir=str(tmp_path), telemetry_enabled=False)
    sel_b = b.select_backend("add", size=4096, nbytes=49152)
    assert sel_b == sel_a and sel_b.estimated_cost["cpu"] is not None
    assert b.performance_tracker.samples("add", "gpu") == a.performance_tracker.samples("add", "gpu")
    assert b._core.transfer_model()["h2d_gbps"] == pytest.approx(20.0)
    # another device is another model: nothing loaded
    other = FakeGpuBackend()
    other.device_name = "FakeGPU 2"
    c = Executor(gpu_backend=other, cache_dir=str(tmp_path), telemetry_enabled=False)
    assert c.select_backend("add", size=4096).estimated_cost == {"cpu": None, "gpu": None}


def test_corrupt_or_foreign_model_file_is_ignored_with_a_warning(tmp_path, rng):
    ex = Executor(gpu_backend=FakeGpuBackend(), cache_dir=str(tmp_path), telemetry_enabled=False)
    _learn(ex, rng)
    path = ex.save_model()
    key = ex._model.key
    good = json.loads(open(path).read())
    alive = []  # an executor saves its model when collected: keep these until the checks are done
    for content in ["{not json", json.dumps({"format": 99}), json.dumps(dict(good, samples=[{"op": "add"}])),
                    json.dumps(dict(good, samples=[{"op": "add", "dtype": "float32", "cpu": [[1, -5]], "gpu": []}]))]:
        with open(path, "w") as fh:
            fh.write(content)
        with pytest.warns(RuntimeWarning, match="ignored"):
            assert model_store.load_model(path, key) is None
        with pytest.warns(RuntimeWarning):
            fresh = Executor(gpu_backend=FakeGpuBackend(), cache_dir=str(tmp_path), telemetry_enabled=False)
        alive.append(fresh)
        assert fresh.performance_tracker.samples("add", "cpu") == []
    with open(path, "w") as fh:
        json.dump(dict(good, key=dict(key, host="elsewhere")), fh)
    with pytest.warns(RuntimeWarning, match="written for"):
        assert model_store.load_model(path, key) is None


def test_save_is_atomic(tmp_path):
    path = str(tmp_path / "sub" / "model-x.json")
    model_store.save_model(path, {"k": 1}, {("add", "float32"): [[(1.0, 2.0)], []]}, None)
    assert os.listdir(tmp_path / "sub") == ["model-x.json"]   # no temp file left behind
    assert model_store.load_model(path, {"k": 1}) == ({("add", "float32"): [[(1.0, 2.0)], []]}, None)


def test_a_new_process_starts_with_the_saved_model(tmp_path):
    """The module-level default executor is never closed: its model is saved at interpreter exit and
    the next process loads it."""
    import subprocess
    import sys
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env.pop("HIPSCHED_CACHE_DIR", None)
    first = ("import numpy as np, hipsched as hs\n"
             "for _ in range(5): hs.scale(np.ones(4096, np.float32), 2.0)\n")
    subprocess.run([sys.executable, "-c", first], env=env, check=True, timeout=120)
    assert list((tmp_path / "hipsched").glob("model-*.json"))
    second = ("import hipsched as hs\n"
              "print(sum(b[1] for b in hs.default_executor().performance_tracker.samples('scale', 'cpu')))\n")
    r = subprocess.run([sys.executable, "-c", second], env=env, check=True, timeout=120, capture_output=True,
                       text=True)
    assert int(r.stdout.strip()) == 5


_ANY_CONTENT = {
    "deep nesting": "[" * 100000,                                      # RecursionError in json
    # int too large to convert to float, in a file written for this very host and version
    "400-digit number": '{"format": 1, "key": KEY, "samples": [{"op": "add", "dtype": "float32", "cpu": [['
                        + "9" * 400 + ', 1.0]], "gpu": []}]}',
    "binary": "\x00\xff\xfe garbage",
    "empty": "",
    "a number where samples go": '{"format": 1, "key": null, "samples": 5}',
}


@pytest.mark.parametrize("content", list(_ANY_CONTENT.values()), ids=list(_ANY_CONTENT))
def test_any_model_file_content_is_a_miss_with_one_warning(tmp_path, content):
    import warnings
    import hipsched
    key = model_store.model_key(None, hipsched.__version__)
    path = model_store.model_path(str(tmp_path), key)
    with open(path, "w", encoding="latin-1") as fh:
        fh.write(content.replace("KEY", json.dumps(key)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ex = Executor(cache_dir=str(tmp_path), telemetry_enabled=False, persist_model=True)
    try:
        mine = [w for w in caught if "model file" in str(w.message)]
        assert len(mine) == 1 and issubclass(mine[0].category, RuntimeWarning)
        assert ex.performance_tracker.samples("add", "cpu") == []
    finally:
        ex._save_at_exit.detach()
        ex.close()


@pytest.mark.parametrize("content", [_ANY_CONTENT["deep nesting"], _ANY_CONTENT["400-digit number"]],
                         ids=["deep nesting", "400-digit number"])
def test_module_level_ops_survive_a_bad_default_model_file(tmp_path, content):
    # the default executor behind hs.add loads the default model file: a bad one made every call raise
    import subprocess
    import sys
    import hipsched
    key = model_store.model_key(None, hipsched.__version__)
    with open(model_store.model_path(str(tmp_path), key), "w") as fh:
        fh.write(content.replace("KEY", json.dumps(key)))
    env = dict(os.environ, HIPSCHED_CACHE_DIR=str(tmp_path), HIPSCHED_GPU_RUNTIME="none")
    r = subprocess.run([sys.executable, "-c", "import numpy as np, hipsched as hs; print(hs.add(np.ones(2), 1.0))"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2. 2.]" and r.stderr.count("RuntimeWarning") == 1


# ----------------------------------------------------------------------------------------------------
# Regressions (folded from test_review_sched_config.py): Review: config and model-store edge cases.
# ----------------------------------------------------------------------------------------------------
import warnings


from hipsched.config import HybridConfig
from hipsched.model_store import model_key, model_path



@pytest.mark.parametrize("raw,allowed", [("1", False), ("true", False), ("yes", False), ("on", False),
                                         ("0", True), ("false", True), ("no", True), ("off", True),
                                         ("", True), ("FALSE", True)])
def test_no_fallback_env_is_a_boolean(raw, allowed):
    cfg = HybridConfig(config_file=False, env={"HIPSCHED_NO_FALLBACK": raw})
    assert cfg.allow_fallback is allowed


def test_no_fallback_env_rejects_garbage():
    with pytest.raises(ValueError):
        HybridConfig(config_file=False, env={"HIPSCHED_NO_FALLBACK": "maybe"})


def test_int_env_with_underscores_and_hex():
    cfg = HybridConfig(config_file=False, env={"HIPSCHED_GPU_MIN_BATCH_SIZE": "1_024",
                                               "HIPSCHED_REPROBE_INTERVAL": "0x10"})
    assert cfg.gpu_min_batch_size == 1024 and cfg.reprobe_interval == 16


def _model_file(gpu, tmp_path):
    """The model key and file an Executor with this GPU and cache dir loads at start."""
    import hipsched
    key = model_key(gpu.device_name, hipsched.__version__)
    return key, model_path(str(tmp_path), key)


@pytest.mark.parametrize("transfer", [{"h2d_latency_us": 1, "h2d_gbps": 0, "d2h_latency_us": 1, "d2h_gbps": 1},
                                      {"h2d_latency_us": -1, "h2d_gbps": 1, "d2h_latency_us": 1, "d2h_gbps": 1},
                                      {"h2d_latency_us": 1, "h2d_gbps": float("nan"), "d2h_latency_us": 1,
                                       "d2h_gbps": 1}])
def test_model_file_with_bad_transfer_is_ignored_not_fatal(tmp_path, transfer):
    gpu = FakeGpuBackend()
    key, path = _model_file(gpu, tmp_path)
    with open(path, "w") as fh:
        json.dump({"format": 1, "key": key, "transfer": transfer,
                   "samples": [{"op": "add", "dtype": "float32", "cpu": [[100, 5.0]], "gpu": []}]}, fh)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ex = Executor(gpu_backend=gpu, cache_dir=str(tmp_path), persist_model=True, telemetry_path=None)
    try:
        assert any(issubclass(x.category, RuntimeWarning) for x in w)
        tm = ex._core.transfer_model()
        assert tm["h2d_gbps"] == 20.0  # measured, since the file's model was refused
    finally:
        ex._save_at_exit.detach()
        ex.close()


@pytest.mark.parametrize("key", ["gpu_min_batch_size", "reprobe_interval", "breaker_failures"])
def test_large_integer_settings_do_not_overflow_the_core(key):
    ex = Executor(gpu_backend=FakeGpuBackend(), persist_model=False, telemetry_path=None, **{key: 2 ** 40})
    import numpy as np
    a = np.ones((64, 64), np.float32)
    np.testing.assert_array_equal(ex.add(a, a), a + a)
    if key == "gpu_min_batch_size":
        assert ex.events[-1]["reason"] == "below_min_batch"
        assert ex.select_backend("add", size=2 ** 39).reason.value == "below_min_batch"
    ex.close()


def test_model_file_with_too_many_slots_does_not_break_start(tmp_path):
    gpu = FakeGpuBackend()
    key, path = _model_file(gpu, tmp_path)
    with open(path, "w") as fh:
        json.dump({"format": 1, "key": key, "transfer": None,
                   "samples": [{"op": f"op{i}", "dtype": "float32", "cpu": [[100, 5.0]], "gpu": []}
                               for i in range(600)]}, fh)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ex = Executor(gpu_backend=gpu, cache_dir=str(tmp_path), persist_model=True, telemetry_path=None)
    try:
        assert any(issubclass(x.category, RuntimeWarning) for x in w)
        import numpy as np
        a = np.ones(8, np.float32)
        np.testing.assert_array_equal(ex.add(a, a), a + a)
    finally:
        ex._save_at_exit.detach()
        ex.close()


def test_gpu_devices_from_arguments_env_and_toml(tmp_path):
    assert HybridConfig(config_file=False, env={}).gpu_devices is None              # every device found
    assert HybridConfig(config_file=False, env={"HIPSCHED_GPU_DEVICES": "1,0"}).gpu_devices == [1, 0]
    assert HybridConfig(config_file=False, env={"HIPSCHED_GPU_DEVICES": "all"}).gpu_devices is None
    toml = tmp_path / "h.toml"
    toml.write_text("[hipsched]\ngpu_devices = [2]\n")
    assert HybridConfig(config_file=str(toml), env={}).gpu_devices == [2]
    for bad in ([], [0, 0], [-1], ["0"], [True]):
        with pytest.raises(ConfigError, match="gpu_devices"):
            HybridConfig(config_file=False, env={}, gpu_devices=bad)
    with pytest.raises(ConfigError, match="HIPSCHED_GPU_DEVICES"):
        HybridConfig(config_file=False, env={"HIPSCHED_GPU_DEVICES": "0,x"})


def test_toml_hipsched_key_not_a_table_is_a_config_error(tmp_path):
    p = tmp_path / "h.toml"
    p.write_text("hipsched = 1\n")
    with pytest.raises(ValueError):
        HybridConfig(config_file=str(p), env={})


def test_int_env_with_leading_zero_is_decimal():
    cfg = HybridConfig(config_file=False, env={"HIPSCHED_GPU_MIN_BATCH_SIZE": "064", "HIPSCHED_REPROBE_INTERVAL": "0b11"})
    assert cfg.gpu_min_batch_size == 64 and cfg.reprobe_interval == 3
    with pytest.raises(ValueError):
        HybridConfig(config_file=False, env={"HIPSCHED_GPU_MIN_BATCH_SIZE": "12abc"})
