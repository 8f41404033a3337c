"""The OpenMP runtime the CPU kernels run on, loaded at `import hipsched` with its threads sleeping
between parallel regions, and how it waits (`wait`, reported by hipsched.cpu_features()["omp_wait"]).

How long a team thread spins after a region before it sleeps trades two costs, and neither wins on
every machine:
- Spinning holds cores. libgomp's default is GOMP_SPINCOUNT 300000, about 8 ms on the 2-core Zen 4 VM
  (30 ns an iteration). Our kernels are regions of 0.01-10 ms called from Python, with GPU calls, the
  driver's threads and the telemetry writer between them: threads spinning that long took the cores
  those need, and a team whose member was preempted waited a scheduler slice at its barrier. On the
  H100's 16-core host 15-100% of a demo's CPU top_k calls took ~7 ms instead of ~0.3 ms; on the 2-core
  VM beside one other process a 1 ms decode attention took 22-24 ms. Even a short spin loses beside
  other work: with the test suite running on the VM (bench/wait_policy.py, calls 0.2 ms apart),
  top_k over 7 MB took 386 us with GOMP_SPINCOUNT=3000 (about 0.1 ms) and 856 us with 10000, against
  259 us sleeping at once; add of 4M floats 1388 and 1960 against 1049.
- Sleeping at once makes every region wake its team. On the quiet VM that wake cost ~100-200 us a
  region: a float16 decode attention over 1024 keys took 377 us on two threads against 253 us on one and
  163 us with the 3000 spin, and the small model's q8_0 decode ran at 285-308 tokens/s against 378-488
  with the 3000 spin (bench/decode.py --preset small --modes cpu). On the idle H200 host a 10000 spin
  made calls 11-59% faster (bench/results/h200-2026-11-28.md).
Sleeping at once is kept: its loss is bounded by a wake a region, while a spin's beside other work is
not, and hipsched's processes share machines (GPU drivers, Dask workers, several processes). A process
that has its cores to itself, such as a CPU decode loop, gains by setting GOMP_SPINCOUNT=3000 before
importing hipsched (docs/guide/threads.md).

libgomp reads its settings once, when it is loaded. torch ships a libgomp with the system's soname, and
the dynamic linker hands a library already loaded under a soname to every later module that asks for it:
whichever loads first runs both libraries' regions. So the runtime is loaded here, at `import hipsched`,
with OMP_WAIT_POLICY=PASSIVE set only around the load: loaded at the first CPU call, as before, it came
after a torch imported in between, which loaded its own with the default spin. Only the system library
is loaded (ctypes, no compiled hipsched module and no NumPy: the log tools import this package on a
laptop with nothing built). A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is, and a runtime
some other module loaded before hipsched keeps its own settings: `wait` says so, with the remedy."""
import contextlib
import os
import sys

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


@contextlib.contextmanager
def passive_while_loading():
    """OMP_WAIT_POLICY=PASSIVE in the environment while the block loads a libgomp (libgomp reads it then),
    and gone after it; nothing where the user set a wait of their own."""
    if users_settings():
        yield
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        del os.environ["OMP_WAIT_POLICY"]


def load():
    """Load the runtime once, as the module docstring says."""
    global wait, _loaded
    if _loaded:
        return
    _loaded = True
    before = _mapped() if sys.platform.startswith("linux") else None
    given = users_settings()
    if given:
        wait = "as " + ", ".join(given)
        return
    if before is not None:
        wait = (f"spin: {before} was loaded before hipsched with libgomp's default (about 8 ms of spinning "
                f"after each region; import hipsched before torch, or set OMP_WAIT_POLICY=PASSIVE before "
                f"torch is imported)")
        return
    wait = "passive"
    if not sys.platform.startswith("linux"):
        return   # the kernels' own import sets the policy around loading theirs (hipsched/cpu/__init__.py)
    import ctypes
    with passive_while_loading():
        try:
            ctypes.CDLL("libgomp.so.1")
        except OSError:   # none on the library path: the kernels' import sets the policy around theirs
            pass
