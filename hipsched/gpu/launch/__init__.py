"""How a call reaches the device: GpuContext, what the launch glue runs through (context.py); the
glue's run written down as a plan (recording.py) and the plan replayed in C (_callpath.pyx); the
vendor BLAS (blas.py)."""
