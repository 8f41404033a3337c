"""Fault injection: HIPSCHED_FAULT_INJECT="launch=0.2,oom=0.05,seed=7" wraps the GPU backend so that
its runs raise GpuError of those kinds at those rates (seeded, so a run is reproducible). It exists to
show and test the fallback path on any machine; the wrapped backend is real and otherwise unchanged."""
from __future__ import annotations

import random
import threading

from .errors import GpuError

_NAMES = {"launch": "hipErrorLaunchFailure", "oom": "hipErrorOutOfMemory", "lost": "hipErrorNoDevice",
          "timeout": "hipErrorLaunchTimeOut", "compile": "hiprtcErrorCompilation", "copy": "hipErrorInvalidValue",
          "runtime": "hipErrorUnknown"}


def parse_fault_spec(spec: str) -> tuple[dict[str, float], int]:
    """"launch=0.2,oom=0.05,seed=7" -> ({"launch": 0.2, "oom": 0.05}, 7). ValueError says what is wrong."""
    rates, seed = {}, 0
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"fault spec item {part!r} is not key=value")
        if key == "seed":
            try:
                seed = int(val)
            except ValueError:
                raise ValueError(f"fault spec seed {val!r} is not an integer") from None
            continue
        if key not in _NAMES:
            raise ValueError(f"fault kind {key!r} is unknown; kinds: {', '.join(_NAMES)} (and seed)")
        try:
            rate = float(val)
        except ValueError:
            raise ValueError(f"fault rate {key}={val!r} is not a number") from None
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate {key}={rate} is outside [0, 1]")
        rates[key] = rate
    if sum(rates.values()) > 1.0:
        raise ValueError(f"fault rates add up to {sum(rates.values())} > 1")
    return rates, seed


class FaultInjectingBackend:
    """Delegates everything to `inner`; `run` first draws from the seeded generator and raises the
    chosen GpuError (before touching the device, as a failed launch or allocation would)."""

    # Every call goes through `run`, where the faults are drawn: the compiled call path, which
    # replays launches without it, is not offered
    callpath = None

    def __init__(self, inner, spec: str):
        self._inner = inner
        self.rates, self.seed = parse_fault_spec(spec)
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self.injected = {k: 0 for k in self.rates}
        if getattr(inner, "run_timed", None) is None:
            self.run_timed = None   # as the inner backend: the executor then uses run

    def __getattr__(self, name):  # everything but run and run_timed: the real backend
        return getattr(self._inner, name)

    def _draw(self):
        with self._lock:
            x = self._rng.random()
            acc = 0.0
            for kind, rate in self.rates.items():
                acc += rate
                if x < acc:
                    self.injected[kind] += 1
                    return kind
        return None

    def run(self, call, stream=None):
        kind = self._draw()
        if kind is not None:
            raise GpuError(kind, f"injected by HIPSCHED_FAULT_INJECT ({call.op}, size {call.size})", _NAMES[kind])
        return self._inner.run(call, stream)

    def run_timed(self, call, stream=None):
        kind = self._draw()
        if kind is not None:
            raise GpuError(kind, f"injected by HIPSCHED_FAULT_INJECT ({call.op}, size {call.size})", _NAMES[kind])
        return self._inner.run_timed(call, stream)
