"""Packages the wheel's host code imports that its metadata does not declare.

The wheel ships host code as the project wrote it (less its Triton lines): what it imports from outside the
project and the standard library must be installed where the wheel runs. pip installs only what the wheel's
``Requires-Dist`` names (``project.dependencies``, ``["torch"]`` by default), so flash-linear-attention's
``import einops`` failed on first use in a clean image. The build cannot write the requirement itself (which
version, which distribution provides the name), so it says what is missing, where, and what to write.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import BuildPlan

PROVIDED = frozenset({"__future__", "torch", "triton"})
"""Imports every wheel satisfies: torch is a requirement, and the runtime stands in for triton."""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a PEP 508 requirement names (``einops>=0.6; python_version>'3.8'`` → ``einops``)."""
    return canonical(re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0])


def imported_tops(text: str) -> Iterator[tuple[str, int, str | None]]:
    """The top-level names absolute imports in ``text`` bring in, with their lines and the test of the innermost
    ``if`` they are under (SGLang's ``if envs.SGLANG_CUDA_COREDUMP.get(): import sglang...``), or None; not those
    under a ``try`` that catches the ImportError (an optional dependency the code does without)."""
    tree = ast.parse(text)
    optional: set[int] = set()
    condition: dict[int, str] = {}
    for node in ast.walk(tree):  # (outer ifs first: an inner one overwrites what it holds)
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            condition.update({id(n): test for stmt in node.body for n in ast.walk(stmt)})
            condition.update({id(n): f"not ({test})" for stmt in node.orelse for n in ast.walk(stmt)})
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.partition(".")[0], node.lineno, condition.get(id(node))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module.partition(".")[0], node.lineno, condition.get(id(node))


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError", "Exception",
                                                    "BaseException") for n in names)


def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return dict(metadata.packages_distributions())


def undeclared_imports(plan: BuildPlan) -> list[str]:
    """One line per top-level module the shipped host code imports that neither the standard library, the project,
    the runtime nor a declared dependency provides, naming the distribution that provides it here (where one
    does) and the first place that imports it."""
    declared = {requirement_name(d) for d in plan.loaded.manifest.project.dependencies}
    root = plan.loaded.root.resolve()
    project_tops = {name.partition(".")[0] for mod in plan.modules.values()
                    for name in [*mod.get("local_sources", {}), *mod.get("imported_as", ())]}
    texts: list[tuple[str, str, Path]] = []
    for mod in plan.modules.values():
        path = Path(mod["path"]).resolve()
        texts.append((_shown(path, root), mod["host_source"], path.parent))
        texts += [(name, text, path.parent) for name, (text, _) in mod.get("local_sources", {}).items() if text]
    providers = _distributions()
    missing: dict[str, tuple[str, str | None]] = {}  # top -> where, and its condition (None: one import has none)
    for where, text, folder in texts:
        for top, line, test in imported_tops(text):
            if (top in missing and missing[top][1] is None) or top in PROVIDED or top in project_tops \
                    or top in sys.stdlib_module_names:
                continue
            if any((d / top).is_dir() or (d / f"{top}.py").is_file() for d in (folder, root)):
                continue  # the project's own (a sibling the file imports by its plain name)
            dists = providers.get(top, [])
            if canonical(top) in declared or any(canonical(d) in declared for d in dists):
                continue  # (a name not installed here counts as its own distribution's)
            given = f"distribution {dists[0]}" if dists else "not installed here"
            if top not in missing or test is None:  # an unconditional import says more than a conditional one
                missing[top] = (f"{top} ({given}), imported at {where}:{line}", test)
    return [f"the packaged host code imports {what}"
            + (f" only where `{test}` holds" if test is not None else "")
            + ", which the wheel does not require: pip will not install it with the wheel; "
            + ("where that holds, " if test is not None else "")
            + "add it to [project] dependencies in the manifest (torch is there by default)"
            for what, test in missing.values()]


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
