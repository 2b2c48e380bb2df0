"""forge-aot runtime: launches the binaries packaged in a wheel through the GPU driver API.

Shipped verbatim inside every generated package as ``<package>/_runtime``. It needs torch (tensors, streams)
and the GPU driver (``libcuda.so.1`` or ``libamdhip64.so``) only: never Triton, never forge-aot, never a
compiler, so every import here is relative. forge-aot imports this same package for its development mode and
its build-time checks, so the rules (table lookup, binary selection, constraints) are the same in the source
tree and in the wheel. One module per concern:

- ``errors``: the error hierarchy;      ``expressions``: the constraint language;
- ``host_triton``: ``triton`` in host code;      ``tables``: variants, specializations, configs, targets;
- ``cuda``, ``hip``, ``drivers``: the driver libraries;      ``packing``: argument encodings;
- ``kernel``: kernel handles and call binding;      ``launch``: binary choice, loading, the launch;
- ``host_modules``: running the shipped host code;      ``entry``: the package entry point (lazy);
- ``fastpath``: the optional C launch path (``_fastlaunch.c``, compiled into wheels by ``forge-aot build``).

Names are loaded on first access (PEP 562): ``import <package>`` imports this file and ``entry`` only.

In a wheel, the modules a first call needs also load from one file, ``__pycache__/_bundle.<cache tag>.bin``:
their cached bytecode, gathered after the first call in an environment where the package directory is
writable, and used while every module file keeps the size and modification time it had then. One file read
instead of eleven trips through the import system's finders and bytecode caches: 3.8 -> 2.2 ms per fresh
process on the H100 host (scripts/probe_runtime_bundle.py). Where there is no valid bundle, imports are the
import system's own.
"""

from __future__ import annotations

import contextlib
import importlib
import marshal
import os
import sys
import types
from typing import Any

_EXPORTS = {
    "DriverError": "errors",
    "ForgeRuntimeError": "errors",
    "IntegrityError": "errors",
    "NotBuiltError": "errors",
    "UnsupportedDeviceError": "errors",
    "UnsupportedDtypeError": "errors",
    "Expression": "expressions",
    "INDEX_FORMAT": "host_modules",
    "bind_module": "host_modules",
    "bind_ops": "host_modules",
    "exec_host_module": "host_modules",
    "load_index": "host_modules",
    "register_torch_ops": "host_modules",
    "load_package": "entry",
    "_HostTriton": "host_triton",
    "cdiv": "host_triton",
    "host_triton": "host_triton",
    "next_power_of_2": "host_triton",
    "Kernel": "kernel",
    "BinaryBackend": "launch",
    "_BinaryLauncher": "launch",
    "choose_binary": "launch",
    "_pack_bf16": "packing",
    "_pack_fp16": "packing",
    "dtype_name": "packing",
    "HEURISTICS_HOOK": "tables",
    "LAUNCH_DEFAULTS": "tables",
    "LAUNCH_OPTIONS": "tables",
    "SPEC_DIV16": "tables",
    "SPEC_NONE": "tables",
    "SPEC_ONE": "tables",
    "TRITON_DEFAULTS": "tables",
    "Config": "tables",
    "ConfigTable": "tables",
    "argument_spec": "tables",
    "pick_cuda_target": "tables",
    "pick_hip_target": "tables",
    "rank_rows": "tables",
    "resolve_table": "tables",
    "spec_fits": "tables",
    "spec_rank": "tables",
    "variant_id": "tables",
}
_SUBMODULES = frozenset({"cuda", "drivers", "entry", "errors", "expressions", "fastpath", "hip", "host_modules",
                         "host_triton", "kernel", "launch", "packing", "tables"})
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})


class _Runtime(types.ModuleType):
    """``host_triton`` names both a submodule and the object exported from it: importing the submodule (lazily,
    whenever another module needs it) must not replace the exported object."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and name in _SUBMODULES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Runtime


# -- the bytecode bundle (wheels only) -------------------------------------------------------------------------

BUNDLED = ("entry", "errors", "host_triton", "packing", "tables", "drivers", "cuda", "fastpath", "kernel", "launch",
           "host_modules")
"""The modules ``import <package>`` and an op's first call import (``hip`` and ``expressions`` load as needed)."""
_BUNDLE_FORMAT = b"forge-aot runtime bundle 1\n"


_IN_A_WHEEL = __name__.endswith("._runtime")
"""Shipped as ``<package>._runtime`` (the source tree's copy, imported by the build tools, bundles nothing)."""


def _bundle_path() -> str | None:
    tag = sys.implementation.cache_tag
    return None if tag is None else os.path.join(os.path.dirname(__file__), "__pycache__", f"_bundle.{tag}.bin")


def _source(name: str) -> str:
    return os.path.join(os.path.dirname(__file__), f"{name}.py")


