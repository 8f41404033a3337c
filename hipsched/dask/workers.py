"""One Executor per Dask worker: the WorkerPlugin that builds it, the function tasks find it with, and
the GPU pinning read from the visible-devices variables. See docs/guide/distributed.md."""
from __future__ import annotations

import os
import re
import time
import uuid

from distributed import WorkerPlugin, get_worker

from ..config import ConfigError, HybridConfig, _layered

PLUGIN_NAME = "hipsched"
# In the order hipsched names the pin: HIP's own variable, then CUDA's (which HIP on NVIDIA also honours),
# then ROCm's lower-level one. Each makes the runtime number the devices it lists from 0.
VISIBLE_VARS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
# Set per worker by the plugin; a client that passed them would tag every worker alike.
_PER_WORKER = ("telemetry_path", "telemetry_worker", "telemetry_job")


def pinned_device(env=None) -> dict:
    """The GPU this process is pinned to by HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES /
    ROCR_VISIBLE_DEVICES (the first of them that is set):

    - none set: {"variable": None, ...}: no pinning, the config's gpu_device_id stands;
    - a list ("3" or "3,1"): the runtime sees those devices renumbered from 0, so this worker's device
      is id 0, physically the first entry ("3");
    - empty, or "-1" (how dask-cuda and CUDA spell "no device"): this worker has no GPU and runs
      everything on its CPU (force_cpu_mode)."""
    env = os.environ if env is None else env
    for var in VISIBLE_VARS:
        raw = env.get(var)
        if raw is None:
            continue
        entries = [e.strip() for e in raw.split(",") if e.strip()]
        if not entries or entries[0] == "-1":
            return {"variable": var, "visible": raw, "device": None, "gpu_device_id": None, "force_cpu": True}
        return {"variable": var, "visible": raw, "device": entries[0], "gpu_device_id": 0, "force_cpu": False}
    return {"variable": None, "visible": None, "device": None, "gpu_device_id": None, "force_cpu": False}


def client_settings(overrides: dict) -> dict:
    """The config the client would use (its TOML file and HIPSCHED_* variables, then `overrides`),
    validated here so a bad value fails on the client before any worker starts; only the keys set
    explicitly travel, so each worker fills the defaults that depend on it (cache_dir) itself."""
    bad = sorted(k for k in overrides if k in _PER_WORKER)
    if bad:
        raise ConfigError(f"hipsched.dask.setup: {', '.join(bad)} are set per worker by setup(); pass "
                          f"telemetry_dir= and job= instead")
    HybridConfig(**overrides)
    values, _ = _layered(None, os.environ)
    values.update(overrides)
    for k in _PER_WORKER:
        values.pop(k, None)   # a path on the client (its TOML file) means nothing on a worker
    return values


def safe_name(name) -> str:
    """A worker name as a file name: what is not a letter, digit, '.', '_' or '-' becomes '_'."""
    s = re.sub(r"[^A-Za-z0-9._-]", "_", str(name))
    return s if s.strip(".") else "_" + s


def new_job_id() -> str:
    return "job-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


class HipschedWorkerPlugin(WorkerPlugin):
    """Builds the worker's Executor at setup (every worker, including ones that join or are restarted
    later: the scheduler keeps the plugin) and closes it at teardown (model saved, log flushed)."""

    name = PLUGIN_NAME

    def __init__(self, settings: dict, job: str, telemetry_dir: str | None = None, executor_factory=None):
        self.settings = dict(settings)
        self.job = job
        self.telemetry_dir = telemetry_dir
        self.executor_factory = executor_factory
        self.executor = None
        self.info = None

    def worker_config(self, worker_name, env=None) -> tuple[HybridConfig, dict]:
        values = dict(self.settings)
        pin = pinned_device(env)
        if pin["force_cpu"]:
            values["force_cpu_mode"] = True
        elif pin["gpu_device_id"] is not None:
            # the index is into the visible list; one the client set explicitly applies to every worker
            values.setdefault("gpu_device_id", pin["gpu_device_id"])
        # one worker per GPU: a worker takes parts of split calls to its own device only (dask-cuda's
        # rotated CUDA_VISIBLE_DEVICES shows every worker every GPU), unless the client lists devices
        if values.get("gpu_devices") is None:
            values["gpu_devices"] = [values.get("gpu_device_id", 0)]
        values["telemetry_worker"] = str(worker_name)
        values["telemetry_job"] = self.job
        path = None
        if self.telemetry_dir:
            folder = os.path.join(self.telemetry_dir, safe_name(self.job))
            os.makedirs(folder, exist_ok=True)
            path = values["telemetry_path"] = os.path.join(folder, safe_name(worker_name) + ".jsonl")
        # this worker's own HIPSCHED_* variables and TOML file do not apply: the client's config does
        return HybridConfig(config_file=False, env={}, **values), {"pin": pin, "telemetry_path": path}

    def setup(self, worker):
        config, info = self.worker_config(worker.name)
        if self.executor_factory is not None:
            ex = self.executor_factory(config)
        else:
            # deferred: the compiled executor loads on a worker setting up, not on a client
            from ..executor import Executor
            ex = Executor(config)
        caps = ex.capabilities()
        info.update(worker=str(worker.name), job=self.job, pid=os.getpid(), gpu_available=caps.gpu_available,
                    gpu_device_name=caps.gpu_device_name, gpu_device_id=config.gpu_device_id,
                    force_cpu_mode=config.force_cpu_mode, model_path=ex._model.path)
        # setup and teardown run one at a time on the worker's event loop; tasks only read the attribute
        self.executor, self.info = ex, info

    def teardown(self, worker):
        ex, self.executor = self.executor, None
        if ex is not None:
            ex.close()


