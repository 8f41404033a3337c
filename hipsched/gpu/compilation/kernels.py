"""Kernel sources, the on-disk code-object cache and the in-process module cache.

Sources are src_c/hip/*.hip (package data `hipsched.hip_src` once installed; the source tree when
running in place), each with `prelude()` prepended: src_c/hip/prelude.h, so the same text compiles with
hiprtc and NVRTC, between the `#define`s of kernel_constants.py, the numbers the kernels share with their
launch glue. Code objects are cached on disk keyed by everything that changes the binary (see
`cache_key`); a short, corrupt or mismatched entry is a miss and is rewritten, never an error. Loaded
modules are cached per (runtime, device, source) for the life of the process."""
from __future__ import annotations

import hashlib
import os
import re
import struct
import threading
import time
from importlib import resources
from pathlib import Path

from ...atomic_file import atomic_write
from ...errors import GpuError
from . import kernel_constants
from .codeobject import kernel_symbols
from ..bindings.compilers import load_target

FORMAT_VERSION = 1
_MAGIC = b"HSCHKO01"
_HEADER = struct.Struct("<8s32sQ32s")   # magic, key digest, payload length, payload sha256
PRELUDE = "prelude.h"
_LAUNCH_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"  # allowed before or after the return type
_KERNEL_RE = re.compile(r"(?:__global__|HS_KERNEL)\s+" + _LAUNCH_BOUNDS + r"void\s+" + _LAUNCH_BOUNDS + r"(?!__launch_bounds__)(\w+)\s*\(")


def _source_dir():
    """The directory holding the .hip files: the source tree this package was imported from, else the
    installed package data. The tree comes first because `hipsched.hip_src` is looked up by name: with
    an editable install of another checkout in the environment, a package imported from this tree (a
    PYTHONPATH run) would otherwise be handed that checkout's kernels."""
    tree = Path(__file__).resolve().parents[3] / "src_c" / "hip"
    if (tree / PRELUDE).is_file():
        return tree
    try:
        root = resources.files("hipsched.hip_src")
        if any(p.name.endswith(".hip") for p in root.iterdir()):
            return root
    except (ModuleNotFoundError, FileNotFoundError, TypeError):
        pass
    return tree


CONSTANTS = "kernel_constants.py"   # the generated blocks' file name in diagnostics (#line)


def prelude(text: str | None = None) -> str:
    """What comes before every kernel source: kernel_constants' defines of the target tests, prelude.h (or
    `text`), then the constants the kernels read (after the prelude, whose vendor test they may use).
    Each part starts with a `#line` so that diagnostics name prelude.h's own lines."""
    if text is None:
        path = _source_dir() / PRELUDE
        text = path.read_text() if path.is_file() else ""
    return (f'#line 1 "{CONSTANTS}"\n' + kernel_constants.prelude_defines() + f'#line 1 "{PRELUDE}"\n' + text
            + f'\n#line 1 "{CONSTANTS}"\n' + kernel_constants.defines())


def kernel_sources() -> dict[str, str]:
    """{file name: prelude() + source} for every src_c/hip/*.hip, sorted by name."""
    root = _source_dir()
    entries = {p.name: p for p in root.iterdir()} if root.is_dir() else {}
    head = prelude(entries[PRELUDE].read_text() if PRELUDE in entries else "")
    return {name: head + "#line 1 \"" + name + "\"\n" + entries[name].read_text()
            for name in sorted(entries) if name.endswith(".hip")}


# A kernel stamped once per element type by prelude.h's HS_FOR_EACH_FLOAT: `HS_KERNEL void hs_add_##S(`
# or `hs_softmax_rows_##S##_v4(`, inside a macro whose suffix parameter is S.
_STAMPED_RE = re.compile(r"HS_KERNEL\s+" + _LAUNCH_BOUNDS + r"void\s+" + _LAUNCH_BOUNDS + r"(\w*)##\s*S\b(?:\s*##\s*(\w+))?\s*\(")
FLOAT_SUFFIXES = ("f32", "f16", "bf16")   # HS_FOR_EACH_FLOAT's, in its order