def _read_bundle(path: str) -> dict[str, Any] | None:
    """Module name -> its marshalled bytecode, or None where the file is missing, of another interpreter, or any
    module's file changed since it was written."""
    from importlib.util import MAGIC_NUMBER

    try:
        with open(path, "rb") as f:
            data = f.read()
        head = len(_BUNDLE_FORMAT) + len(MAGIC_NUMBER)
        if data[:head] != _BUNDLE_FORMAT + MAGIC_NUMBER:
            return None
        size = int.from_bytes(data[head:head + 4], "little")
        table = marshal.loads(data[head + 4:head + 4 + size])
        blob = memoryview(data)[head + 4 + size:]
        out = {}
        for name, mtime_ns, st_size, offset, length in table:
            st = os.stat(_source(name))
            if (st.st_mtime_ns, st.st_size) != (mtime_ns, st_size) or offset + length > len(blob):
                return None
            out[name] = blob[offset:offset + length]
        return out if set(out) == set(BUNDLED) else None
    except (OSError, ValueError, EOFError, TypeError):
        return None


BUNDLE_WANTED = False
"""Whether this process found no valid bundle (in a wheel): the first call then writes one."""


def first_call_done() -> None:
    """After an op's first call, where there was no valid bundle: write it, unless Python was asked not to write
    bytecode (PYTHONDONTWRITEBYTECODE; ``write_bundle()`` then writes it on request)."""
    global BUNDLE_WANTED
    if BUNDLE_WANTED:
        BUNDLE_WANTED = False  # one try per process
        if not sys.dont_write_bytecode:
            write_bundle()


def write_bundle() -> bool:
    """Write the bundle now (for example while baking an image with PYTHONDONTWRITEBYTECODE set): import the
    modules in BUNDLED and gather their cached bytecode, atomically. Only where each module's .pyc matches its
    source; never raises. Returns whether it wrote."""
    path = _bundle_path()
    if path is None or not _IN_A_WHEEL:
        return False
    from importlib.util import MAGIC_NUMBER

    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        table, chunks, offset = [], [], 0
        for name in BUNDLED:
            module = importlib.import_module(f".{name}", __name__)
            cached = getattr(module, "__cached__", None)
            if not cached:
                return False
            st = os.stat(_source(name))
            with open(cached, "rb") as f:
                pyc = f.read()
            # A timestamp .pyc of this interpreter for the source as it is now (what the import system checked).
            if (pyc[:4] != MAGIC_NUMBER or int.from_bytes(pyc[4:8], "little") != 0
                    or int.from_bytes(pyc[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
                    or int.from_bytes(pyc[12:16], "little") != st.st_size & 0xFFFFFFFF):
                return False
            code = pyc[16:]
            table.append((name, st.st_mtime_ns, st.st_size, offset, len(code)))
            chunks.append(code)
            offset += len(code)
        header = marshal.dumps(table)
        with open(tmp, "wb") as f:
            f.write(_BUNDLE_FORMAT + MAGIC_NUMBER + len(header).to_bytes(4, "little") + header + b"".join(chunks))
        os.replace(tmp, path)
        return True
    except OSError:  # a read-only installation: imports stay the import system's own
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False


class _BundleFinder:
    """Finds this package's bundled modules in the bundle (before the path finders); leaves sys.meta_path once
    they are all imported. The import system still does the rest (locks, sys.modules, module attributes)."""

    def __init__(self, package: str, codes: dict[str, Any]) -> None:
        self.prefix = package + "."
        self.codes = codes
        self.left = set(codes)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix):
            return None
        name = fullname[len(self.prefix):]
        if name not in self.left:
            return None
        from importlib.machinery import ModuleSpec

        origin = _source(name)
        spec = ModuleSpec(fullname, _BundleLoader(self, name, fullname, origin), origin=origin)
        spec.has_location = True
        return spec


class _BundleLoader:
    def __init__(self, finder: _BundleFinder, name: str, fullname: str, origin: str) -> None:
        self.finder, self.name, self.fullname, self.origin = finder, name, fullname, origin

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        finder = self.finder
        code = marshal.loads(finder.codes[self.name])
        finder.left.discard(self.name)
        if not finder.left:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)
        exec(code, module.__dict__)

    def get_filename(self, fullname: str) -> str:
        return self.origin

    def get_source(self, fullname: str) -> str:
        with open(self.origin, encoding="utf-8") as f:
            return f.read()


def _install_bundle() -> None:
    global BUNDLE_WANTED
    path = _bundle_path()
    if path is None or not _IN_A_WHEEL:
        return
    codes = _read_bundle(path)
    if codes is None:
        BUNDLE_WANTED = True
    else:
        sys.meta_path.insert(0, _BundleFinder(__name__, codes))


_install_bundle()
