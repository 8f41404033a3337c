"""GPU engine infrastructure, a folder per concern: bindings/ (the runtime bindings: hip-python, ctypes HIP,
ctypes CUDA driver; the compiled driver table), compilation/ (hiprtc, NVRTC, code objects, target limits,
the kernel cache), memory/ (device arrays, the resident cache, DLPack, streams), launch/ (how a call
reaches the device: GpuContext, the plan recorder and the compiled call path, the vendor BLAS) and ops/
(the launch glue, one module per op family, named as hipsched/ops/'s).

Importing this package loads no vendor library; `bindings.detect.get_runtime()` does, lazily, and never
raises."""
