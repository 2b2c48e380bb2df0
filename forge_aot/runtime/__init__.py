"""forge-aot runtime: launches the binaries packaged in a wheel through the GPU driver API.

Shipped verbatim inside every generated package as ``<package>/_runtime``. It needs torch (tensors, streams)
and the GPU driver (``libcuda.so.1`` or ``libamdhip64.so``) only: never Triton, never forge-aot, never a
compiler, so every import here is relative. forge-aot imports this same package for its development mode and
its build-time checks, so the rules (table lookup, binary selection, constraints) are the same in the source
tree and in the wheel. One module per concern:

- ``lean``: ``import <package>`` (the exported ops, ``torch.ops.<package>``) and the simplest ops' first calls
  without any other runtime module (``LeanKernel``), handing over to the rest; what every path reads alike;
- ``errors``: the error hierarchy;      ``expressions``: the constraint language;
- ``rules``: what every reading of the index shares (launch options, ``read_params``, ``Config``);
- ``cold``, ``cold_launch``, ``cold_binding``: plain kernels' first calls without the rest of the runtime
  (``ColdKernel``, promoted to ``Kernel``), what they launch with, and the host modules bound with them;
- ``exports``: the full runtime's exported ops (custom ops while tracing);
- ``host_triton``: ``triton`` in host code;      ``tables``: variants, specializations, configs, targets;
- ``host_driver``: ``triton.runtime.driver`` and torch.library's Triton entry points in host code (lazy);
- ``compiled``: what ``kernel.warmup(...)`` returns (lazy);
- ``host_decorators``: ``triton.heuristics``, ``triton.Config`` and ``triton.autotune`` in host code (lazy);
- ``cuda``, ``cuda_ctypes`` (without the C extension, and for rare calls), ``hip``, ``drivers``: the driver
  libraries;      ``packing``: argument encodings;
- ``kernel``: kernel handles and call binding;      ``launch``: binary choice, loading, the launch;
- ``host_modules``: the full binding of the shipped host code;      ``entry``: the package entry point (lazy);
- ``host_exec``: running a shipped file of host code (both bindings, project modules) and the package's module index;
- ``local_imports``: the project modules shipped with the package, imported under the package's rules;
- ``custom_ops``: the ops' torch custom ops, defined on first need;
- ``dev_binding``: binding every host module at once (forge-aot's tracing, tuning and development mode);
- ``torch_ops``: what the ops' torch custom ops run (Meta implementation, autograd, backward routing), ``fake_env``;
- ``descriptors``: host-side tensor descriptors and their kernel parameters (lazy);
- ``fastpath``: the optional C launch path (``_fastlaunch.c``, compiled into wheels by ``forge-aot build``);
- ``bundling``: writing the bytecode bundle (below).

Names are loaded on first access (PEP 562): ``import <package>`` imports this file and ``lean`` only (where the full
runtime serves from import on, ``entry``, ``exports`` and the modules of FIRST_CALL where the bundle is valid).

In a wheel, the full runtime's modules also load from one file, their bytecode gathered into ``_bundle.py``'s cache
name (``__pycache__/_bundle.<cache tag>.pyc``; see ``_bundle``) after the first call that loads them where Python
writes bytecode, or by ``write_bundle()``, less the docstrings and annotations nothing reads at run time (see
``bundling``). It is used while it was written for these sources (the build's fingerprint, handed over by the
package's ``__init__``) and every module file keeps the size and modification time it had then. One file read
instead of twelve trips through the import system's finders and bytecode caches: the modules' imports alone 3.8 ->
2.2 ms per fresh process on the H100 host (scripts/probe_runtime_bundle.py). Where there is no valid bundle, imports
are the import system's own.
"""

from __future__ import annotations

import _imp
import importlib
import marshal
import os
import sys
import types
from importlib.machinery import ModuleSpec, SourceFileLoader
from typing import Any

