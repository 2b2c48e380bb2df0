"""Binding every host module at once, beside the project's own modules: the build's tracing, tuning and
development mode of forge-aot, and tests. A generated package binds one host module at a time, on first use
(``entry.Package.module``), and never loads this module."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .exports import export
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
    def bind(mod_name: str, names: tuple[str, ...]) -> Any:
        return bind_module(f"{package}._ops.{mod_name}", index, mod_name, backend, kernel_class, sources[mod_name],
                           aliases=names)

    ops: dict[str, Callable[..., Any]] = {}
    with project_names_bound(index["modules"], bind) as bound:
        for mod_name in imports_first(index["modules"]):
            module = bound(mod_name)
            export_as = index["modules"][mod_name].get("export_as", {})
            for op in (*index["modules"][mod_name]["ops"], *index["modules"][mod_name].get("exports", ())):
                ops[export_as.get(op, op)] = getattr(module, op)
    return ops


class _BindingFinder:
    """While ``project_names_bound`` binds: an import of a kernel file by its project name (``imported_as``) binds
    that host module there and then, as ``entry._HostModuleFinder`` does in a wheel (a package ``__init__`` importing
    its kernel files ran the project's file itself, then the binding ran it again: a ``Library.define`` twice)."""

    def __init__(self, names: dict[str, str], bound: Callable[[str], Any]) -> None:
        self.names, self.bound = names, bound
        self.specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        module = self.bound(self.names[spec.name])
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:  # the host file's own spec, not the alias's
        module.__spec__ = self.specs.pop(module.__spec__.name, module.__spec__)


@contextlib.contextmanager
def project_names_bound(modules: Mapping[str, Mapping[str, Any]], bind: Callable[[str, tuple[str, ...]], Any],
                        ) -> Iterator[Callable[[str], Any]]:
    """Where host modules (``modules``: an index's entries) are bound beside the project's own modules (the build's
    tracing, tuning and development mode): a kernel file that project code imports by its project name
    (``imported_as``) is the bound host module under that name, so its import reaches the bound kernel handles as in
    the wheel, and its module-level code runs once (``bind(mod, names)`` binds it, the first time it is needed). The
    project's modules are back in ``sys.modules`` afterwards, and those of its packages first imported meanwhile are
    gone. Yields ``bound(mod)``: the bound host module, each name's parent package imported first, as Python does
    (its ``__init__`` may import the file back: then the finder binds it there)."""
    names = {name: mod for mod, spec in modules.items() for name in spec.get("imported_as", ())}
    saved: dict[str, Any] = {}
    before = set(sys.modules)
    done: dict[str, Any] = {}
    # Those names and the packages above them import afresh: a package imported before (by a project helper) holds
    # the project's own copy of the file (FLA's ``from fla.ops.utils import chunk_local_cumsum``).
    for name in names:
        while name:
            saved.setdefault(name, sys.modules.pop(name, None))
            name = name.rpartition(".")[0]

    def bound(mod: str) -> Any:
        if mod not in done:
            aliases = tuple(modules[mod].get("imported_as", ()))
            for name in aliases:
                if "." in name:
                    importlib.import_module(name.rpartition(".")[0])  # may bind it (through the finder)
            if mod not in done:
                done[mod] = bind(mod, aliases)
                for name in aliases:  # as the import system sets a submodule on its package
                    parent, _, child = name.rpartition(".")
                    if parent in sys.modules and not hasattr(sys.modules[parent], child):
                        setattr(sys.modules[parent], child, done[mod])
        return done[mod]

    finder = _BindingFinder(names, bound)
    sys.meta_path.insert(0, finder)
    try:
        yield bound
    finally:
        sys.meta_path.remove(finder)
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
