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
- ``bundling``: what the bytecode bundle holds, and writing it (below);      ``names``: this package's names.

Names are loaded on first access (PEP 562, ``names``): ``import <package>`` runs this file and LEAN's modules only
(where the full runtime serves from import on, the modules of ``FIRST_CALL`` too). This file is what every fresh
process runs first, so it holds only the bundle's reading and serving (below); the package's names and the
bundle's writing are in ``names`` and ``bundling``, loaded when first needed.

In a wheel, the runtime's modules also load from one file, their bytecode gathered into ``_bundle.py``'s cache name
(``__pycache__/_bundle.<cache tag>.pyc``) after the first call that loads them where Python writes bytecode, or by
``write_bundle()``, less the docstrings and annotations nothing reads at run time (see ``bundling``). It is used
while it was written for these sources (the build's fingerprint, handed over by the package's ``__init__``) and
each module's file keeps the size and modification time it had then: LEAN's checked and run at import, the others'
checked together when the first of them is imported. One file read instead of a dozen trips through the import
system's finders and bytecode caches. Where there is no valid bundle, imports are the import system's own.
"""

from __future__ import annotations

import marshal
import os
import sys
from typing import Any

LEAN = ("basics", "lean", "lean_kernel")
"""What ``import <package>`` runs from the bundle where it is valid, straight, not through the import system:
the lean first calls (``lean``) need nothing else."""
BUNDLE_FORMAT = b"forge-aot runtime bundle 4\n"
BUNDLE_WANTED = False
"""Whether this process found no valid bundle (in a wheel): the first call then writes one."""
_FINGERPRINT: str | None = None
"""The build's sha256 of these modules' sources (``use_bundle``): a bundle of other sources is never used."""
FIRST_CALL = ("exports", "entry", "packing", "rules", "drivers", "fastpath", "cuda", "cold_launch", "cold",
              "host_exec", "cold_binding")
"""A full-runtime first call's modules where its kernels are plain (``cold``), in the order they import each other:
run at import from the bundle where the full runtime serves from import on (``run_first_call``). The others load
from the bundle on first need, as all do after a lean package's hand-over."""
_IN_A_WHEEL = __name__.endswith("._runtime")  # (the source tree's copy, imported by the build tools, bundles nothing)
_HERE = os.path.dirname(__file__)


def __getattr__(name: str) -> Any:
    from .names import attribute

    return attribute(name)


def __dir__() -> list[str]:
    from .names import listing

    return listing()


def source(name: str) -> str:
    """The file of runtime module ``name``."""
    return os.path.join(_HERE, f"{name}.py")


def bundle_path() -> str | None:
    """Where ``_bundle.py``'s cached bytecode would be (see that module), or None where nothing is cached."""
    from importlib.util import cache_from_source

    try:
        return cache_from_source(source("_bundle"))
    except NotImplementedError:  # sys.implementation.cache_tag is None
        return None


def use_bundle(fingerprint: str) -> None:
    """Called first by the package's ``__init__`` with the build's fingerprint of these sources: run LEAN's modules
    from the bundle and serve the others from it where it is valid (``_Finder``), else note that the first call
    should write it."""
    global _FINGERPRINT, BUNDLE_WANTED
    if not _IN_A_WHEEL or _FINGERPRINT is not None:
        return
    _FINGERPRINT = fingerprint
    path = bundle_path()
    rest = None if path is None else _read_bundle(path, fingerprint)
    if rest is None:
        BUNDLE_WANTED = path is not None
        return
    sys.meta_path.insert(0, _Finder(rest))


def _read_bundle(path: str, fingerprint: str) -> dict[str, tuple[int, int, Any]] | None:
    """Run LEAN's modules from the bundle and return the others' (name -> (mtime_ns, size, marshalled code)), or
    None where the file is missing, damaged, of another interpreter or other sources, or LEAN's files changed."""
    from importlib.util import MAGIC_NUMBER

    try:
        with open(path, "rb") as f:
            data = _map(f)
        head = len(BUNDLE_FORMAT) + len(MAGIC_NUMBER)
        if data[:head] != BUNDLE_FORMAT + MAGIC_NUMBER:
            return None
        size = int.from_bytes(data[head:head + 4], "little")
        written_for, table = marshal.loads(data[head + 4:head + 4 + size])
        if written_for != fingerprint:
            return None
        blob = memoryview(data)[head + 4 + size:]
        held = {}
        for name, mtime_ns, st_size, offset, length in table:
            if offset + length > len(blob):
                return None
            held[name] = (mtime_ns, st_size, blob[offset:offset + length])
        lean = [held.pop(name) for name in LEAN]
        for name, (mtime_ns, st_size, _) in zip(LEAN, lean):
            st = os.stat(source(name))
            if (st.st_mtime_ns, st.st_size) != (mtime_ns, st_size):
                return None
        codes = [marshal.loads(code) for _, _, code in lean]
    except Exception:  # unreadable or damaged: imports stay the import system's own
        return None
    import _imp
    from importlib.util import spec_from_file_location

    for name, code in zip(LEAN, codes):
        spec = spec_from_file_location(f"{__name__}.{name}", source(name))
        spec.loader_state = "bundle"  # (how a module tells its code came from the bundle)
        _imp._fix_co_filename(code, spec.origin)
        _execute(name, spec, lambda module, code=code: exec(code, module.__dict__))
    return held


