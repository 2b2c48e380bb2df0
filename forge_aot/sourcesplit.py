"""Split a kernel source file into its ``@triton.jit`` kernels and its host code.

The host code is the file with every Triton-only statement blanked out, line for line, so tracebacks from
the packaged ops point at the author's own line numbers. In it the name ``triton`` offers ``cdiv`` and
``next_power_of_2`` only, and each kernel name is bound to a forge-aot handle before the first line runs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SourceError
from .templates._forge_runtime import _HostTriton

_CONSTEXPR_ANNOTATIONS = {"constexpr", "tl.constexpr", "triton.language.constexpr", "language.constexpr"}


@dataclass(frozen=True)
class KernelParam:
    name: str
    constexpr: bool
    default: Any = None
    has_default: bool = False


@dataclass(frozen=True)
class SourceFile:
    """A kernel file, parsed."""

    path: Path
    kernels: dict[str, list[KernelParam]]
    """``@triton.jit`` functions by name, with their parameters in order."""
    host_source: str
    """The file with Triton-only statements blanked (same number of lines)."""
    host_functions: frozenset[str]
    """Functions and classes defined by the host code."""
    kernel_refs: dict[str, frozenset[str]]
    """For each host function: the kernels it names."""


def _is_triton_import(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return all(a.name == "triton" or a.name.startswith("triton.") for a in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        return stmt.module is not None and (stmt.module == "triton" or stmt.module.startswith("triton."))
    return False


def _triton_names(tree: ast.Module) -> set[str]:
    """Names a file binds to Triton modules or objects (``triton``, ``tl``, ``jit``…)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.name == "triton" or a.name.startswith("triton."):
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(stmt, ast.ImportFrom) and _is_triton_import(stmt):
            names.update(a.asname or a.name for a in stmt.names)
    return names


def _is_jit(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        text = ast.unparse(target)
        if text in ("triton.jit", "jit"):
            return True
        if text in ("triton.autotune", "autotune", "triton.heuristics", "heuristics"):
            raise SourceError(f"line {fn.lineno}: {fn.name} uses @{text}; forge-aot tunes from the manifest, "
                              "so keep only @triton.jit on kernels")
    return False


def _params(fn: ast.FunctionDef) -> list[KernelParam]:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[Any] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = []
    for a, d in zip([*positional, *args.kwonlyargs], [*defaults, *args.kw_defaults], strict=True):
        annotation = ast.unparse(a.annotation) if a.annotation is not None else ""
        has_default = d is not None
        value = None
        if has_default:
            try:
                value = ast.literal_eval(d)
            except ValueError:
                has_default = False
        out.append(KernelParam(a.arg, annotation in _CONSTEXPR_ANNOTATIONS, value, has_default))
    return out


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno, *(d.lineno for d in decorators)])


def parse_source(path: Path) -> SourceFile:
    """Parse a kernel file and check that its host code needs nothing from Triton but the host helpers."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: cannot parse: {exc}") from None
    triton_names = _triton_names(tree)
    kernels: dict[str, list[KernelParam]] = {}
    kernel_only: list[ast.stmt] = []
    kernel_only_names: dict[str, int] = {}
    host: list[ast.stmt] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and _is_jit(stmt):
            kernels[stmt.name] = _params(stmt)
            kernel_only.append(stmt)
        elif _is_triton_import(stmt):
            kernel_only.append(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _names_in(stmt) & (triton_names - {"triton"}):
            # e.g. ``DTYPE: tl.constexpr = tl.float16``: a kernel-side constant.
            kernel_only.append(stmt)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                for n in _names_in(t):
                    kernel_only_names[n] = stmt.lineno
        else:
            host.append(stmt)
    if not kernels:
        raise SourceError(f"{path}: no @triton.jit function found")
    allowed_triton = set(_HostTriton.HOST_HELPERS)
    host_defs: set[str] = set()
    kernel_refs: dict[str, frozenset[str]] = {}
    for stmt in host:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and _is_triton_import(node):
                raise SourceError(f"{path}:{node.lineno}: host code imports Triton; packaged ops run without "
                                  "it (use triton.cdiv / triton.next_power_of_2 from the module scope)")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "triton" and node.attr not in allowed_triton:
                raise SourceError(f"{path}:{node.lineno}: host code uses triton.{node.attr}; packaged ops may "
                                  f"use only {', '.join('triton.' + h for h in sorted(allowed_triton))}")
            if isinstance(node, ast.Name) and node.id in triton_names - {"triton"}:
                raise SourceError(f"{path}:{node.lineno}: host code uses '{node.id}', which is Triton; packaged "
                                  "ops run without Triton")
            if isinstance(node, ast.Name) and node.id in kernel_only_names:
                raise SourceError(f"{path}:{node.lineno}: host code uses '{node.id}', defined with Triton on "
                                  f"line {kernel_only_names[node.id]}")
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            host_defs.add(stmt.name)
            kernel_refs[stmt.name] = frozenset(_names_in(stmt) & set(kernels))
    lines = text.splitlines(keepends=True)
    for stmt in kernel_only:
        for i in range(_first_line(stmt) - 1, stmt.end_lineno or stmt.lineno):
            lines[i] = "\n"
    return SourceFile(path=path, kernels=kernels, host_source="".join(lines),
                      host_functions=frozenset(host_defs), kernel_refs=kernel_refs)
