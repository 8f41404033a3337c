"""From kernel source to a loaded kernel: the runtime compilers (hiprtc, NVRTC), what a code object
says (symbols, registers, shared memory), each target's launch limits and occupancy, the on-disk kernel
cache, and the compile report."""
