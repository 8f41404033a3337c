"""GPU engine infrastructure: runtime bindings (hip-python, ctypes HIP, ctypes CUDA driver), runtime
compilers (hiprtc, NVRTC), the kernel cache, device arrays and streams.

Importing this package loads no vendor library; `detect.get_runtime()` does, lazily, and never raises."""
