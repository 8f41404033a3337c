"""The runtime bindings: the Runtime and Compiler interfaces (runtime.py), their ctypes (HIP and CUDA
driver API) and hip-python implementations, the libraries they open, the choice among them (detect.py),
error names as kinds (status.py), and the driver entry points as C function pointers (_driver.pyx)."""
