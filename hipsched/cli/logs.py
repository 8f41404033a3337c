"""The log `monitor` and `analyze` read when given none, and where the demo writes its own: the demo
logs to `--log`, else $HIPSCHED_TELEMETRY, else a new demo-<time>.jsonl in one of `demo_log_dirs()`;
so with no LOG the commands read $HIPSCHED_TELEMETRY when it names a file, else the newest demo log."""
from __future__ import annotations

import glob
import os
import sys
import tempfile

from ..telemetry.recorder import path_from_env


def demo_log_dirs() -> list:
    """Where the demo writes a log it was given no path for: the cache dir's logs/, else (not writable)
    the temp dir's hipsched-logs/."""
    from ..config import ConfigError, HybridConfig   # deferred: reads the TOML config, only when asked
    dirs = []
    try:
        dirs.append(os.path.join(HybridConfig().cache_dir, "logs"))
    except ConfigError:   # a bad config file: the temp dir is still where a demo may have logged
        pass
    dirs.append(os.path.join(tempfile.gettempdir(), "hipsched-logs"))
    return dirs


def last_demo_log():
    """The demo log written last (by modification time), or None."""
    found = [p for d in demo_log_dirs() for p in glob.glob(os.path.join(d, "demo-*.jsonl"))]
    return max(found, key=os.path.getmtime, default=None)


def default_log(command: str):
    """The log a command given no LOG reads, said on stderr (which one and why), or None after saying
    that there is none."""
    env = path_from_env()
    if env is not None and os.path.exists(env):
        print(f"{command}: no LOG given: reading $HIPSCHED_TELEMETRY, {env}", file=sys.stderr)
        return env
    last = last_demo_log()
    if last is not None:
        why = f" ($HIPSCHED_TELEMETRY names {env}, which does not exist)" if env else ""
        print(f"{command}: no LOG given: reading the last demo log, {last}{why}", file=sys.stderr)
        return last
    print(f"{command}: no LOG given, $HIPSCHED_TELEMETRY " + (f"names {env}, which does not exist" if env else "is unset")
          + ", and no demo log was found in " + " or ".join(demo_log_dirs()) + " (run `hipsched demo` first, or "
          "name a log)", file=sys.stderr)
    return None
