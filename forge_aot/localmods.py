"""The project's own modules that kernel files import (helpers shared between kernel files), found and shipped.

Libraries keep host helpers in a module of their own (Liger-Kernel's ``ops/utils.py`` holds ``calculate_settings``
and ``ensure_contiguous``): a kernel file says ``from kernels.utils import calculate_settings`` (the project root
importable) or, script-style, ``from utils import calculate_settings`` (its own directory importable). The build
imports kernel files with both directories on ``sys.path`` (see ``introspect.importable_root``); this module finds,
from the source alone, which imported modules are files of the project, transitively, so the wheel ships them
(host code only, like the kernel files) and the runtime resolves those imports to the shipped copies.

A module is local when its file lies under the project root and outside every ``site-packages`` or
``dist-packages`` directory (a virtual environment inside the project is not the project's code). Imports inside
functions count too; ``importlib.import_module(...)`` calls are not seen.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
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


def _is_local(path: Path, root: Path) -> bool:
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return not any(part in ("site-packages", "dist-packages") for part in rel.parts)


def _find(name: str, search: list[Path], root: Path) -> list[LocalModule] | None:
    """The module ``name`` and its parent packages, looked up the way the import system does in ``search``
    (first hit of the top-level name wins); None where it is not the project's (installed, built in, absent)."""
    parts = name.split(".")
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


def _imported_names(tree: ast.AST, module: LocalModule | None) -> list[str]:
    """Every module name a file imports, relative imports resolved against ``module``'s package."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if module is None:
                    continue  # a kernel file runs as a script: it has no package to be relative to
                package = module.name.split(".") if module.package else module.name.split(".")[:-1]
                if node.level - 1 > len(package) or (node.level - 1 == len(package) and not node.module):
                    continue
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target:
                out.append(target)
                out += [f"{target}.{a.name}" for a in node.names if a.name != "*"]  # submodules, if files
    return out


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


def local_imports(path: Path, root: Path) -> dict[str, LocalModule]:
    """The project modules a kernel file imports, transitively, by dotted name (parent packages included).

    Searched as the build imports it: the file's directory first, then the directory holding its package (where it
    lies in one), then the project root. A kernel file in a package resolves its relative imports against it; the
    kernel file itself counts where one of its modules imports it (a package ``__init__`` re-exporting its ops)."""
    package = package_of(path)
    search = [path.parent.resolve(), *([package[1]] if package else []), root.resolve()]
    found: dict[str, LocalModule] = {}
    own = LocalModule(f"{package[0]}.{path.stem}", path, False) if package else None
    todo: list[tuple[Path, LocalModule | None]] = [(path, own)]
    seen: set[Path] = set()
    while todo:
        file, module = todo.pop()
        if file in seen or file.is_dir():
            continue
        seen.add(file)
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            raise SourceError(f"{file}: cannot parse: {exc}") from None
        for name in _imported_names(tree, module):
            for m in _find(name, search, root) or []:
                if m.name not in found:
                    found[m.name] = m
                    todo.append((m.path, m))
    return found


__all__ = ["LocalModule", "local_imports"]