def kernel_names(source: str) -> list[str]:
    """The __global__ function names a source defines (they are extern "C", so these are the symbols),
    stamped ones once per HS_FOR_EACH_FLOAT suffix."""
    names = set(_KERNEL_RE.findall(source))
    for head, tail in _STAMPED_RE.findall(source):
        names.update(head + s + tail for s in FLOAT_SUFFIXES)
    return sorted(names)


def default_cache_dir() -> Path:
    env = os.environ.get("HIPSCHED_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hipsched" / "kernels"


def cache_key(compiler_name: str, compiler_version: str, arch: str, options, source: str, loader: str = "") -> str:
    """Hex digest over everything that can change the code object (the source includes the prelude),
    and `loader`, the driver (and HIP runtime) versions that will load it (Runtime.loader_tag): which
    compiler and which target (CUBIN or PTX) a driver can load is decided per driver. An empty
    loader, what ahead-of-time compiles write, adds no field, so their keys predate it."""
    h = hashlib.sha256()
    parts = (str(FORMAT_VERSION), compiler_name, compiler_version, arch, "\x1f".join(options), source)
    for part in parts + ((loader,) if loader else ()):
        data = part.encode()
        h.update(struct.pack("<Q", len(data)))   # length-prefixed so no two part lists collide
        h.update(data)
    return h.hexdigest()


def read_entry(path: Path, key: str) -> bytes | None:
    """The payload of a cache file, or None if it is missing, short, corrupt or for another key."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    if len(blob) < _HEADER.size:
        return None
    magic, digest, length, payload_sha = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size:]
    if (magic != _MAGIC or digest != bytes.fromhex(key) or length != len(payload)
            or hashlib.sha256(payload).digest() != payload_sha):
        return None
    return payload


def write_entry(path: Path, key: str, payload: bytes) -> None:
    """Write atomically: a temp file in the same directory, then os.replace. Concurrent writers of the
    same key each replace the file with a complete, identical entry; readers never see a partial one."""
    header = _HEADER.pack(_MAGIC, bytes.fromhex(key), len(payload), hashlib.sha256(payload).digest())
    atomic_write(path, header + payload, suffix=".co")


class KernelCache:
    """Compile-or-load code objects for one compiler, and load them as modules on a runtime.

    `code_object` needs no device; `function` loads the module once per (device, source, options) and
    returns the function handle for a launch."""

    def __init__(self, compiler, cache_dir=None, sources: dict[str, str] | None = None):
        self.compiler = compiler
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self._sources = sources
        self._lock = threading.RLock()
        self._modules: dict[tuple, int] = {}
        self._functions: dict[tuple, int] = {}
        # (runtime, device, source, options) -> the GpuError its compile or load gave: it is raised
        # again rather than retried on every call (the same code object meets the same driver).
        self._failed: dict[tuple, GpuError] = {}
        # (source, arch, options) -> (loader, code object): the bytes do not depend on the loader, so a
        # request for the same code under another loader (GpuContext.resources asks with none after the
        # module was loaded under the driver's) is not compiled again
        self._objects: dict[tuple, tuple[str, bytes]] = {}
        self.hits = 0
        self.misses = 0
        # sources being compiled off the caller's path (compile_in_background) -> when it started; those
        # done: (source, seconds, error text or None), the last 64; the errors by (source, options), which
        # the next request raises without compiling again. Their own lock: the RLock above is held for a
        # whole synchronous compile, which must not make an automatic call wait.
        self._bg_lock = threading.Lock()
        self._compiling: dict[str, float] = {}
        self._bg_failed: dict[tuple, GpuError] = {}
        self.compiled_in_background: list[tuple[str, float, str | None]] = []

    @property
    def sources(self) -> dict[str, str]:
        if self._sources is None:
            self._sources = kernel_sources()
        return self._sources

    def source(self, source_name: str) -> str:
        if source_name not in self.sources:
            raise GpuError("compile", f"no kernel source {source_name!r} (have: {', '.join(self.sources) or 'none'})")
        return self.sources[source_name]

    def entry_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.co"

    def code_object(self, source_name: str, arch: str, options=(), loader: str = "") -> bytes:
        """The code object for `source_name` on `arch`: from disk when a valid entry exists, else
        compiled and written. `loader` (Runtime.loader_tag) is part of the key; an entry written ahead
        of time with no loader (`python -m hipsched compile`) is used when there is none for it. A
        cache directory that cannot be written only costs the disk cache."""
        source = self.source(source_name)
        options = tuple(options)
        # In one process the compiler and sources are fixed, so the bytes for (source, arch, options) do not
        # depend on the loader: the loader tag only keeps a disk entry from outliving a driver change.
        memo = self._objects.get((source_name, arch, options))
        if memo is not None:
            self.hits += 1
            return memo[1]
        keys = self._disk_keys(source, arch, options, loader)
        payload = None
        for k in keys:
            payload = read_entry(self.entry_path(k), k)
            if payload is not None:
                break
        if payload is not None:
            self.hits += 1
            self._objects[(source_name, arch, options)] = (loader, payload)
            return payload
        self.misses += 1
        payload = self.compiler.compile(source, source_name, arch, options)
        try:
            write_entry(self.entry_path(keys[0]), keys[0], payload)
        except OSError:
            pass
        self._objects[(source_name, arch, options)] = (loader, payload)
        return payload

    def ready(self, runtime, source_name: str, options=()) -> bool:
        """Whether `function` would find `source_name` without compiling it: its module loaded on the
        runtime's device, its code object in memory, on disk, or known not to compile (the error is then
        raised at once)."""
        device = runtime.current_device()
        mkey = (id(runtime), device, source_name, tuple(options))
        if mkey in self._modules or mkey in self._failed or (source_name, tuple(options)) in self._bg_failed:
            return True
        try:
            target = self.target(runtime, device)
        except GpuError:
            return True   # nothing to compile in the background: the synchronous path reports it
        if (source_name, target, tuple(options)) in self._objects:
            return True
        loader = getattr(runtime, "loader_tag", lambda: "")()
        keys = self._disk_keys(self.source(source_name), target, tuple(options), loader)
        return any(self.entry_path(k).is_file() for k in keys)

    def _disk_keys(self, source: str, arch: str, options: tuple, loader: str) -> list[str]:
        """The disk entries that hold `source`'s code object for (arch, options, loader), in the order
        they are read: the loader's own, then one written ahead of time with none (`python -m hipsched
        compile`). New code objects are written under the first."""
        version = self.compiler.version()
        keys = [cache_key(self.compiler.name, version, arch, options, source, loader)]
        if loader:
            keys.append(cache_key(self.compiler.name, version, arch, options, source))
        return keys

    def compile_in_background(self, runtime, source_name: str, options=()) -> bool:
        """Starts compiling `source_name` for the runtime's device on a thread of its own (once: False
        when it is already being compiled). The code object lands in memory and on disk, where `ready`
        then finds it; a compile error is kept, and the next request for the source raises it (as a
        GpuError, counted against the GPU's health like any compile error) without compiling again."""
        with self._bg_lock:
            if source_name in self._compiling:
                return False
            self._compiling[source_name] = time.monotonic()
        device = runtime.current_device()
        loader = getattr(runtime, "loader_tag", lambda: "")()

        def compile_now():
            t0, err = time.monotonic(), None
            try:
                self.code_object(source_name, self.target(runtime, device), tuple(options), loader)
            except Exception as e:  # noqa: BLE001 - kept: the next request for the source raises it
                err = e if isinstance(e, GpuError) else GpuError("compile", f"{source_name}: {type(e).__name__}: {e}")
            with self._bg_lock:
                self._compiling.pop(source_name, None)
                if err is not None:
                    self._bg_failed[(source_name, tuple(options))] = err
                self.compiled_in_background.append((source_name, time.monotonic() - t0,
                                                    None if err is None else str(err)))
                del self.compiled_in_background[:-64]
        threading.Thread(target=compile_now, name=f"hipsched-compile-{source_name}", daemon=True).start()
        return True

    def compiling(self) -> dict[str, float]:
        """{source: seconds since its background compile started} for those still compiling."""
        now = time.monotonic()
        with self._bg_lock:
            return {s: now - t for s, t in self._compiling.items()}

    def target(self, runtime, device=None) -> str:
        """What to compile for the runtime's device so that its driver loads it (compilers.load_target):
        the device's arch, or a PTX target for an NVIDIA driver older than the compiler's CUBINs."""
        device = runtime.current_device() if device is None else device
        driver = getattr(runtime, "driver_version", lambda: 0)()
        return load_target(self.compiler, runtime.device_info(device).arch, driver or None)

    def function(self, runtime, source_name: str, kernel_name: str, options=()) -> int:
        """Function handle for `kernel_name` in `source_name`, compiled for the runtime's current
        device; the module is loaded once per (runtime, device, source, options). A module that does
        not compile or that the driver will not load raises the same GpuError on every later call
        without being tried again; one the driver refuses is kind "unavailable"."""
        device = runtime.current_device()
        fkey = (id(runtime), device, source_name, tuple(options), kernel_name)
        fn = self._functions.get(fkey)
        if fn is not None:
            return fn
        with self._lock:
            mkey = fkey[:4]
            if mkey in self._failed:
                raise self._failed[mkey]
            module = self._modules.get(mkey)
            if module is None:
                module = self._load(runtime, device, source_name, tuple(options), mkey)
                self._modules[mkey] = module
            fn = runtime.module_function(module, kernel_name)
            self._functions[fkey] = fn
            return fn

    def _load(self, runtime, device, source_name, options, mkey) -> int:
        loader = getattr(runtime, "loader_tag", lambda: "")()
        failed = self._bg_failed.get((source_name, tuple(options)))
        if failed is not None:   # its background compile failed: the same source fails the same way
            if failed.kind in ("compile", "unavailable", "unsupported"):
                self._failed[mkey] = failed
            raise failed
        try:
            target = self.target(runtime, device)
            code = self.code_object(source_name, target, options, loader)
        except GpuError as e:
            if e.kind in ("compile", "unavailable", "unsupported"):
                self._failed[mkey] = e
            raise
        try:
            return runtime.module_load(code)
        except GpuError as e:
            if e.kind not in ("compile", "unavailable"):
                raise   # out of memory and the like may pass; try again next call
            err = GpuError("unavailable", f"the driver will not load {source_name} as compiled by "
                                          f"{self.compiler.version()} for {target} "
                                          f"({loader or 'driver version unknown'}): {e}",
                           name=e.name or "module-load-failed")
            self._failed[mkey] = err
            raise err from None

    def unload(self, runtime) -> None:
        """Unload every module this cache loaded on `runtime` (at runtime shutdown)."""
        with self._lock:
            for mkey in [k for k in self._modules if k[0] == id(runtime)]:
                try:
                    runtime.module_unload(self._modules.pop(mkey))
                except GpuError:
                    pass
            for fkey in [k for k in self._functions if k[0] == id(runtime)]:
                del self._functions[fkey]
            for mkey in [k for k in self._failed if k[0] == id(runtime)]:
                del self._failed[mkey]


def compile_all(compiler, arch: str, cache_dir=None, options=()) -> list[tuple]:
    """Compile every kernel source for `arch` through the disk cache. Returns one row per source:
    (source, kernel names, code-object bytes or the GpuError, seconds, compiler version). Kernel names
    come from the code object's symbol table (so macro-generated kernels count), else the source."""
    cache = KernelCache(compiler, cache_dir)
    rows = []
    for name, text in cache.sources.items():
        t0 = time.perf_counter()
        try:
            result = cache.code_object(name, arch, options)
        except GpuError as e:
            result = e
        seconds = time.perf_counter() - t0
        names = (kernel_symbols(result) if isinstance(result, bytes) else None) or kernel_names(text)
        rows.append((name, names, result, seconds, compiler.version()))
    return rows
