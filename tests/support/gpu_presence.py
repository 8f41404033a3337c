"""Whether this machine has a usable GPU: what the `gpu` marker's tests need (tests/conftest.py skips them
without one) and what the no-device tests cannot have. A broken or absent GPU layer counts as none."""


def gpu_present() -> bool:
    try:
        from hipsched.gpu.bindings import detect
        return detect.gpu_available()
    except Exception:
        return False