def setup(client, *, job: str | None = None, telemetry_dir: str | None = None, executor_factory=None,
          **config_overrides) -> str:
    """Installs the hipsched WorkerPlugin on every worker of `client`'s cluster (and on workers that
    join later): each builds one Executor from the client's config plus `config_overrides`, loads the
    model its hardware saved before, and tags its telemetry with the worker's name and `job` (default: a
    new id). With `telemetry_dir`, worker W writes `telemetry_dir/<job>/<W>.jsonl` (the folder must be
    one the workers can reach: a local path on a LocalCluster, a shared file system across nodes).
    `executor_factory(config) -> Executor` replaces `Executor(config)` (tests pass one with a fake GPU;
    it is pickled to the workers). Calling it again replaces every worker's executor (call it between
    jobs, not while tasks run). Returns the job id."""
    settings = client_settings(config_overrides)
    job = str(job) if job is not None else new_job_id()
    if telemetry_dir is not None:
        telemetry_dir = os.path.abspath(telemetry_dir)
    plugin = HipschedWorkerPlugin(settings, job, telemetry_dir, executor_factory)
    register = getattr(client, "register_plugin", None) or client.register_worker_plugin  # older distributed
    replies = register(plugin, name=PLUGIN_NAME)
    failed = {addr: r for addr, r in (replies or {}).items() if isinstance(r, dict) and r.get("status") != "OK"}
    if failed:
        addr, r = next(iter(failed.items()))
        raise RuntimeError(f"hipsched.dask.setup: the executor failed to start on {len(failed)} worker(s); "
                           f"{addr}: {r.get('exception_text') or r.get('exception') or r}")
    return job


def teardown(client) -> None:
    """Removes the plugin: every worker closes its executor (model saved, telemetry flushed)."""
    client.unregister_worker_plugin(PLUGIN_NAME)


def _plugin_of(worker):
    p = getattr(worker, "plugins", {}).get(PLUGIN_NAME)
    return p if isinstance(p, HipschedWorkerPlugin) else None


def executor():
    """The Executor this code should use: inside a task on a worker that setup() prepared, that
    worker's; anywhere else (the threaded or synchronous scheduler, a worker without the plugin, plain
    Python) the process's default executor, so the same task code runs everywhere."""
    try:
        worker = get_worker()
    except ValueError:   # not inside a distributed task
        worker = None
    return executor_of(worker)


def executor_of(worker):
    """The Executor setup() built on `worker`, or the process's default one (no worker, no plugin)."""
    if worker is not None:
        p = _plugin_of(worker)
        ex = p.executor if p is not None else None
        if ex is not None:
            return ex
    from .. import default_executor  # deferred: hipsched.default_executor loads the compiled executor, only when asked
    return default_executor()


def worker_info(dask_worker=None) -> dict | None:
    """What setup() built on this worker (name, job, pin, device, telemetry path, model file), or None.
    From the client: `client.run(hipsched.dask.worker_info)` gives it for every worker."""
    if dask_worker is None:
        dask_worker = get_worker()
    p = _plugin_of(dask_worker)
    return dict(p.info) if p is not None and p.info is not None else None


def _flush(dask_worker=None):
    p = _plugin_of(dask_worker)
    if p is not None and p.executor is not None and p.executor.telemetry is not None:
        p.executor.telemetry.flush()
        return True
    return False


def flush_telemetry(client) -> dict:
    """Writes every worker's queued telemetry to its log now ({worker address: flushed?}); the writers
    also flush on their own every 20 ms and at teardown."""
    return client.run(_flush)