_EXPORTS = {
    "DriverError": "errors", "ForgeRuntimeError": "errors", "IntegrityError": "errors", "NotBuiltError": "errors",
    "UnsupportedDeviceError": "errors", "UnsupportedDtypeError": "errors", "Expression": "expressions",
    "INDEX_FORMAT": "host_modules", "bind_module": "host_modules", "bind_ops": "dev_binding",
    "exec_host_module": "host_modules", "imports_first": "dev_binding", "project_names_bound": "dev_binding",
    "load_index": "host_modules", "register_torch_ops": "dev_binding", "register_custom_ops": "custom_ops",
    "route_in_module": "torch_ops", "ROUTING": "torch_ops", "load_package": "entry", "_HostTriton": "host_triton",
    "HOST_DTYPES": "host_triton", "HostDtype": "host_triton", "cdiv": "host_triton", "host_triton": "host_triton",
    "next_power_of_2": "host_triton", "Kernel": "kernel", "TensorDescriptor": "descriptors",
    "desc_dtype": "descriptors", "desc_signature": "descriptors", "PlaceholderCompiled": "compiled",
    "launched": "fastpath", "CompiledBase": "compiled", "DEVICE_PROFILE": "host_driver", "GPUTarget": "host_driver",
    "BinaryBackend": "launch", "_BinaryLauncher": "launch", "choose_binary": "tables", "_pack_bf16": "packing",
    "_pack_fp16": "packing", "dtype_name": "packing", "HEURISTICS_HOOK": "tables", "KERNEL_SIDE_HOOK": "tables",
    "LAUNCH_DEFAULTS": "tables", "LAUNCH_OPTIONS": "tables", "COMPILE_OPTIONS": "tables", "LAUNCH_FLAGS": "tables",
    "launch_attrs": "rules", "SPEC_DIV16": "tables", "SPEC_ABSENT": "tables", "SPEC_DESC": "tables",
    "pointer_value": "tables", "block_shapes": "descriptors", "SPEC_NONE": "tables", "SPEC_ONE": "tables",
    "SPEC_INT": "tables", "SPEC_INT_DIV16": "tables", "SPEC_INT_ONE": "tables", "PointerInt": "tables",
    "TRITON_DEFAULTS": "tables", "Config": "tables", "ConfigTable": "tables", "argument_spec": "tables",
    "pick_cuda_target": "tables", "pick_hip_target": "tables", "rank_rows": "tables", "resolve_table": "tables",
    "spec_fits": "tables", "spec_rank": "tables", "variant_id": "tables"
}
_SUBMODULES = frozenset({"compiled", "cuda", "cuda_ctypes", "descriptors", "drivers", "entry", "errors", "expressions",
                        "fastpath", "hip", "host_driver", "host_modules", "host_triton", "kernel", "launch",
                        "local_imports", "packing", "tables", "torch_ops", "fake_env", "bundling", "custom_ops",
                        "dev_binding", "host_decorators", "rules", "cold", "cold_binding", "exports", "host_exec",
                        "cold_launch", "lean"})
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

BUNDLED = ("basics", "lean", "lean_kernel", "entry", "custom_ops", "torch_ops", "errors", "host_triton", "packing",
           "rules", "tables", "drivers", "cuda", "fastpath", "cold_launch", "cold", "cold_binding", "exports", "kernel",
           "launch", "host_modules", "host_exec", "local_imports", "expressions")
"""The modules ``import <package>`` and a first call import (``hip`` loads as needed; ``custom_ops``, ``torch_ops``
when an op is first traced or ``torch.ops.<package>`` used; ``local_imports``, ``expressions`` where needed)."""
LEAN = ("basics", "lean", "lean_kernel")
"""What ``import <package>`` runs from the bundle where it is valid, straight, not through the import system's
finders: the lean first calls (``lean``) need nothing else."""
FIRST_CALL = ("exports", "entry", "packing", "rules", "drivers", "fastpath", "cuda", "cold_launch", "cold",
              "host_exec", "cold_binding")
"""A full-runtime first call's modules where its kernels are plain (``cold``), in the order they import each other:
run at import from the bundle where the full runtime serves from import on (``lean.load_package``). The others
load from the bundle on first need, as all do after a lean package's hand-over."""
_BUNDLE_FORMAT = b"forge-aot runtime bundle 3\n"
_IN_A_WHEEL = __name__.endswith("._runtime")  # (the source tree's copy, imported by the build tools, bundles nothing)
_FINGERPRINT: str | None = None
"""The build's sha256 of these modules' sources (``use_bundle``): a bundle of other sources is never used."""
BUNDLE_WANTED = False
"""Whether this process found no valid bundle (in a wheel): the first call then writes one."""


def _source(name: str) -> str:
    return os.path.join(os.path.dirname(__file__), f"{name}.py")


def _bundle_path() -> str | None:
    """Where ``_bundle.py``'s cached bytecode would be (see that module), or None where nothing is cached."""
    from importlib.util import cache_from_source

    try:
        return cache_from_source(_source("_bundle"))
    except NotImplementedError:  # sys.implementation.cache_tag is None
        return None


def use_bundle(fingerprint: str) -> None:
    """Called first by the package's ``__init__`` with the build's fingerprint of these sources: serve the modules
    in BUNDLED from the bundle where it is valid (LEAN's run now), else note that the first call should write it."""
    global _FINGERPRINT, BUNDLE_WANTED
    if not _IN_A_WHEEL or _FINGERPRINT is not None:
        return
    _FINGERPRINT = fingerprint
    path = _bundle_path()
    if path is None:
        return
    codes = _read_bundle(path, fingerprint)
    if codes is None:
        BUNDLE_WANTED = True
        return
    finder = _BundleFinder(__name__, codes)
    sys.meta_path.insert(0, finder)
    run_bundled(LEAN)


def run_bundled(names: tuple[str, ...]) -> None:
    """Run these bundled modules now (only under ``import <package>``'s import lock: see ``_load_bundled``)."""
    finder = next((f for f in sys.meta_path if isinstance(f, _BundleFinder) and f.prefix == f"{__name__}."), None)
    for name in names if finder is not None else ():
        _load_bundled(finder, sys.modules[__name__], name)  # type: ignore[arg-type]


