"""run_with_features: a snippet in a fresh interpreter with a chosen SIMD level (HIPSCHED_CPU_FEATURES)."""
import os
import subprocess
import sys


def run_with_features(code: str, features: str = "scalar", timeout: int = 600) -> str:
    """Run Python `code` in a fresh interpreter with HIPSCHED_CPU_FEATURES set; returns stdout.
    The SIMD level is chosen once per process, so the scalar path needs its own process."""
    env = dict(os.environ, HIPSCHED_CPU_FEATURES=features)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"subprocess failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout
