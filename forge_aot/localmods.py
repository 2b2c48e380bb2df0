"""The project's own modules that kernel files import (helpers shared between kernel files), found and shipped.

Libraries keep host helpers in a module of their own (Liger-Kernel's ``ops/utils.py`` holds ``calculate_settings``
and ``ensure_contiguous``): a kernel file says ``from kernels.utils import calculate_settings`` (the project root
importable) or, script-style, ``from utils import calculate_settings`` (its own directory importable). The build
imports kernel files with both directories on ``sys.path``, after everything else (``introspect.make_importable``:
a project file named like a standard or installed module never shadows it); this module finds,
from the source alone, which imported modules are files of the project, transitively, so the wheel ships them
(host code only, like the kernel files) and the runtime resolves those imports to the shipped copies.

A module is local when its file lies under the project root and outside every ``site-packages`` or
``dist-packages`` directory (a virtual environment inside the project is not the project's code). Imports inside
functions count too; ``importlib.import_module(...)`` calls are not seen.
"""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import SourceError


@dataclass(frozen=True)
class LocalModule:
    """One shipped local module."""

    name: str
    """The dotted name the host code imports it by (``kernels.utils``, ``utils``)."""
    path: Path
    """Its file (``__init__.py`` for a package)."""
    package: bool
    """Whether it is a package (regular, with ``__init__.py``, or namespace: then ``path`` is the directory)."""
    used: frozenset[str] | None = None
    """The names host code takes from it (``from m import a, b``); None where some import takes the whole module
    (``import m``, ``from m import *``, a submodule's parent): then every definition must be host code."""


def _is_local(path: Path, root: Path) -> bool:
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return not any(part in ("site-packages", "dist-packages") for part in rel.parts)


def _external(top: str, search: list[Path]) -> bool:
    """Whether a top-level name is importable without the project's directories (built in, the standard library,
    installed): the build puts those directories last on ``sys.path``, so such a name is never the project's."""
    if top in sys.builtin_module_names:
        return True
    from .introspect import PROJECT_DIRS

    ours = {str(p) for p in search} | PROJECT_DIRS
    path = [p for p in sys.path if p and str(Path(p).resolve()) not in ours]
    try:
        return importlib.machinery.PathFinder.find_spec(top, path) is not None
    except (ImportError, ValueError):
        return False


def _find(name: str, search: list[Path], root: Path, external: dict[str, bool]) -> list[LocalModule] | None:
    """The module ``name`` and its parent packages, looked up the way the import system does in ``search``
    (first hit of the top-level name wins); None where it is not the project's (installed, built in, absent).
    ``external``: ``_external``'s answers so far (every file imports torch: its search runs once)."""
    parts = name.split(".")
    if parts[0] not in external:
        external[parts[0]] = _external(parts[0], search)
    if external[parts[0]]:
        return None
    for base in search:
        found: list[LocalModule] = []
        directory = base
        for i, part in enumerate(parts):
            dotted = ".".join(parts[:i + 1])
            pkg_dir = directory / part
            if (pkg_dir / "__init__.py").is_file():
                found.append(LocalModule(dotted, pkg_dir / "__init__.py", True))
                directory = pkg_dir
            elif (directory / f"{part}.py").is_file():
                found.append(LocalModule(dotted, directory / f"{part}.py", False))
                break
            elif pkg_dir.is_dir() and i < len(parts) - 1:
                found.append(LocalModule(dotted, pkg_dir, True))  # a namespace package
                directory = pkg_dir
            else:
                break
        if not found:
            continue  # not in this directory: the next one on the path
        if not found[-1].path.is_file():
            return None  # only directories: no module of the project (e.g. ``from build import x``, a build folder)
        if not _is_local(found[0].path, root):
            return None
        return found
    return None


def _imported_names(tree: ast.AST, module: LocalModule | None,
                    host: bool = False) -> list[tuple[str, frozenset[str] | None]]:
    """Every module name a file imports with the names it takes from it (None: the whole module), relative imports
    resolved against ``module``'s package; ``host``: only what its shipped host code imports (what the module's
    own kernels alone take is left out there)."""
    from .sourcesplit import kernel_only_imports

    out: list[tuple[str, frozenset[str] | None]] = []
    kept = kernel_only_imports(tree) if host and isinstance(tree, ast.Module) else {}
    # What a module (not a package's __init__, whose imports are what it exports) takes and never uses is imported,
    # not used: its module still runs, but a definition there that needs Triton is the wheel's stand-in, no error.
    referenced = referenced_names(tree) if host and not (module is not None and module.package) else None
    for node in ast.walk(tree):
        aliases = kept.get(node, getattr(node, "names", ()))  # type: ignore[call-overload]
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in aliases]
        elif isinstance(node, ast.ImportFrom) and aliases:
            target = import_from_target(node, module)
            if target:
                names = [a.name for a in aliases]
                out.append((target, None if "*" in names else frozenset(
                    n for n, a in zip(names, aliases) if referenced is None or (a.asname or n) in referenced)))
                # submodules, if files: whole where read (``perf_model.estimate(...)``), else imported only
                out += [(f"{target}.{n}", None if referenced is None or (a.asname or n) in referenced else frozenset())
                        for n, a in zip(names, aliases) if n != "*"]
    return out