def _load_bundled(finder: _BundleFinder, package: types.ModuleType, name: str) -> None:
    """Run a bundled module now, as the import system would (its spec, loader and attributes; in sys.modules and
    on the package), without its finders and locks: this runs while ``import <package>`` holds the package's
    import lock, so no other thread imports from it. 0.25 ms less per fresh process than eleven imports through
    the finder (locally). A module that fails is left to the import system, whose import then raises as it would."""
    fullname = f"{__name__}.{name}"
    spec = None if fullname in sys.modules else finder.find_spec(fullname)
    if spec is None:  # imported already (by a module before), or not in the bundle
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    sys.modules[fullname] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules.pop(fullname, None)
        return
    setattr(package, name, sys.modules[fullname])


def _read_bundle(path: str, fingerprint: str) -> dict[str, Any] | None:
    """Module name -> its marshalled bytecode, or None where the file is missing, damaged, of another interpreter
    or other sources, or any module's file changed since it was written."""
    from importlib.util import MAGIC_NUMBER

    try:
        with open(path, "rb") as f:
            data = _map(f)
        head = len(_BUNDLE_FORMAT) + len(MAGIC_NUMBER)
        if data[:head] != _BUNDLE_FORMAT + MAGIC_NUMBER:
            return None
        size = int.from_bytes(data[head:head + 4], "little")
        written_for, table = marshal.loads(data[head + 4:head + 4 + size])
        if written_for != fingerprint:
            return None
        blob = memoryview(data)[head + 4 + size:]
        out = {}
        for name, mtime_ns, st_size, offset, length in table:
            st = os.stat(_source(name))
            if (st.st_mtime_ns, st.st_size) != (mtime_ns, st_size) or offset + length > len(blob):
                return None
            out[name] = blob[offset:offset + length]
        return out if set(out) == set(BUNDLED) else None
    except Exception:  # unreadable or damaged: imports stay the import system's own
        return None


def _map(f: Any) -> Any:
    """The bundle's bytes: mapped where torch has imported ``mmap`` already (only the pages of the modules that
    load are read: 0.1 - 0.2 ms less than reading all 280 KB, locally), else read. The writer replaces the file,
    never rewrites it in place, so a mapping never sees it change."""
    mmap = sys.modules.get("mmap")
    if mmap is not None:
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # (an empty file, a file system that cannot map)
            pass
    return f.read()


def first_call_done() -> None:
    """After an op's first call, where there was no valid bundle: write it, unless Python was asked not to write
    bytecode (PYTHONDONTWRITEBYTECODE; ``write_bundle()`` then writes it on request)."""
    global BUNDLE_WANTED
    if BUNDLE_WANTED:
        BUNDLE_WANTED = False  # one try per process
        if not sys.dont_write_bytecode:
            write_bundle()


def write_bundle() -> bool:
    """Write the bundle now (for example while baking an image with PYTHONDONTWRITEBYTECODE set): the modules in
    BUNDLED compiled from their sources (see ``bundling``). Never raises. Returns whether it wrote (False at once
    where the bytecode directory is not writable)."""
    path = _bundle_path()
    if path is None or _FINGERPRINT is None:
        return False
    try:
        from .bundling import write
    except Exception:  # imports stay the import system's own
        return False
    return write(path, _FINGERPRINT, BUNDLED, _source, _BUNDLE_FORMAT)


class _BundleLoader(SourceFileLoader):
    """The import system's own loader for a module's file, with the module's code taken from the bundle (its file
    name fixed in it, as the import system does); its own way where the bundle's bytes do not load."""

    def __init__(self, fullname: str, path: str, codes: dict[str, Any], name: str) -> None:
        super().__init__(fullname, path)
        self.codes, self.short = codes, name  # (``name`` is the loader's full module name)

    def get_code(self, fullname: str) -> Any:
        data = self.codes.pop(self.short, None)  # taken once: the bundle's memory goes as the modules load
        if data is not None:
            try:
                code = marshal.loads(data)
            except (ValueError, EOFError, TypeError):
                code = None
            if code is not None:
                _imp._fix_co_filename(code, self.path)
                return code
        return super().get_code(fullname)


class _BundleFinder:
    """Finds this package's bundled modules in the bundle, before the path finders (the import system does the
    rest: locks, sys.modules, module attributes). It stays in sys.meta_path, answering None to every other name
    (removing it could make another thread's import skip a finder)."""

    def __init__(self, package: str, codes: dict[str, Any]) -> None:
        self.prefix = package + "."
        self.codes = codes

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix):
            return None
        name = fullname[len(self.prefix):]
        if name not in self.codes:
            return None
        origin = _source(name)
        spec = ModuleSpec(fullname, _BundleLoader(fullname, origin, self.codes, name), origin=origin)
        spec.has_location = True  # __file__ and __cached__ as for the module's own file
        return spec
