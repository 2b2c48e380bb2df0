"""Binding every host module at once, beside the project's own modules: the build's tracing, tuning and
development mode of forge-aot, and tests. A generated package binds one host module at a time, on first use
(``entry.Package.module``), and never loads this module."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .entry import export
from .host_modules import bind_module, op_table
from .kernel import Kernel


def imports_first(modules: Mapping[str, Any]) -> list[str]:
    """An index's host modules (``modules``) in the order to bind them all: each after the host modules its own code
    imports by project name (``imports_host``), as Python would have imported those first; otherwise by name."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(mod: str) -> None:
        if mod not in seen:
            seen.add(mod)
            for dep in modules[mod].get("imports_host", ()):
                if dep in modules:
                    visit(dep)
            order.append(mod)

    for mod in sorted(modules):
        visit(mod)
    return order


def bind_ops(package: str, index: dict[str, Any], backend: Any, sources: dict[str, tuple[str, str | None]],
             kernel_class: type = Kernel) -> dict[str, Callable[..., Any]]:
    """Run every host module with its kernel handles; returns the exported ops (and ``[exports]``) by name.

    ``sources`` maps each host module to (filename, source or None to read the file).
    """
    ops: dict[str, Callable[..., Any]] = {}
    with project_names_bound() as aliases:
        for mod_name in imports_first(index["modules"]):
            mod = index["modules"][mod_name]
            module = bind_module(f"{package}._ops.{mod_name}", index, mod_name, backend, kernel_class,
                                 sources[mod_name], aliases=aliases(mod))
            for op in (*mod["ops"], *mod.get("exports", ())):
                ops[op] = getattr(module, op)
    return ops


@contextlib.contextmanager
def project_names_bound() -> Iterator[Callable[[Mapping[str, Any]], tuple[str, ...]]]:
    """Where host modules are bound beside the project's own modules (the build's tracing, tuning and development
    mode): while binding, a kernel file that another imports by its project name (``imported_as``) is the bound
    host module under that name too, so its import reaches the bound kernel handles as in the wheel; the
    project's modules are back in ``sys.modules`` afterwards, and those of its packages first imported meanwhile
    are gone (a helper that imported a bound module would keep it: the next import runs it afresh). Yields
    ``aliases(module index entry)``, which imports each name's parent package first, as Python does."""
    saved: dict[str, Any] = {}
    before = set(sys.modules)
    bound: list[str] = []

    def aliases(spec: Mapping[str, Any]) -> tuple[str, ...]:
        # The packages above the files bound so far import afresh, reaching them: a package __init__ re-exporting
        # a kernel file's op (FLA's ``from fla.ops.utils import chunk_local_cumsum``) had kept the unbound one.
        for parent in {n.rpartition(".")[0] for n in bound} - {""}:
            saved.setdefault(parent, sys.modules.pop(parent, None))
        bound.clear()
        names = tuple(spec.get("imported_as", ()))
        for name in names:
            if "." in name:
                importlib.import_module(name.rpartition(".")[0])
            saved.setdefault(name, sys.modules.get(name))
        bound.extend(names)
        return names

    try:
        yield aliases
    finally:
        tops = {name.partition(".")[0] for name in saved}
        for name in [n for n in sys.modules if n not in before and n.partition(".")[0] in tops]:
            del sys.modules[name]
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def register_torch_ops(package: str, index: dict[str, Any],
                       ops: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Register every op of bound host modules that has a schema as ``torch.ops.<package>.<op>`` (see
    custom_ops.register_custom_ops, with the op's autograd where the index has it) and return the exported
    callables (development mode and tests; a generated package registers through ``entry.load_package``)."""
    table = {op: spec for op, spec in op_table(index["modules"]).items() if op in ops}

    def host_attr(op: str, name: str) -> Callable[..., Any]:
        return sys.modules[f"{package}._ops.{table[op][0]}"].__dict__[name]

    from .custom_ops import register_custom_ops
    from .torch_ops import route_in_module

    custom = register_custom_ops(package, table, ops.__getitem__, host_attr)
    if any(len(spec) > 2 and spec[2] for spec in table.values()):
        for mod_name in sorted({spec[0] for spec in table.values()}):
            route_in_module(sys.modules[f"{package}._ops.{mod_name}"], package, {op: op in custom for op in table},
                            table)
    return {op: export(ops.__getitem__, package, op, True, table[op]) if op in custom else fn
            for op, fn in ops.items()}
