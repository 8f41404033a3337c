"""Review: config and model-store edge cases."""
import json
import warnings

import pytest

from hipsched import Executor
from hipsched.config import HybridConfig
from hipsched.model_store import model_key, model_path

from fake_gpu import FakeGpuBackend


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
