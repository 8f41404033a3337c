"""Device memory: DeviceArray and the host<->device copies (device_array.py), the cache of device copies
kept across calls (resident_cache.py), DLPack capsules (dlpack.py), and streams (streams.py)."""