def run_first_call() -> None:
    """Run FIRST_CALL's bundled modules now (see ``_execute``), where the full runtime serves from import on
    (``lean.load_package``)."""
    finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
    for name in FIRST_CALL if finder is not None else ():
        found = None if f"{__name__}.{name}" in sys.modules else finder.spec(name)
        if found is not None:  # (else imported already, by a module before, or not in the bundle)
            _execute(name, found, found.loader.exec_module)


def _execute(name: str, spec: Any, run: Any) -> None:
    """Run a bundled module now (``run(module)``), as the import system would (its spec, loader and attributes; in
    sys.modules and on the package), without its finders and locks: only while ``import <package>`` holds the
    package's import lock, so no other thread imports from it. A module that fails is left to the import system,
    whose import then raises as it would."""
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        run(module)
    except Exception:
        sys.modules.pop(spec.name, None)
        return
    setattr(sys.modules[__name__], name, module)


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


class _Finder:
    """Finds the bundle's other modules, before the path finders (``spec``: their files are checked once, all
    together, when the first of them is imported). It stays in sys.meta_path, answering None to every
    other name (removing it could make another thread's import skip a finder)."""

    def __init__(self, held: dict[str, tuple[int, int, Any]]) -> None:
        self.prefix, self.held, self.checked = f"{__name__}.", held, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix) or fullname[len(self.prefix):] not in self.held:
            return None
        return self.spec(fullname[len(self.prefix):])

    def spec(self, name: str) -> Any:
        """The spec of bundled module ``name``, or None (the import system then finds its file): on the first ask,
        every held module's file is checked against the size and modification time the bundle recorded; where any
        changed, none is served and the bundle is written again now (``first_call_done``), whichever path found it."""
        from importlib.machinery import ModuleSpec

        global BUNDLE_WANTED
        held = self.held
        if not self.checked:
            try:  # (over a copy: another thread's import may take its module from ``held`` meanwhile)
                fresh = all((st.st_mtime_ns, st.st_size) == (mtime_ns, size) for st, (mtime_ns, size, _) in
                            ((os.stat(source(n)), entry) for n, entry in list(held.items())))
            except OSError:
                fresh = False
            self.checked = True
            if not fresh:
                held.clear()
                BUNDLE_WANTED = True
                first_call_done()  # (its import of ``bundling`` finds nothing held here)
        entry = held.pop(name, None)  # taken once: the bundle's memory goes as the modules load
        if entry is None:
            return None
        fullname = f"{__name__}.{name}"
        origin = source(name)
        spec = ModuleSpec(fullname, _loader()(fullname, origin, entry[2]), origin=origin, loader_state="bundle")
        spec.has_location = True  # __file__ and __cached__ as for the module's own file
        return spec


_LOADER: list[type] = []


def _loader() -> type:
    """``_BundleLoader``: the import system's own loader for a module's file, with the module's code taken from the
    bundle (its file name fixed in it, as the import system does); its own way where the bundle's bytes do not load.
    Made on first use: a process served lean alone never loads a module through it."""
    if not _LOADER:
        from importlib.machinery import SourceFileLoader

        class _BundleLoader(SourceFileLoader):
            def __init__(self, fullname: str, path: str, code: Any) -> None:
                super().__init__(fullname, path)
                self.code = code

            def get_code(self, fullname: str) -> Any:
                data, self.code = self.code, None
                if data is not None:
                    import _imp

                    try:
                        code = marshal.loads(data)
                    except (ValueError, EOFError, TypeError):
                        code = None
                    if code is not None:
                        _imp._fix_co_filename(code, self.path)
                        return code
                return super().get_code(fullname)

        _LOADER.append(_BundleLoader)
    return _LOADER[0]


def first_call_done() -> None:
    """After an op's first call (or a lean package's hand-over), where there was no valid bundle: write it, unless
    Python was asked not to write bytecode (PYTHONDONTWRITEBYTECODE; ``write_bundle()`` then writes it on request)."""
    global BUNDLE_WANTED
    if BUNDLE_WANTED:
        BUNDLE_WANTED = False  # one try per process
        if not sys.dont_write_bytecode:
            write_bundle()


def write_bundle() -> bool:
    """Write the bundle now (for example while baking an image with PYTHONDONTWRITEBYTECODE set): the modules in
    ``bundling.BUNDLED`` compiled from their sources. Never raises. Returns whether it wrote (False at once where
    the bytecode directory is not writable)."""
    path = bundle_path()
    if path is None or _FINGERPRINT is None:
        return False
    try:
        from .bundling import write
    except Exception:  # imports stay the import system's own
        return False
    return write(path, _FINGERPRINT)

