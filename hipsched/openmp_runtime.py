"""The OpenMP runtime the CPU kernels run on, loaded at `import hipsched` with its threads sleeping
between parallel regions, and how it waits (`wait`, reported by hipsched.cpu_features()["omp_wait"]).

libgomp's threads spin by default for a while after each region (GOMP_SPINCOUNT 300000). Our kernels are
regions of 0.1-10 ms called from Python with GPU calls, the driver's threads and the telemetry writer
between them, so spinning threads took the cores those need, and a team whose member was preempted waited
a scheduler slice at its barrier: on the H100's 16-core host 15-100% of a demo's CPU top_k calls took ~7 ms
instead of ~0.3 ms, and on a 2-core machine beside one other process a 1 ms decode attention took
22-24 ms. libgomp reads the policy once, when it is loaded. torch ships a libgomp with the system's
soname, and the dynamic linker hands a library already loaded under a soname to every later module that
asks for it: whichever loads first runs both libraries' regions. So the runtime is loaded here, at
`import hipsched`, with OMP_WAIT_POLICY=PASSIVE set only around the load: loaded at the first CPU call,
as before, it came after a torch imported in between, which loaded its own, spinning. Only the system
library is loaded (ctypes, no compiled hipsched module and no NumPy: the log tools import this package on
a laptop with nothing built). A user's OMP_WAIT_POLICY is left as it is, and a runtime some other module
loaded before hipsched keeps its own policy: `wait` says so, with the remedy."""
import os
import sys

wait = "not loaded"
_loaded = False


def _mapped():
    """The file of a libgomp this process has mapped, or None (also where /proc/self/maps cannot be read)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libgomp" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


def load():
    """Load the runtime once, as the module docstring says."""
    global wait, _loaded
    if _loaded:
        return
    _loaded = True
    before = _mapped() if sys.platform.startswith("linux") else None
    if "OMP_WAIT_POLICY" in os.environ:
        wait = f"as OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
        return
    if before is not None:
        wait = (f"spin: {before} was loaded before hipsched, without OMP_WAIT_POLICY (import hipsched "
                f"before torch, or set OMP_WAIT_POLICY=PASSIVE, so that the threads sleep between regions)")
        return
    wait = "passive"
    if not sys.platform.startswith("linux"):
        return   # the kernels' own import sets the policy around loading theirs (hipsched/cpu/__init__.py)
    import ctypes
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError:   # none on the library path: the kernels' import sets the policy around theirs
        pass
    finally:
        del os.environ["OMP_WAIT_POLICY"]
