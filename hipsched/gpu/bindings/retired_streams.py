"""The streams a StreamPool (gpu/memory/streams.py) destroyed: a registry every layer of the GPU code reads,
kept at the bottom so that the bindings import nothing above them."""
from __future__ import annotations

# Streams a StreamPool destroyed after their work finished: an allocation last used on one is freed on
# the null stream instead (a destroyed handle must not reach the driver). A set of ints: add, discard
# and membership need no lock, and the finalizers of device memory read it (device_array.py,
# resident_cache.py, bindings/_driver.pyx and launch/_callpath.pyx import it from here, at the bottom of
# the GPU layer). A handle in use again leaves it (DeviceMemory.used_on, a replay).
_retired_streams: set = set()


def retire_stream(stream) -> None:
    """`stream` was synchronised and destroyed: frees due on it go to the null stream."""
    _retired_streams.add(int(stream))


def revive_stream(stream) -> None:
    """A new stream got a handle a destroyed one had (drivers reuse them)."""
    _retired_streams.discard(int(stream))