def referenced_names(tree: ast.AST) -> set[str]:
    """The names a module's code reads (its imports aside), and those its ``__all__`` lists: what it uses of
    what it imports (bitsandbytes' int8 matmul imports ``estimate_matmul_time`` from its Triton performance model for
    a ``prune_configs_by`` it left commented out)."""
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and any(
                isinstance(t, ast.Name) and t.id == "__all__"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            names |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def import_from_target(node: ast.ImportFrom, module: LocalModule | None) -> str | None:
    """The module ``from ... import`` names, relative imports resolved against ``module``'s package; None for a
    relative import with no package to be relative to (a kernel file run as a script) or beyond its top."""
    if not node.level:
        return node.module or None
    if module is None:
        return None
    package = module.name.split(".") if module.package else module.name.split(".")[:-1]
    if node.level - 1 > len(package) or (node.level - 1 == len(package) and not node.module):
        return None
    return ".".join(package[:len(package) - (node.level - 1)] + ([node.module] if node.module else []))


def file_module(path: Path) -> LocalModule | None:
    """A file as the module its package makes it (``pkg.ops.cross_entropy``), None outside any package."""
    package = package_of(path)
    return LocalModule(f"{package[0]}.{path.stem}", path, False) if package else None


def package_of(path: Path) -> tuple[str, Path] | None:
    """The package a kernel file lies in (its directory and each parent holding an ``__init__.py``: ``unsloth.kernels``
    for ``unsloth/kernels/rms_layernorm.py``) and the directory holding the topmost one; None outside any package.
    The build runs such a file with that ``__package__``, so its relative imports (``from .utils import ...``) work as
    when the library imports it."""
    parts: list[str] = []
    directory = path.parent.resolve()
    while (directory / "__init__.py").is_file() and directory.name.isidentifier():
        parts.append(directory.name)
        directory = directory.parent
    return (".".join(reversed(parts)), directory) if parts else None


def direct_imports(path: Path, text: str) -> set[str]:
    """The module names a kernel file's code ``text`` imports itself (not through other modules), relative imports
    resolved against its package; with the submodule each ``from m import x`` may mean."""
    return {name for name, _ in _imported_names(ast.parse(text, filename=str(path)), file_module(path))}


def local_imports(path: Path, root: Path, text: str | None = None) -> dict[str, LocalModule]:
    """The project modules a kernel file imports, transitively, by dotted name (parent packages included).

    Searched as the build imports it: the file's directory first, then the directory holding its package (where it
    lies in one), then the project root. A kernel file in a package resolves its relative imports against it; the
    kernel file itself counts where one of its modules imports it (a package ``__init__`` re-exporting its ops).
    ``text``: the kernel file's code to start from instead of the file (what the wheel ships of it, without the
    build-only functions, whose imports the package never runs); the modules it reaches are then read as their
    shipped host code would import too, without what only their own kernels take (FLA's ``fla/ops/utils/index.py``
    spreads ``autotune_cache_kwargs`` into its kernels' autotuners: ``fla.utils``'s name, never the host code's)."""
    package = package_of(path)
    search = [path.parent.resolve(), *([package[1]] if package else []), root.resolve()]
    found: dict[str, LocalModule] = {}
    used: dict[str, set[str] | None] = {}
    external: dict[str, bool] = {}
    todo: list[tuple[Path, LocalModule | None]] = [(path, file_module(path))]
    seen: set[Path] = set()
    while todo:
        file, module = todo.pop()
        if file in seen or file.is_dir():
            continue
        seen.add(file)
        try:
            code = text if text is not None and file == path else file.read_text(encoding="utf-8")
            tree = ast.parse(code, filename=str(file))
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            raise SourceError(f"{file}: cannot parse: {exc}") from None
        for name, names in _imported_names(tree, module, host=text is not None):
            chain = _find(name, search, root, external) or []
            for m in chain:
                if m.name not in found:
                    found[m.name] = m
                    used[m.name] = set()
                    todo.append((m.path, m))
            if not chain or chain[-1].name != name:
                continue  # ``from m import x`` also tries ``m.x`` as a module: here x is a name of m
            for m in chain[:-1]:
                used[m.name] = None  # a parent package's __init__ runs whole
            taken = used[name]
            used[name] = None if names is None or taken is None else taken | names
    return {n: replace(m, used=None if used[n] is None else frozenset(used[n])) for n, m in found.items()}


def merge_local(modules: dict[str, dict[str, LocalModule]]) -> dict[str, LocalModule]:
    """The project modules of several kernel files as one package ships them; the same dotted name from two
    different files (``utils.py`` beside two kernel files in different directories) cannot be."""
    out: dict[str, LocalModule] = {}
    for importer, found in sorted(modules.items()):
        for name, m in found.items():
            prev = out.get(name)
            if prev is None:
                out[name] = m
            elif prev.path.resolve() != m.path.resolve():
                raise SourceError(f"{importer}: imports '{name}' from {m.path}, while another kernel file imports "
                                  f"'{name}' from {prev.path}; one package cannot ship both under one name "
                                  "(rename one, or import it by a package path)")
            elif prev.used is not None:
                out[name] = replace(prev, used=None if m.used is None else prev.used | m.used)
    return out


__all__ = ["LocalModule", "direct_imports", "local_imports", "merge_local", "package_of"]
