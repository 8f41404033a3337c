"""HybridConfig: every scheduler, fallback and telemetry setting in one validated dataclass.

Sources, later wins: defaults < TOML file (HIPSCHED_CONFIG, else ./hipsched.toml) < HIPSCHED_<KEY>
environment variables < constructor arguments. Values are checked when the object is built; a bad one
raises ConfigError naming the key, the value, where it came from, and what is allowed."""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field

from .errors import HipschedError

STRATEGIES = ("automatic", "gpu_preferred", "cpu_preferred", "backend_only")


class ConfigError(HipschedError, ValueError):
    """A configuration value that is not allowed."""


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hipsched")


def _num_threads() -> int:
    v = os.environ.get("HIPSCHED_NUM_THREADS", "")
    return int(v) if v.isdigit() and int(v) > 0 else (os.cpu_count() or 1)


@dataclass(init=False)
class HybridConfig:
    # the seeds' fields
    gpu_min_batch_size: int = 64                 # calls smaller than this (Call.size) stay on the CPU
    gpu_success_rate_threshold: float = 0.95     # GPU success rate over the window below which the breaker opens
    performance_window_size: int = 100           # latencies kept per size bucket; outcomes kept per op
    force_cpu_mode: bool = False
    telemetry_enabled: bool = True
    # strategy
    strategy: str = "automatic"                  # automatic | gpu_preferred | cpu_preferred | backend_only
    backend: str = "cpu"                         # the backend used by strategy="backend_only": cpu | gpu
    gpu_speedup_threshold: float = 1.0           # GPU chosen when predicted cpu/gpu time exceeds this (1.5: conservative)
    # learning
    min_samples: int = 3                         # samples a size bucket needs on a side before it is trusted
    exploration_share: float = 0.2               # share of an under-sampled bucket's calls sent to learn (0..1)
    reprobe_interval: int = 200                  # 1 call in this many re-measures the losing side (0 = never)
    # splitting one call across the CPU and the GPU (hipsched/splitting.py, docs/guide/splitting.md)
    split: bool = True                           # False: every call runs whole on one side
    split_min_us: float = 5000.0                 # calls the model predicts faster than this stay whole
    # a GPU kernel not yet compiled is compiled on a thread of its own while its automatic calls run on
    # the CPU (False: the first call waits for the compiler)
    background_compile: bool = True
    # GPU health
    breaker_failures: int = 3                    # consecutive GPU failures that open the circuit breaker
    breaker_cooldown_s: float = 5.0              # seconds open before one half-open probe call
    health_min_samples: int = 20                 # outcomes needed before the success rate can open the breaker
    # fallback and faults
    allow_fallback: bool = True                  # False: a GPU error is raised, never silently rerun on the CPU
    fault_inject: str = ""                       # "launch=0.2,oom=0.05,seed=7" (see hipsched/faults.py)
    # persistence
    cache_dir: str = field(default_factory=_default_cache_dir)
    persist_model: bool = True                   # load the learned model at start, save it at close/calibrate
    # telemetry
    telemetry_path: str | None = None            # JSONL file; None keeps events in memory only
    telemetry_ring_size: int = 10000
    telemetry_queue_size: int = 65536
    telemetry_rotate_bytes: int = 64 << 20
    telemetry_worker: str | None = None          # `worker` field of every event (hipsched.dask sets it per worker)
    telemetry_job: str | None = None             # `job` field of every event (the distributed job's id)
    # GPU
    gpu_device_id: int = 0                       # which device the GPU backend binds
    # the devices an executor uses, the first being the one backend="gpu" means (the others take parts of
    # split calls); None: gpu_device_id first, then every other device the runtime finds
    gpu_devices: list[int] | None = None
    # device bytes the GPU backend may keep as a resident cache; None ("auto"): half the device memory
    # free when the backend starts (hipsched.gpu.memory.resident_cache.DEFAULT_RESIDENT_SHARE)
    resident_bytes: int | None = None
    # read-only mirror of HIPSCHED_NUM_THREADS (the CPU kernels read it once at import)
    num_threads: int = field(default_factory=_num_threads, init=False)

    def __init__(self, *, config_file: str | None = None, env=None, **kwargs):
        """Layers defaults < TOML < environment < `kwargs`. `config_file` names the TOML file (False:
        none); `env` replaces os.environ (tests pass {} for a clean slate)."""
        env = os.environ if env is None else env
        values, origin = _layered(config_file, env)
        for key, v in kwargs.items():
            values[key] = v
            origin[key] = "argument"
        names = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(k for k in values if k not in names or not names[k].init)
        if unknown:
            where = ", ".join(f"{k} ({origin.get(k, '?')})" for k in unknown)
            known = ", ".join(sorted(k for k, f in names.items() if f.init))
            raise ConfigError(f"hipsched config: unknown key(s) {where}; known keys: {known}")
        for key, f in names.items():
            if key in values:
                setattr(self, key, values[key])
            elif f.default is not dataclasses.MISSING:
                setattr(self, key, f.default)
            else:
                setattr(self, key, f.default_factory())
        self.validate(origin)

    # ------------------------------------------------------------------ validation
    def validate(self, origin: dict | None = None):
        origin = origin or {}

        def bad(key, allowed):
            src = f" (from {origin[key]})" if key in origin else ""
            raise ConfigError(f"hipsched config: {key}={getattr(self, key)!r}{src} is not allowed; expected {allowed}")

        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            t = f.type
            if t == "bool" and not isinstance(v, bool):
                bad(f.name, "true or false")
            if t == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                bad(f.name, "an integer")
            if t == "float":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                    bad(f.name, "a number")
                setattr(self, f.name, float(v))
        if isinstance(self.gpu_devices, str) and self.gpu_devices.strip().lower() in ("all", "none", ""):
            self.gpu_devices = None   # a TOML file's spelling of the default
        if isinstance(self.gpu_devices, tuple):
            self.gpu_devices = list(self.gpu_devices)
        if isinstance(self.resident_bytes, str) and self.resident_bytes.strip().lower() in ("auto", "none"):
            self.resident_bytes = None   # a TOML file's spelling of the default
        checks = {
            "gpu_min_batch_size": (self.gpu_min_batch_size >= 0, "an integer >= 0"),
            "gpu_success_rate_threshold": (0.0 <= self.gpu_success_rate_threshold <= 1.0, "a number in [0, 1]"),
            "performance_window_size": (1 <= self.performance_window_size <= 100000, "an integer in [1, 100000]"),
            "strategy": (self.strategy in STRATEGIES, "one of " + ", ".join(STRATEGIES)),
            "backend": (self.backend in ("cpu", "gpu"), "cpu or gpu"),
            "gpu_speedup_threshold": (0.0 < self.gpu_speedup_threshold < float("inf"), "a finite number > 0"),
            "min_samples": (1 <= self.min_samples <= self.performance_window_size,
                            "an integer in [1, performance_window_size]"),
            "exploration_share": (0.0 <= self.exploration_share <= 1.0, "a number in [0, 1]"),
            "reprobe_interval": (self.reprobe_interval >= 0, "an integer >= 0 (0 disables re-probing)"),
            "split_min_us": (0.0 <= self.split_min_us < float("inf"), "a finite number of microseconds >= 0"),
            "breaker_failures": (self.breaker_failures >= 1, "an integer >= 1"),
            "breaker_cooldown_s": (0.0 <= self.breaker_cooldown_s < float("inf"), "a finite number >= 0"),
            "health_min_samples": (1 <= self.health_min_samples <= self.performance_window_size,
                                   "an integer in [1, performance_window_size]"),
            "fault_inject": (isinstance(self.fault_inject, str), "a string like 'launch=0.2,oom=0.05,seed=7'"),
            "cache_dir": (isinstance(self.cache_dir, str) and self.cache_dir != "", "a directory path"),
            "telemetry_path": (self.telemetry_path is None or isinstance(self.telemetry_path, str),
                               "a file path or None"),
            "telemetry_worker": (self.telemetry_worker is None or isinstance(self.telemetry_worker, str),
                                 "a string or None"),
            "telemetry_job": (self.telemetry_job is None or isinstance(self.telemetry_job, str), "a string or None"),
            "telemetry_ring_size": (self.telemetry_ring_size >= 1, "an integer >= 1"),
            "telemetry_queue_size": (self.telemetry_queue_size >= 1, "an integer >= 1"),
            "telemetry_rotate_bytes": (self.telemetry_rotate_bytes >= 4096, "an integer >= 4096"),
            "resident_bytes": (self.resident_bytes is None or (isinstance(self.resident_bytes, int) and not
                                                               isinstance(self.resident_bytes, bool) and
                                                               self.resident_bytes >= 0),
                               "an integer >= 0, or 'auto' (half the free device memory)"),
            "gpu_device_id": (self.gpu_device_id >= 0, "an integer >= 0"),
            "gpu_devices": (self.gpu_devices is None or (
                isinstance(self.gpu_devices, (list, tuple)) and len(self.gpu_devices) > 0
                and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.gpu_devices)
                and len(set(self.gpu_devices)) == len(self.gpu_devices)),
                "None ('all': every device), or a non-empty list of distinct device indices >= 0"),
        }
        for key, (ok, allowed) in checks.items():
            if not ok:
                bad(key, allowed)
        if self.fault_inject:
            # deferred: only with fault injection asked for; config is on log analysis's path, which loads nothing more
            from .faults import parse_fault_spec
            try:
                parse_fault_spec(self.fault_inject)
            except ValueError as e:
                bad("fault_inject", str(e))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _layered(config_file, env) -> tuple[dict, dict]:
    """Values and where each came from: the TOML file, then HIPSCHED_* variables over it."""
    values, origin = {}, {}
    path = config_file
    if path is None:
        path = env.get("HIPSCHED_CONFIG") or ("hipsched.toml" if os.path.exists("hipsched.toml") else None)
    if path:
        values.update(_read_toml(path))
        origin.update({k: f"config file {path}" for k in values})
    for f in dataclasses.fields(HybridConfig):
        raw = env.get("HIPSCHED_" + f.name.upper())
        if raw is not None and f.init:
            values[f.name] = _parse_env(f.name, raw, f.type)
            origin[f.name] = f"environment variable HIPSCHED_{f.name.upper()}"
    raw = env.get("HIPSCHED_NO_FALLBACK")
    if raw is not None and raw.strip() and _parse_env("no_fallback", raw, "bool"):  # "false"/"off": fallback stays
        values["allow_fallback"] = False
        origin["allow_fallback"] = "environment variable HIPSCHED_NO_FALLBACK"
    return values, origin


