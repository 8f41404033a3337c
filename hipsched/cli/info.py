"""python -m hipsched info: CPU features, every GPU runtime tried and why it was or was not taken,
the devices with arch and memory, the compilers available, and the kernel cache directory."""
from __future__ import annotations

import json


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _cpu():
    try:
        import hipsched
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
    from ..errors import GpuError
    from ..gpu.compilers import get_compiler
    out = {}
    for platform in ("amd", "nvidia"):
        try:
            c = get_compiler(platform)
            out[platform] = {"name": c.name, "version": c.version(), "library": c.library_path}
        except GpuError as e:
            out[platform] = {"error": str(e)}
    return out


def gather() -> dict:
    from ..errors import GpuError
    from ..gpu import detect
    from ..gpu.kernels import default_cache_dir
    info = {"cpu": _cpu(), "runtimes": [], "devices": [], "compilers": _compilers(),
            "kernel_cache_dir": str(default_cache_dir())}
    info["runtimes"] = [{"name": a.name, "ok": a.ok, "reason": a.reason} for a in detect.attempts()]
    rt = detect.get_runtime()
    if rt is not None:
        try:
            info["devices"] = _devices(rt)
        except GpuError as e:
            info["devices_error"] = str(e)
    return info


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
    print("Compilers (work without a device):")
    for platform, c in info["compilers"].items():
        print(f"  {platform:<7} " + (f"{c['version']} ({c['library']})" if "version" in c else c["error"]))
    print(f"Kernel cache: {info['kernel_cache_dir']}")
    return 0
