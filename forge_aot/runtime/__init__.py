"""forge-aot runtime: launches the binaries packaged in a wheel through the GPU driver API.

Shipped verbatim inside every generated package as ``<package>/_runtime``. It needs torch (tensors, streams)
and the GPU driver (``libcuda.so.1`` or ``libamdhip64.so``) only: never Triton, never forge-aot, never a
compiler, so every import here is relative. forge-aot imports this same package for its development mode and
its build-time checks, so the rules (table lookup, binary selection, constraints) are the same in the source
tree and in the wheel. One module per concern:

- ``errors``: the error hierarchy;      ``expressions``: the constraint language;
- ``host_triton``: ``triton`` in host code;      ``tables``: variants, specializations, configs, targets;
- ``host_driver``: ``triton.runtime.driver`` and torch.library's Triton entry points in host code (lazy);
- ``compiled``: what ``kernel.warmup(...)`` returns (lazy);
- ``cuda``, ``hip``, ``drivers``: the driver libraries;      ``packing``: argument encodings;
- ``kernel``: kernel handles and call binding;      ``launch``: binary choice, loading, the launch;
- ``host_modules``: running the shipped host code;      ``entry``: the package entry point (lazy);
- ``torch_ops``: what the ops' torch custom ops run (Meta implementation, autograd, backward routing), ``fake_env``;
- ``descriptors``: host-side tensor descriptors and their kernel parameters (lazy);
- ``fastpath``: the optional C launch path (``_fastlaunch.c``, compiled into wheels by ``forge-aot build``).

Names are loaded on first access (PEP 562): ``import <package>`` imports this file and ``entry`` only (and
``torch_ops`` where the package's ops have autograd).

In a wheel, the modules a first call needs also load from one file, their cached bytecode gathered into
``_bundle.py``'s cache name (``__pycache__/_bundle.<cache tag>.pyc``; see ``_bundle``) after the first call where
Python writes bytecode, or by ``write_bundle()``. It is used while it was written for these sources (the build's
fingerprint, handed over by the package's ``__init__``) and every module file keeps the size and modification time
it had then. One file read instead of twelve trips through the import system's finders and bytecode caches:
the modules' imports alone 3.8 -> 2.2 ms per fresh process on the H100 host (scripts/probe_runtime_bundle.py);
import + first call 0.1 - 1.1 ms less (bench_cold_start.py --op-only), as reading the bundle moves part of the cost
to ``import <package>``. Where there is no valid bundle, imports are the import system's own.
"""

from __future__ import annotations

import _imp
import contextlib
import importlib
import marshal
import os
import sys
import threading
import types
from importlib.machinery import SourceFileLoader
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
    "imports_first": "host_modules",
    "project_names_bound": "host_modules",
    "load_index": "host_modules",
    "register_torch_ops": "host_modules",
    "register_custom_ops": "entry",
    "route_in_module": "torch_ops",
    "ROUTING": "torch_ops",
    "load_package": "entry",
    "_HostTriton": "host_triton",
    "HOST_DTYPES": "host_triton",
    "HostDtype": "host_triton",
    "cdiv": "host_triton",
    "host_triton": "host_triton",
    "next_power_of_2": "host_triton",
    "Kernel": "kernel",
    "TensorDescriptor": "descriptors",
    "desc_dtype": "descriptors",
    "desc_signature": "descriptors",
    "PlaceholderCompiled": "compiled",
    "CompiledBase": "compiled",
    "DEVICE_PROFILE": "host_driver",
    "GPUTarget": "host_driver",
    "BinaryBackend": "launch",
    "_BinaryLauncher": "launch",
    "choose_binary": "tables",
    "_pack_bf16": "packing",
    "_pack_fp16": "packing",
    "dtype_name": "packing",
    "HEURISTICS_HOOK": "tables",
    "KERNEL_SIDE_HOOK": "tables",
    "LAUNCH_DEFAULTS": "tables",
    "LAUNCH_OPTIONS": "tables",
    "COMPILE_OPTIONS": "tables",
    "LAUNCH_FLAGS": "tables",
    "launch_attrs": "tables",
    "SPEC_DIV16": "tables",
    "SPEC_ABSENT": "tables",
    "SPEC_DESC": "tables",
    "pointer_value": "tables",
    "block_shapes": "descriptors",
    "SPEC_NONE": "tables",
    "SPEC_ONE": "tables",
    "SPEC_INT": "tables", "SPEC_INT_DIV16": "tables", "SPEC_INT_ONE": "tables", "PointerInt": "tables",
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
_SUBMODULES = frozenset({"compiled", "cuda", "descriptors", "drivers", "entry", "errors", "expressions", "fastpath",
                        "hip", "host_driver", "host_modules", "host_triton", "kernel", "launch", "local_imports",
                        "packing", "tables", "torch_ops", "fake_env"})
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

BUNDLED = ("entry", "torch_ops", "errors", "host_triton", "packing", "tables", "drivers", "cuda", "fastpath", "kernel",
           "launch", "host_modules")
