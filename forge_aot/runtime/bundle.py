"""The runtime's bytecode bundle: reading it and serving the runtime's modules from it (``bundling`` writes it).

In a wheel, the runtime's modules load from one file, their bytecode gathered into ``_bundle.py``'s cache name
(``__pycache__/_bundle.<cache tag>.pyc``) after the first call that loads the full runtime where Python writes
bytecode, or by ``write_bundle()``, less the docstrings and annotations nothing reads at run time (see ``bundling``).
It is used while it was written for these sources (the build's fingerprint, which the package's ``__init__`` hands
to ``lean.load_package``) and each module's file keeps the size and modification time it had then, checked together
when the first of them is imported: one file read instead of a dozen trips through the import system's finders and
bytecode caches. Where there is no valid bundle, imports are the import system's own.

Read only when the full runtime is first needed (``use_bundle``: at import for a package that routes ops, at the
hand-over for a lean one). The lean path (``lean``, ``lean_kernel``, ``lean_launch``, ``basics``) loads through the
import system: reading the bundle at import, from the runtime package's ``__init__``, cost a fresh process more than it
saved (session 61, locally: 5.2 - 5.6 ms to import and call an op with a 290-line ``__init__`` that read the bundle and
ran the lean modules from it, 5.0 with a ten-line ``__init__`` and no bundle).
"""

from __future__ import annotations

import marshal
import os
import sys
from typing import Any

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
_PACKAGE = __name__.rpartition(".")[0]
_IN_A_WHEEL = _PACKAGE.endswith("._runtime")  # (the source tree's copy, imported by the build tools, bundles nothing)
_HERE = os.path.dirname(__file__)


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
    """Called when the full runtime is first needed, with the build's fingerprint of these sources (the package's
    ``__init__`` hands it to ``lean.load_package``): serve the runtime's modules from the bundle where it is valid
    (``_Finder``), else note that the full runtime's first call should write it. Once per process."""
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
    """The bundled modules' (name -> (mtime_ns, size, marshalled code)), or None where the file is missing, damaged,
    of another interpreter or other sources."""
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
    except Exception:  # unreadable or damaged: imports stay the import system's own
        return None
    return held


def run_first_call() -> None:
    """Run FIRST_CALL's bundled modules now (see ``_execute``), where the full runtime serves from import on
    (``lean.load_package``)."""
    finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
    for name in FIRST_CALL if finder is not None else ():
        found = None if f"{_PACKAGE}.{name}" in sys.modules else finder.spec(name)
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
    setattr(sys.modules[_PACKAGE], name, module)


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
        self.prefix, self.held, self.checked = f"{_PACKAGE}.", held, False

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
        fullname = f"{_PACKAGE}.{name}"
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
    path, fingerprint = bundle_path(), _FINGERPRINT or getattr(sys.modules.get(f"{_PACKAGE}.lean"), "FINGERPRINT", None)
    if path is None or fingerprint is None or not _IN_A_WHEEL:
        return False
    try:
        from .bundling import write
    except Exception:  # imports stay the import system's own
        return False
    return write(path, fingerprint)

