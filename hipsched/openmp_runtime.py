"""The OpenMP runtime the CPU kernels run on, loaded at `import hipsched` with a short spin before its
threads sleep between parallel regions, and how it waits (`wait`, hipsched.cpu_features()["omp_wait"]).

How long a team thread spins after a region before it sleeps decides two costs:
- Spinning long holds cores. libgomp's default is GOMP_SPINCOUNT 300000, about 8 ms on the 2-core Zen 4
  VM (bench numbers below). Our kernels are regions of 0.01-10 ms called from Python, with GPU calls, the
  driver's threads and the telemetry writer between them: threads spinning that long took the cores
  those need, and a team whose member was preempted waited a scheduler slice at its barrier. On the
  H100's 16-core host 15-100% of a demo's CPU top_k calls took ~7 ms instead of ~0.3 ms; on the 2-core VM
  beside one other process a 1 ms decode attention took 22-24 ms.
- Sleeping at once (OMP_WAIT_POLICY=PASSIVE, what hipsched set before) makes every region wake its team.
  On the VM that wake cost ~100-200 us a region: a float16 decode attention over 1024 keys took 377 us
  on two threads against 253 us on one and 148 us on a spinning team, and a q8_0 decode of the small
  model ran at 285-308 tokens/s against 441-519 (bench/decode.py --preset small --modes cpu).
So the threads spin about as long as a wake costs, then sleep: the rule that bounds either waste to the
cost of the other (spin for the price of blocking). SPIN_COUNT 3000 is 50-80 us on the VM (30 ns an
iteration: a pause and a load), 90-140 us where a pause is 140 cycles (Intel since Skylake); the same
1024-key call took 163 us with it and the small q8_0 decode 378-488 tokens/s.

libgomp reads its settings once, when it is loaded. torch ships a libgomp with the system's soname, and
the dynamic linker hands a library already loaded under a soname to every later module that asks for it:
whichever loads first runs both libraries' regions. So the runtime is loaded here, at `import hipsched`,
with GOMP_SPINCOUNT set only around the load: loaded at the first CPU call, as before, it came after a
torch imported in between, which loaded its own with the default spin. Only the system library is
loaded (ctypes, no compiled hipsched module and no NumPy: the log tools import this package on a laptop
with nothing built). A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is, and a runtime some
other module loaded before hipsched keeps its own settings: `wait` says so, with the remedy."""
import os
import sys

SPIN_COUNT = 3000
_USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

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


def users_settings():
    """The wait settings the user gave (OMP_WAIT_POLICY, GOMP_SPINCOUNT), as 'NAME=value' strings."""
    return [f"{name}={os.environ[name]}" for name in _USER_VARS if name in os.environ]


def load():
    """Load the runtime once, as the module docstring says."""
    global wait, _loaded
    if _loaded:
        return
    _loaded = True
    before = _mapped() if sys.platform.startswith("linux") else None
    if users_settings():
        wait = "as " + ", ".join(users_settings())
        return
    if before is not None:
        wait = (f"long spin: {before} was loaded before hipsched with libgomp's default (about 8 ms of "
                f"spinning after each region; import hipsched before torch, or set "
                f"GOMP_SPINCOUNT={SPIN_COUNT} before torch is imported)")
        return
    wait = f"short spin, then sleep (GOMP_SPINCOUNT={SPIN_COUNT})"
    if not sys.platform.startswith("linux"):
        return   # the kernels' own import sets the count around loading theirs (hipsched/cpu/__init__.py)
    import ctypes
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError:   # none on the library path: the kernels' import sets the count around theirs
        pass
    finally:
        del os.environ["GOMP_SPINCOUNT"]
