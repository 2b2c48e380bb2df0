"""The package entry point: ``import <package>`` registers the ops and loads nothing else.

A generated package hands over its ops table (op → host module, torch.library schema), written into its
``__init__.py`` at build time: import parses no index and runs no host code; it puts ``torch.ops.<package>`` in
place, which defines the custom ops when first needed (``custom_ops``), and returns the exported callables. The
first call of an op (its custom op, ``preload``, an exported class, ``<package>._ops.<module>``) loads the rest of
the runtime, the index and that host module with its kernel handles, once, under a lock. Imports: stdlib, torch."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .exports import define_lazily, export, host_name


def exported(package: str, module: str, name: str) -> Any:
    """``package.NAME``, a class or function exported as it is: its host module bound on first access."""
    return getattr(PACKAGES[package].module(module), name)


class Package:
    """One generated package's host modules, bound on first use (``PACKAGES``: by package name)."""

    def __init__(self, package: str, root: str, ops: dict[str, tuple[Any, ...]]) -> None:
        self.package, self.root, self.ops = package, root, ops
        self.lock = threading.RLock()
        self.backend: Any = None
        self.modules: dict[str, Any] = {}
        self.functions: dict[str, Callable[..., Any]] = {}
        self.routed: dict[str, bool] = {}
        """Where the package has autograd: every op (→ whether it is a custom op) that host code calls by name
        reaches through ``torch_ops.route_in_module``."""
        self.local_tops: set[str] = set()
        """Top-level names of the project modules the bound host modules import (shipped in ``_ops/_local``)."""
        self.builtins: dict[str, Any] | None = None
        self._imported_as: dict[str, str] | None = None
        self._index_parts: dict[str, dict[str, Any]] = {}
        self.define_custom_ops: Callable[[], None] = lambda: None
        """Defines the package's custom ops now (see custom_ops.define_lazily); ``preload`` calls it."""
        self.cold: bool | None = None
        """Whether host modules may bind cold handles (``cold_binding.available``; None: not asked)."""
        self.cold_kernels: list[Any] = []
        """The cold handles bound (``preload`` promotes them: their binaries then load with the others)."""

    def module(self, mod: str) -> Any:
        """The host module ``mod``, run with its kernel handles bound (the first time): cold handles where its
        kernels are plain (``cold``), else full ones."""
        module = self.modules.get(mod)
        if module is not None:
            return module
        import importlib

        part = self._cold_part(mod)
        index = part if part is not None else self._index(mod)
        spec = index["modules"][mod]
        local = f"{self.package}._ops._local."
        aliases = tuple(local + n for n in spec.get("imported_as", ()))
        builtins = self._import_rules(spec["local_modules"]) if spec.get("local_modules") else None
        for alias in aliases:
            # As Python imports a module's parent package first: a package __init__ importing this file back
            # binds it itself (_HostModuleFinder). Outside the lock: a thread running it may wait for ours.
            importlib.import_module(alias.rpartition(".")[0])
        with self.lock:
            module = self.modules.get(mod)
            if module is None:
                self._ops_package()
                if part is not None:
                    from . import cold_binding

                    bound = cold_binding.bind(self.package, self.root, mod, part,
                                              lambda name: self._upgrade(mod, name), builtins, aliases)
                    if bound is not None:
                        module, kernels = bound
                        self.cold_kernels.extend(kernels)
                    else:
                        index = self._index(mod, part)
                if module is None:
                    from .host_modules import bind_module
                    from .kernel import Kernel

                    path = os.path.join(self.root, spec["path"])
                    module = bind_module(f"{self.package}._ops.{mod}", index, mod, self._backend(), Kernel,
                                         (path, None), builtins, local, aliases)
                if self.routed:
                    from .torch_ops import route_in_module

                    route_in_module(module, self.package, self.routed, self.ops)
                self.modules[mod] = module
                self._bound()
        return module

    def _index(self, mod: str, read: dict[str, Any] | None = None) -> dict[str, Any]:
        """Host module ``mod``'s part of the index as the full binding reads it (``read``: that part as read)."""
        index = self._index_parts.get(mod)
        if index is None:
            from .host_modules import load_index

            index = self._index_parts[mod] = load_index(self.root, mod, read)
        return index

    def _backend(self) -> Any:
        """The package's ``BinaryBackend`` (made once; under the lock)."""
        if self.backend is None:
            from .launch import BinaryBackend

            self.backend = BinaryBackend(self.root)
        return self.backend

    def _ops_package(self) -> None:
        """``<package>._ops`` imported (under the lock): see ``lean.ops_package``."""
        from .lean import ops_package

        ops_package(self.package, self.root)

    def _bound(self) -> None:
        from . import bundle

        if bundle.BUNDLE_WANTED:
            bundle.first_call_done()

    def _cold_part(self, mod: str) -> dict[str, Any] | None:
        """Host module ``mod``'s part of the index where cold handles may bind it (see ``cold``), else None."""
        if self.cold is False:
            return None
        from . import cold_binding as cold

        if self.cold is None:
            self.cold = cold.available()
            if not self.cold:
                return None
        index = cold.read_part(self.root, mod)
        return index if index is not None and mod in index["modules"] else None

    def _upgrade(self, mod: str, name: str) -> tuple[Any, ...]:
        """What promotes cold handle ``name`` of host module ``mod`` to a full ``Kernel``: its index entry, the
        package's targets and backend, the class."""
        from .kernel import Kernel

        with self.lock:
            index = self._index(mod)
            return index["kernels"][name], index["targets"], self._backend(), Kernel

    def _import_rules(self, names: Any) -> dict[str, Any]:
        """The builtins of packaged code that imports the project modules ``names`` (dotted): one namespace for
        the package, whose import rules grow with every host module bound (see local_imports.local_builtins)."""
        from .local_imports import import_rules

        return import_rules(self, names)

    def function(self, op: str) -> Callable[..., Any]:
        """The host function of an exported op."""
        fn = self.functions.get(op)
        if fn is None:
            fn = getattr(self.module(self.ops[op][0]), host_name(op, self.ops[op]))
            fn = getattr(fn, "__forge_host__", fn)
            self.functions[op] = fn
        return fn

    def preload(self, device: Any = None) -> int:
        """Define the custom ops, bind every host module, then load every binary the device can run (see
        BinaryBackend.preload)."""
        from .host_exec import load_modules

        self.define_custom_ops()
        self.cold = False  # every handle full from now on: the backend knows them all
        for mod in sorted(load_modules(self.root)["modules"]):
            self.module(mod)
        if self.cold_kernels:
            from .cold import promoted

            for kernel in self.cold_kernels:
                promoted(kernel)
        with self.lock:
            backend = self._backend()
        return backend.preload(device)


