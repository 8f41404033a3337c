"""python -m hipsched info: CPU features, every GPU runtime tried and why it was or was not taken,
the driver's version and what its kernels are compiled with (or why none would load), the devices
with arch and memory, how much device memory resident inputs may take (and which inputs are kept), the
compilers available, and the kernel cache directory."""
from __future__ import annotations

import json

from ..config import HybridConfig
from ..errors import GpuError


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _cpu():
    try:
        import hipsched  # deferred and guarded: the compiled CPU extension may be unbuilt, which info reports
        return hipsched.cpu_features()
    except Exception as e:   # the CPU extension not built: say so rather than fail the whole report
        return {"error": f"{type(e).__name__}: {e}"}


def _devices(rt):
    devices = []
    for i in range(rt.device_count()):
        d = rt.device_info(i)
        entry = {"index": d.index, "name": d.name, "arch": d.arch, "total_memory": d.total_memory,
                 "platform": d.platform, "warp_size": d.warp_size, "multiprocessors": d.multiprocessors}
        if i == rt.current_device():
            entry["free_memory"] = rt.mem_info()[0]
        devices.append(entry)
    return devices


def _compilers():
    # deferred: __main__ imports every command, so this loads only when the command runs (the GPU layer)
    from ..gpu.bindings.compilers import get_compiler
    out = {}
    for platform in ("amd", "nvidia"):
        try:
            c = get_compiler(platform)
            out[platform] = {"name": c.name, "version": c.version(), "library": c.library_path}
        except GpuError as e:
            out[platform] = {"error": str(e)}
    try:
        # deferred: __main__ imports every command, so this loads only when the command runs (the GPU layer)
        from ..gpu.bindings.compilers import nvrtc_candidates
        found = nvrtc_candidates()
        if len(found) > 1:   # which one a driver gets depends on its version (see "kernels")
            out["nvidia"]["found"] = [{"version": c.version(), "library": c.library_path} for c in found]
    except GpuError:
        pass
    return out


def _kernels(rt):
    """What this runtime's kernels are compiled with and for, or why nothing compiled would load."""
    # deferred: __main__ imports every command, so this loads only when the command runs (the GPU layer)
    from ..gpu.bindings.compilers import load_target
    from ..gpu.compilation.kernels import KernelCache
    driver = rt.driver_version()
    out = {"driver_version": driver, "loader": rt.loader_tag()}
    try:
        c = rt.compiler
        out.update(compiler=c.version(), library=c.library_path)
        out["target"] = load_target(c, rt.device_info(rt.current_device()).arch, driver or None)
        # which sources a first call would find compiled (the others compile then: in the background
        # for automatic calls, background_compile)
        cache = KernelCache(c)
        names = sorted(cache.sources)
        out["cached"] = [n for n in names if cache.ready(rt, n)]
        out["sources"] = len(names)
    except GpuError as e:
        out["unavailable"] = e.message
    return out


def _resident(rt):
    """What the GPU backend would keep resident on this device: its budget and where the figure comes
    from, and which host arrays qualify (a fresh process holds none yet)."""
    # deferred: __main__ imports every command, so this loads only when the command runs (the GPU layer, NumPy)
    from ..gpu.memory.resident_cache import resident_budget
    try:
        configured = HybridConfig().resident_bytes
    except Exception:   # a broken config file is reported by the commands that use it
        configured = None
    budget, source = resident_budget(rt, configured)
    return {"budget_bytes": budget, "budget_source": source,
            "kept": "read-only host arrays (base chain included), quantized weights, and arrays registered "
                    "with Executor.resident; writable arrays are uploaded per call"}


def _call_path(rt):
    """How a GPU call reaches the driver on this runtime: through the compiled call path (driver entry
    points as C function pointers; a call's launch plan replayed from its second time) or only through
    the Python launch glue (a runtime without C entry points)."""
    # deferred: __main__ imports every command, so this loads only when the command runs (compiled GPU layer)
    from ..gpu.bindings._driver import driver_for
    drv = driver_for(rt)
    if drv is None:
        return {"compiled": False, "why": f"the {rt.name} runtime offers no C entry points: every GPU call "
                                          f"runs the Python launch glue"}
    return {"compiled": True, "vendor": drv.vendor, "library": getattr(rt, "library_path", None),
            "host_staging": bool(drv.has_host)}


def gather() -> dict:
    # deferred: __main__ imports every command, so this loads only when the command runs (the GPU layer)
    from ..gpu.bindings import detect
    from ..gpu.compilation.kernels import default_cache_dir
    info = {"cpu": _cpu(), "runtimes": [], "devices": [], "compilers": _compilers(),
            "kernel_cache_dir": str(default_cache_dir())}
    info["runtimes"] = [{"name": a.name, "ok": a.ok, "reason": a.reason} for a in detect.attempts()]
    rt = detect.get_runtime()
    if rt is not None:
        try:
            info["devices"] = _devices(rt)
            info["kernels"] = _kernels(rt)
            info["resident"] = _resident(rt)
            info["call_path"] = _call_path(rt)
        except GpuError as e:
            info["devices_error"] = str(e)
    info["splitting"] = _splitting([d["index"] for d in info["devices"]])
    return info