"""The modules ``import <package>`` and an op's first call import (``hip`` and ``expressions`` load as needed;
``torch_ops`` at import where the ops have autograd, else when torch.compile or torch.export first trace one)."""
_BUNDLE_FORMAT = b"forge-aot runtime bundle 2\n"
_IN_A_WHEEL = __name__.endswith("._runtime")
"""Shipped as ``<package>._runtime`` (the source tree's copy, imported by the build tools, bundles nothing)."""
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
    in BUNDLED from the bundle where it is valid, else note that the first call should write it."""
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
    else:
        sys.meta_path.insert(0, _BundleFinder(__name__, codes))


def _read_bundle(path: str, fingerprint: str) -> dict[str, Any] | None:
    """Module name -> its marshalled bytecode, or None where the file is missing, damaged, of another interpreter
    or other sources, or any module's file changed since it was written."""
    from importlib.util import MAGIC_NUMBER

    try:
        with open(path, "rb") as f:
            data = f.read()
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


def first_call_done() -> None:
    """After an op's first call, where there was no valid bundle: write it, unless Python was asked not to write
    bytecode (PYTHONDONTWRITEBYTECODE; ``write_bundle()`` then writes it on request)."""
    global BUNDLE_WANTED
    if BUNDLE_WANTED:
        BUNDLE_WANTED = False  # one try per process
        if not sys.dont_write_bytecode:
            write_bundle()


def _checked_bytecode(cached: str, source: str) -> bytes | None:
    """The code part of a .pyc that the import system would accept for ``source`` as it is now, else None."""
    from importlib.util import MAGIC_NUMBER, source_hash

    with open(cached, "rb") as f:
        pyc = f.read()
    if pyc[:4] != MAGIC_NUMBER:
        return None
    flags = int.from_bytes(pyc[4:8], "little")
    if flags == 0:  # timestamp .pyc (PEP 552): the source's mtime and size
        st = os.stat(source)
        if (int.from_bytes(pyc[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
                or int.from_bytes(pyc[12:16], "little") != st.st_size & 0xFFFFFFFF):
            return None
    elif flags in (1, 3):  # hash-based .pyc (SOURCE_DATE_EPOCH installs): the source's hash, checked here either way
        with open(source, "rb") as f:
            if pyc[8:16] != source_hash(f.read()):
                return None
    else:
        return None
    return pyc[16:]


def _module_bytecode(name: str) -> bytes:
    """A module's bytecode as the import system would load it now: its .pyc where that matches the source, else
    the source compiled as the import system compiles it (no .pyc: ``pip install --no-compile``, uv)."""
    module = importlib.import_module(f".{name}", __name__)
    cached = getattr(module, "__cached__", None)
    code = None
    if cached:
        with contextlib.suppress(OSError):
            code = _checked_bytecode(cached, _source(name))
    if code is None:
        loader = SourceFileLoader(module.__name__, _source(name))
        code = marshal.dumps(loader.source_to_code(loader.get_data(_source(name)), _source(name)))
    return code


def write_bundle() -> bool:
    """Write the bundle now (for example while baking an image with PYTHONDONTWRITEBYTECODE set): import the
    modules in BUNDLED and gather their bytecode, atomically, with the permissions Python gives a .pyc. Never
    raises. Returns whether it wrote (False at once where the bytecode directory is not writable)."""
    path = _bundle_path()
    if path is None or _FINGERPRINT is None:
        return False
    directory = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK):
            return False  # a read-only or another user's installation: not worth gathering anything
        table, chunks, offset = [], [], 0
        for name in BUNDLED:
            code = _module_bytecode(name)
            st = os.stat(_source(name))
            table.append((name, st.st_mtime_ns, st.st_size, offset, len(code)))
            chunks.append(code)
            offset += len(code)
        from importlib.util import MAGIC_NUMBER

        header = marshal.dumps((_FINGERPRINT, table))
        # As the import system writes a .pyc: the source's permissions (owner-writable, umask applied), a
        # private temporary name, then one rename.
        mode = (os.stat(_source("_bundle")).st_mode | 0o200) & 0o666
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_EXCL | os.O_CREAT | os.O_WRONLY, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(_BUNDLE_FORMAT + MAGIC_NUMBER + len(header).to_bytes(4, "little") + header + b"".join(chunks))
        os.replace(tmp, path)
        return True
    except Exception:  # imports stay the import system's own
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False


class _BundleLoader(SourceFileLoader):
    """The import system's own loader for a module's file, with the module's code taken from the bundle (its file
    name fixed in it, as the import system does); its own way where the bundle's bytes do not load."""

    def __init__(self, fullname: str, path: str, codes: dict[str, Any], name: str) -> None:
        super().__init__(fullname, path)
        self.codes, self.name = codes, name

    def get_code(self, fullname: str) -> Any:
        data = self.codes.pop(self.name, None)  # taken once: the bundle's memory goes as the modules load
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
        from importlib.machinery import ModuleSpec

        origin = _source(name)
        spec = ModuleSpec(fullname, _BundleLoader(fullname, origin, self.codes, name), origin=origin)
        spec.has_location = True  # __file__ and __cached__ as for the module's own file
        return spec