class _HostModuleFinder:
    """``import <package>._ops.<module>`` binds the host module (the file alone, run by Python's own import
    system, would lack its kernel handles)."""

    def __init__(self, package: Package, modules: set[str]) -> None:
        self.package = package
        self.prefix, self.local_prefix = f"{package.package}._ops.", f"{package.package}._ops._local."
        self.names = modules

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix):
            return None
        from .local_imports import HostModuleLoader, host_module_imported_as, package_local_spec

        if fullname.startswith(self.local_prefix):
            # A shipped project module, else maybe a kernel file imported by its project name (the index says)
            spec = package_local_spec(self.package, fullname)
            mod = host_module_imported_as(self.package, fullname) if spec is None else None
            if mod is None:
                return spec
        else:
            mod = fullname[len(self.prefix):]
            if mod not in self.names and host_module_imported_as(self.package, fullname) is None:
                return None  # not a host module (one with no op nor export, flash-attn's rotary: the index says)
        import importlib.util

        return importlib.util.spec_from_loader(fullname, HostModuleLoader(self.package, mod))


PACKAGES: dict[str, Package] = {}


def load_package(package: str, root: str, ops: dict[str, tuple[Any, ...]],
                 exports: dict[str, str] | None = None) -> tuple[dict[str, Callable[..., Any]], Callable[..., int]]:
    """Entry point of a generated package: its exported ops (custom ops where they have a schema) and its
    ``preload``. ``ops``: op → (host module, schema or None[, (setup_context, backward)]), as the build wrote them
    (host_modules.op_table); ``exports``: name → host module of what it exports as it is (see ``exported``)."""
    state = PACKAGES[package] = Package(package, root, ops)
    modules = {spec[0] for spec in ops.values()} | set((exports or {}).values())
    if not any(isinstance(f, _HostModuleFinder) and f.prefix == f"{package}._ops." for f in sys.meta_path):
        sys.meta_path.insert(0, _HostModuleFinder(state, modules))

    def host_attr(op: str, name: str) -> Callable[..., Any]:
        return getattr(state.module(ops[op][0]), name)

    custom, state.define_custom_ops = define_lazily(package, ops, state.function, host_attr)
    if exports or any(len(spec) > 2 and spec[2] for spec in ops.values()):  # host code may call ops by name
        state.routed = {op: op in custom for op in ops}
    exported = {op: export(state.function, package, op, op in custom, ops[op]) for op in sorted(ops)}
    return exported, state.preload


def adopt(lean: Any) -> tuple[Package, dict[str, Callable[..., Any]], _HostModuleFinder]:
    """The full runtime taking over a package served lean so far (``lean.LeanPackage``): its ``Package``, which
    adopts the host modules bound there and their handles (lean handles are promoted as cold ones are, see
    ``cold.promoted``), shares its lock and custom ops, and serves every later binding; the exported ops as
    ``load_package`` makes them (what traced calls take: custom ops); its host-module finder (which lean's own
    finder asks). Called once, under the lean package's lock."""
    package, ops = lean.package, lean.ops
    state = PACKAGES[package] = Package(package, lean.root, ops)
    state.lock = lean.lock
    state.modules.update(lean.modules)
    state.functions.update(lean.functions)
    state.cold_kernels.extend(lean.kernels)
    # (one dict and list from here on: a lean binding the hand-over interrupted, see lean_kernel.bind, ends in them)
    lean.modules, lean.kernels = state.modules, state.cold_kernels
    state.define_custom_ops = lean.define_custom_ops
    state.routed = lean.routed
    # (the import rules made there, closed over that set of names: project modules imported so far stay the ones
    # later imports find in sys.modules)
    state.local_tops, state.builtins, state._imported_as = lean.local_tops, lean.builtins, lean._imported_as
    with_schema = {op for op, spec in ops.items() if spec[1]}
    exported = {op: export(state.function, package, op, op in with_schema, ops[op]) for op in sorted(ops)}
    return state, exported, _HostModuleFinder(state, {spec[0] for spec in ops.values()})