def _background_compile() -> bool:
    try:
        return HybridConfig().background_compile
    except Exception:  # a bad config is reported by _splitting
        return True


def _splitting(devices: list) -> dict:
    """Whether an executor made now would cut long calls across the CPU and the GPUs (the config's split,
    split_min_us; hipsched/splitting.py), and which devices it would use: the one backend="gpu" means
    first, then those that take parts of split calls (gpu_devices; all found by default)."""
    # deferred: the op specs (numpy) load only when the command runs
    from ..ops import OPS
    try:
        cfg = HybridConfig()
    except Exception as e:  # a bad config is reported, not a crash of `info`
        return {"on": False, "why": f"config: {e}"}
    ops = sorted(name for name, spec in OPS.items() if spec.partition is not None)
    if not cfg.split:
        return {"on": False, "why": "split = false in the config", "ops": ops}
    if not devices:
        return {"on": False, "why": "no GPU to split with", "ops": ops}
    wanted = cfg.gpu_devices if cfg.gpu_devices is not None else [cfg.gpu_device_id] + [
        i for i in devices if i != cfg.gpu_device_id]
    used = [i for i in wanted if i in devices]
    return {"on": True, "min_us": cfg.split_min_us, "ops": ops, "devices": used,
            "missing_devices": [i for i in wanted if i not in devices]}


def run(args) -> int:
    info = gather()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    cpu = info["cpu"]
    print("CPU: " + (", ".join(f"{k}={v}" for k, v in cpu.items())))
    print("GPU runtimes (HIPSCHED_GPU_RUNTIME):")
    for a in info["runtimes"]:
        print(f"  {a['name']:<11} {'taken' if a['ok'] else 'not taken: ' + str(a['reason'])}")
    if info["devices"]:
        print("Devices:")
        for d in info["devices"]:
            free = f", {d['free_memory'] / 2**30:.1f} GiB free" if "free_memory" in d else ""
            print(f"  [{d['index']}] {d['name']} ({d['arch']}, {d['total_memory'] / 2**30:.1f} GiB{free}, "
                  f"{d['multiprocessors']} CUs/SMs, warp {d['warp_size']})")
    else:
        print("Devices: none" + (f" ({info['devices_error']})" if "devices_error" in info else ""))
    k = info.get("kernels")
    if k:
        print(f"Kernels for this driver ({k['loader'] or 'version unknown'}): " +
              (f"unavailable: {k['unavailable']}" if "unavailable" in k else
               f"{k['compiler']} ({k['library']}) -> {k['target']}"))
        if "cached" in k:
            print(f"  compiled in the kernel cache: {len(k['cached'])} of {k['sources']} sources; the others "
                  f"compile on first use (" + ("in the background while automatic calls run on the CPU: "
                                                "background_compile" if _background_compile() else
                                                "the first call waits: background_compile is off") + ")")
    c = info.get("call_path")
    if c:
        print("GPU call path: " + (f"compiled ({c['vendor']} driver entry points from {c['library'] or 'its library'}"
                                   f"{', page-locked staging for host arrays' if c['host_staging'] else ''}; a "
                                   f"call's launch plan replayed from its second time)" if c["compiled"] else c["why"]))
    r = info.get("resident")
    if r:
        print(f"Resident inputs: up to {r['budget_bytes'] / 2**30:.1f} GiB of device memory ({r['budget_source']}); "
              f"kept: {r['kept']}")
    sp = info["splitting"]
    print("Splitting calls across CPU and GPU: " + (
        f"on for calls predicted over {sp['min_us'] / 1e3:g} ms ({', '.join(sp['ops'])})" if sp["on"]
        else f"off ({sp['why']})"))
    if sp["on"]:
        devs = sp["devices"]
        print(f"  devices: {devs[0] if devs else 'none'} (backend='gpu')" +
              (f", then {', '.join(map(str, devs[1:]))} for parts of split calls and the calls on their own "
               "device arrays" if len(devs) > 1 else "") +
              (f"; listed in gpu_devices but not found: {sp['missing_devices']}" if sp["missing_devices"] else ""))
    print("Compilers (work without a device):")
    for platform, c in info["compilers"].items():
        print(f"  {platform:<7} " + (f"{c['version']} ({c['library']})" if "version" in c else c["error"]))
        for other in c.get("found", []):
            if other["library"] != c.get("library"):
                print(f"          also found: {other['version']} ({other['library']})")
    print(f"Kernel cache: {info['kernel_cache_dir']}")
    return 0
