"""Project modules shipped with the package (``<package>._ops._local.*``, localmods.py at build time): loaded as host
code under the package's import rules, so nothing lands in ``sys.modules`` under the project's own names."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

from .basics import KERNEL_SIDE_HOOK
from .host_exec import kernel_side, load_modules, run_module_code, small_triton


def local_builtins(package: str, tops: set[str]) -> dict[str, Any]:
    """The builtins of packaged host code that imports project modules (localmods.py; ``tops``: their top-level
    names, a set the caller may grow): ``import`` and ``from ... import`` of those names get the package's copies,
    ``<package>._ops._local.<name>``, so nothing lands in ``sys.modules`` under the project's own names (a deployed
    process may have other modules of the same names)."""
    import builtins

    base = f"{package}._ops._local."
    real = builtins.__import__

    def import_module(name: str, package: str | None = None) -> Any:
        # importlib.import_module("fla.layers") (FLA's __init__ probes its optional parts so) takes the same rules;
        # a missing module is named as the project's own import would name it, which such probes compare
        if name.startswith(".") and package and package.partition(".")[0] in tops:
            name = importlib.util.resolve_name(name, package)  # relative to a project package named as such
        if name.partition(".")[0] not in tops:
            return importlib.import_module(name, package)
        try:
            return importlib.import_module(base + name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(base):
                exc.name = exc.name[len(base):]
                exc.msg = exc.msg.replace(base, "")
                exc.args = (exc.msg, *exc.args[1:])
            raise

    facade = types.ModuleType("importlib", importlib.__doc__)
    facade.__getattr__ = lambda attr: getattr(importlib, attr)  # type: ignore[method-assign]  # PEP 562
    facade.import_module = import_module  # type: ignore[attr-defined]

    def __import__(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                   level: int = 0) -> Any:
        if level == 0 and name.partition(".")[0] in tops:
            module = real(base + name, globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[base + name.partition(".")[0]]
        if level == 0 and (name == "importlib" or (name.startswith("importlib.") and not fromlist)):
            real(name, globals, locals, fromlist, 0)  # ``import importlib.util`` binds ``importlib`` too
            return facade
        return real(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": __import__}


def import_rules(package: Any, names: Any) -> dict[str, Any]:
    """The builtins of packaged code that imports the project modules ``names`` (dotted) for ``package`` (an
    ``entry.Package`` or a ``lean.LeanPackage``: its ``lock``, ``local_tops`` and ``builtins``): one namespace per
    package, whose import rules grow with every host module bound (see ``local_builtins``)."""
    with package.lock:
        package.local_tops.update(n.partition(".")[0] for n in names)
        if package.builtins is None:
            package.builtins = local_builtins(package.package, package.local_tops)
        return package.builtins


class LocalModuleLoader(importlib.machinery.SourceFileLoader):
    """Loads a shipped project module (``<package>._ops._local.*``) as host code: the ``triton`` helpers and the
    package's import rules bound before its first line (its Triton lines are blanked, as in kernel files)."""

    def __init__(self, fullname: str, path: str, bound: dict[str, Any], compiles: bool = False) -> None:
        super().__init__(fullname, path)
        self.bound, self.compiles = bound, compiles

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.update(self.bound)
        run_module_code(self, module, self.compiles)


def host_module_imported_as(package: Any, fullname: str) -> str | None:
    """The host module that project code imports as ``fullname`` (``<package>._ops._local.<name>``: a kernel file
    of the package, which the wheel does not ship twice; or ``<package>._ops.<module>`` itself, for a host module
    with no op nor export), or None. ``package``: an ``entry.Package`` or a ``lean.LeanPackage``."""
    if package._imported_as is None:
        local, modules = f"{package.package}._ops._local.", load_modules(package.root)["modules"]
        package._imported_as = {local + name: mod for mod, spec in modules.items()
                                for name in spec.get("imported_as", ())}
        package._imported_as.update({f"{package.package}._ops.{mod}": mod for mod in modules})
    return package._imported_as.get(fullname)


def package_local_spec(package: Any, fullname: str) -> Any:
    """The spec of a shipped project module (``<package>._ops._local.*``) of an ``entry.Package`` (or a
    ``lean.LeanPackage``): loaded as host code, with the import rules of every host module (even before any op ran:
    ``pickle`` of an object a helper defines)."""
    if package.builtins is None:
        import_rules(package, (n for spec in load_modules(package.root)["modules"].values()
                               for n in spec.get("local_modules", ())))
    # Kernels of project modules are not the package's (its kernel files bind as host modules): their names are
    # stand-ins (the build leaves their heuristics out: FLA's fla/ops/utils/csr.py decorates one). ``triton``: the
    # small one, whose other names load the full host ``triton`` on first use.
    bound = {"triton": small_triton(), "__builtins__": package.builtins, KERNEL_SIDE_HOOK: kernel_side}
    compiles = fullname.split("._ops._local.", 1)[1] in load_modules(package.root).get("local_torch_compile", ())
    return local_spec(fullname, os.path.join(package.root, "_ops", "_local"), bound, compiles)


def lean_local_spec(package: Any, fullname: str) -> Any:
    """What a lean package (``lean.LeanPackage``, before its hand-over) finds for ``fullname`` under
    ``<package>._ops.``: None for ``_local`` itself (its ``__init__``, found by Python's path finder, as the full
    runtime's finder leaves it), a shipped project module's spec, a kernel file's imported by its project name (bound
    lean where it has a plan), None for a missing one, or False where the full runtime must answer."""
    local = f"{package.package}._ops._local"
    if fullname == local:
        return None
    if not fullname.startswith(local + "."):
        return False
    spec = package_local_spec(package, fullname)
    mod = None if spec is not None else host_module_imported_as(package, fullname)
    if mod is None:
        return spec
    lean = package.lean_modules is None or mod in package.lean_modules  # (else the full runtime's to bind)
    return importlib.util.spec_from_loader(fullname, HostModuleLoader(package, mod)) if lean else False


class HostModuleLoader:
    """The loader of an import of a host module (``<package>._ops.<mod>``, or a kernel file by its project name) for
    ``package``, an ``entry.Package`` or a lean one (``lean.LeanPackage``, which hands the module to the full runtime
    where it cannot bind it): the module bound, its own spec kept. Bound here, not by the finder: a module in
    ``sys.modules`` when its finder returns is imported through its own spec, the plain file's."""

    def __init__(self, package: Any, mod: str) -> None:
        self.package, self.mod, self.spec = package, mod, None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = self.package.module(self.mod) or self.package.full().module(self.mod)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec


def local_spec(fullname: str, directory: str, bound: dict[str, Any], compiles: bool = False) -> Any:
    """The module spec of ``<package>._ops._local.<dotted>`` under the package's ``_ops/_local`` directory, or None
    where there is no such file (``compiles``: its code names ``torch.compile``, see ``run_module_code``)."""
    parts = fullname.split("._ops._local.", 1)[1].split(".")
    package = os.path.join(directory, *parts)
    init = os.path.join(package, "__init__.py")
    if os.path.isfile(init):
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[package],
                                                      loader=LocalModuleLoader(fullname, init, bound, compiles))
    path = package + ".py"
    if os.path.isfile(path):
        return importlib.util.spec_from_file_location(fullname, path,
                                                      loader=LocalModuleLoader(fullname, path, bound, compiles))
    return None