def _read_toml(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as e:
        raise ConfigError(f"hipsched config: cannot read config file {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"hipsched config: config file {path} is not valid TOML: {e}") from None
    table = data.get("hipsched", data)  # a [hipsched] table or top-level keys
    if not isinstance(table, dict):
        raise ConfigError(f"hipsched config: in config file {path}, 'hipsched' must be a table, got {table!r}")
    return dict(table)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_env(key: str, raw: str, typ: str):
    name = "HIPSCHED_" + key.upper()
    s = raw.strip()
    try:
        if typ == "bool":
            if s.lower() in _TRUE:
                return True
            if s.lower() in _FALSE:
                return False
            raise ValueError("expected one of " + ", ".join(_TRUE + _FALSE))
        if typ == "int | None" and s.lower() in ("", "none", "auto"):
            return None
        if typ in ("int", "int | None"):
            try:
                return int(s, 10)   # "010" is ten, as everywhere else (base 0 rejects leading zeros)
            except ValueError:
                return int(s, 0)    # 0x / 0o / 0b forms
        if typ == "float":
            return float(s)
        if typ == "list[int] | None":   # "0,1" or "all"
            return None if s.lower() in ("", "all", "none") else [int(v, 10) for v in s.split(",")]
    except ValueError as e:
        raise ConfigError(f"hipsched config: {key}={raw!r} (from environment variable {name}) is not allowed: {e}") from None
    if typ == "str | None" and s.lower() in ("", "none"):
        return None
    return raw
