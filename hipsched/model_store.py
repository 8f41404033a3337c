"""Persistence of the learned performance model: one JSON file per (host, device, package version) in
the cache directory, so a new process starts calibrated. Written atomically (temp file + os.replace);
any file that is not one this package wrote for this host/device/version is ignored with one warning."""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import socket
import warnings

from .atomic_file import atomic_write

FORMAT = 1
MAX_FILE_SLOTS = 256   # half of the core's MAX_SLOTS (hipsched/_sched.pxd)
MAX_FILE_OPS = 64      # half of its MAX_OPS


def model_key(device: str | None, version: str) -> dict:
    return {"host": socket.gethostname(), "machine": platform.machine(), "device": device or "none",
            "version": version}


def model_path(cache_dir: str, key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"model-{digest}.json")


def save_model(path: str, key: dict, samples: dict, transfer: dict | None) -> None:
    """samples: {(op, dtype): [cpu [(work, us)...], gpu [...]]} as SchedCore.export_samples gives."""
    payload = {"format": FORMAT, "key": key, "transfer": transfer,
               "samples": [{"op": op, "dtype": dt, "cpu": sides[0], "gpu": sides[1]}
                           for (op, dt), sides in sorted(samples.items())]}
    atomic_write(path, json.dumps(payload).encode(), prefix=".model-")


def load_model(path: str, key: dict):
    """(samples, transfer) or None when there is no usable file (warning when one exists but is bad)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as fh:
            payload = json.load(fh)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format') if isinstance(payload, dict) else '?'} != {FORMAT}")
        if payload.get("key") != key:
            warnings.warn(f"hipsched: model file {path} was written for {payload.get('key')}, not {key}; ignored",
                          RuntimeWarning, stacklevel=3)
            return None
        samples = {}
        for entry in payload["samples"]:
            sides = []
            for side in ("cpu", "gpu"):
                pts = [(float(w), float(t)) for w, t in entry[side]]
                if not all(math.isfinite(w) and math.isfinite(t) and w >= 0 and t >= 0 for w, t in pts):
                    raise ValueError(f"bad sample in {entry['op']}/{side}")
                sides.append(pts)
            samples[(str(entry["op"]), str(entry["dtype"]))] = sides
        # the core holds at most 512 (op, dtype) slots and 128 ops: a file that would fill them (or
        # overflow them mid-import) is not one this package wrote; leave room for the real ops
        if len(samples) > MAX_FILE_SLOTS or len({op for op, _ in samples}) > MAX_FILE_OPS:
            raise ValueError(f"{len(samples)} (op, dtype) entries: more than this package has")
        transfer = payload.get("transfer")
        if transfer is not None:
            transfer = {k: float(transfer[k]) for k in ("h2d_latency_us", "h2d_gbps", "d2h_latency_us", "d2h_gbps")}
            if not all(math.isfinite(v) for v in transfer.values()) or transfer["h2d_gbps"] <= 0 \
                    or transfer["d2h_gbps"] <= 0 or transfer["h2d_latency_us"] < 0 or transfer["d2h_latency_us"] < 0:
                raise ValueError(f"bad transfer model {transfer}")
        return samples, transfer
    except Exception as e:
        # whatever an earlier run (or anything else) left there, a killed write, garbage, "[" * 100000
        # (RecursionError), a 400-digit number (OverflowError): a miss with one warning, never a failed
        # start, since the default executor behind every module-level call loads this file
        warnings.warn(f"hipsched: model file {path} is unreadable ({type(e).__name__}: {e}); ignored, starting "
                      f"from an empty model", RuntimeWarning, stacklevel=3)
        return None


class ModelPersistence:
    """Binds a SchedCore to its model file: `load()` at start, `save()` on demand, and `save_quietly`
    for close() and interpreter exit (a failure to save is a warning, never an error at exit)."""

    def __init__(self, core, cache_dir: str, device: str | None, version: str):
        self.core = core
        self.key = model_key(device, version)
        self.path = model_path(cache_dir, self.key)
        self.transfer_known = False   # True once the transfer model was measured or loaded

    def load(self) -> bool:
        loaded = load_model(self.path, self.key)
        if loaded is None:
            return False
        samples, transfer = loaded
        self.core.import_samples(samples)
        if transfer:
            self.core.set_transfer(**transfer)
            self.transfer_known = True
        return True

    def save(self, path: str | None = None) -> str:
        path = path or self.path
        save_model(path, self.key, self.core.export_samples(),
                   self.core.transfer_model() if self.transfer_known else None)
        return path

    def save_quietly(self) -> None:
        try:
            self.save()
        except Exception as e:  # at close or exit: report, do not raise
            warnings.warn(f"hipsched: could not save the model to {self.path}: {e}", RuntimeWarning, stacklevel=2)
