"""The package entry point: ``import <package>`` registers the ops and loads nothing else.

At import, a generated package hands over its ops table (op → host module, torch.library schema), written into
its ``__init__.py`` at build time, so import parses no index and runs no host code: it defines the ops that have
a schema as torch custom ops (``torch.ops.<package>.<op>`` exists from then on) and returns the exported
callables. The first call of an op (or its custom op, or ``preload``, or importing ``<package>._ops.<module>``)
loads the rest of the runtime, the index and that op's host module with its kernel handles, once, under a lock.
This module imports only the standard library (and torch when the package has custom ops).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

LIBRARIES: list[Any] = []
"""torch.library.Library objects of the packages loaded in this process (they must stay alive)."""


class Package:
    """One generated package's host modules, bound on first use."""

    def __init__(self, package: str, root: str, ops: dict[str, tuple[str, str | None]]) -> None:
        self.package = package
        self.root = root
        self.ops = ops
        self.lock = threading.RLock()
        self.backend: Any = None
        self.modules: dict[str, Any] = {}
        self.functions: dict[str, Callable[..., Any]] = {}


    def module(self, mod: str) -> Any:
        """The host module ``mod``, run with its kernel handles bound (the first time)."""
        module = self.modules.get(mod)
        if module is None:
            with self.lock:
                module = self.modules.get(mod)
                if module is None:
                    from .host_modules import bind_module, load_index
                    from .kernel import Kernel
                    from .launch import BinaryBackend

                    if self.backend is None:
                        self.backend = BinaryBackend(self.root)
                    index = load_index(self.root, mod)
                    path = os.path.join(self.root, index["modules"][mod]["path"])
                    module = bind_module(f"{self.package}._ops.{mod}", index, mod, self.backend, Kernel, (path, None))
                    self.modules[mod] = module
        return module

    def function(self, op: str) -> Callable[..., Any]:
        """The host function of an exported op."""
        fn = self.functions.get(op)
        if fn is None:
            fn = getattr(self.module(self.ops[op][0]), op)
            self.functions[op] = fn
        return fn

    def preload(self, device: Any = None) -> int:
        """Bind every host module, then load every binary the device can run (see BinaryBackend.preload)."""
        from .host_modules import load_index

        for mod in sorted(load_index(self.root)["modules"]):
            self.module(mod)
        return self.backend.preload(device)


class _HostModuleFinder:
    """``import <package>._ops.<module>`` binds the host module (the file alone, run by Python's own import
    system, would lack its kernel handles)."""

    def __init__(self, package: Package, modules: set[str]) -> None:
        self.package = package
        self.prefix = f"{package.package}._ops."
        self.names = modules
        self.specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix) or fullname[len(self.prefix):] not in self.names:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        module = self.package.module(spec.name[len(self.prefix):])
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = self.specs.pop(module.__name__, module.__spec__)  # the host file's own spec


def export(package: Package, op: str, custom: bool) -> Callable[..., Any]:
    """The exported op: its host function, loaded on the first call (the fast path in eager code); for a custom
    op, the registered ``torch.ops.<package>.<op>`` while torch.compile or torch.export trace, so they see one
    opaque op instead of the host code."""
    loaded: list[Callable[..., Any]] = []

    def load() -> Callable[..., Any]:
        fn = package.function(op)
        if not loaded:
            functools.update_wrapper(exported, fn)  # name, docstring and signature (through __wrapped__)
            loaded.append(fn)
        return fn

    if custom:
        import torch

        is_compiling = torch.compiler.is_compiling
        namespace = package.package

        def exported(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                return getattr(getattr(torch.ops, namespace), op)(*args, **kwargs)
            return (loaded[0] if loaded else load())(*args, **kwargs)
    else:
        def exported(*args: Any, **kwargs: Any) -> Any:
            return (loaded[0] if loaded else load())(*args, **kwargs)

    exported.__name__ = exported.__qualname__ = op
    exported.__module__ = package.package
    return exported


def _custom_op_kernels(package: Package, op: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The custom op's real implementation (the host code) and its Meta implementation (the host code with
    kernel launches skipped, so shapes, dtypes and strides are exactly those of a real call)."""

    def real(*args: Any, **kwargs: Any) -> Any:
        return package.function(op)(*args, **kwargs)

    def meta(*args: Any, **kwargs: Any) -> Any:
        from .kernel import call_without_launches  # the runtime loads on first use, not at import

        return call_without_launches(package.function(op), *args, **kwargs)

    return real, meta


def load_package(package: str, root: str, ops: dict[str, tuple[str, str | None]] | None = None,
                 ) -> tuple[dict[str, Callable[..., Any]], Callable[..., int]]:
    """Entry point of a generated package: its exported ops (custom ops where they have a schema) and its
    ``preload``. ``ops``: op → (host module, schema or None), as the build wrote them; without it they are read
    from the index (packages generated before the table existed)."""
    if ops is None:
        from .host_modules import load_index

        index = load_index(root)
        ops = {op: (mod, spec.get("schemas", {}).get(op) or None)
               for mod, spec in index["modules"].items() for op in spec["ops"]}
    state = Package(package, root, ops)
    modules = {mod for mod, _ in ops.values()}
    if not any(isinstance(f, _HostModuleFinder) and f.prefix == f"{package}._ops." for f in sys.meta_path):
        sys.meta_path.insert(0, _HostModuleFinder(state, modules))
    custom: set[str] = set()
    with_schema = {op: schema for op, (_, schema) in ops.items() if schema}
    if with_schema:
        import torch

        lib = torch.library.Library(package, "FRAGMENT")
        LIBRARIES.append(lib)
        for op, schema in sorted(with_schema.items()):
            try:
                lib.define(f"{op}{schema}")
            except RuntimeError:
                continue  # defined by an earlier import of this package in the process: keep that one
            real, meta = _custom_op_kernels(state, op)
            lib.impl(op, real, "CompositeExplicitAutograd")
            # A Meta kernel serves fake tensors too (FakeTensorMode runs it on meta tensors), and registering one
            # costs a tenth of torch.library.register_fake, which reads the caller's source file.
            lib.impl(op, meta, "Meta")
            custom.add(op)
    exported = {op: export(state, op, op in custom) for op in sorted(ops)}
    return exported, state.preload
