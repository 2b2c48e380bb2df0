"""The package entry point: ``import <package>`` registers the ops and loads nothing else.

A generated package hands over its ops table (op → host module, torch.library schema), written into its
``__init__.py`` at build time: import parses no index and runs no host code; it puts ``torch.ops.<package>`` in
place, which defines the custom ops when first needed (``custom_ops``), and returns the exported callables. The
first call of an op (its custom op, ``preload``, an exported class, ``<package>._ops.<module>``) loads the rest of
the runtime, the index and that host module with its kernel handles, once, under a lock. Imports: stdlib, torch."""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any


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

    def module(self, mod: str) -> Any:
        """The host module ``mod``, run with its kernel handles bound (the first time)."""
        module = self.modules.get(mod)
        if module is None:
            import importlib

            from .host_modules import load_index

            index = self._index_parts.get(mod)
            if index is None:
                index = self._index_parts[mod] = load_index(self.root, mod)
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
                    from .host_modules import bind_module
                    from .kernel import Kernel
                    from .launch import BinaryBackend

                    # ``import <package>._ops.<mod> as m`` after a first call reads ``<package>._ops``: the
                    # subpackage, imported (a module in sys.modules counts as imported with its parents).
                    importlib.import_module(f"{self.package}._ops")

                    if self.backend is None:
                        self.backend = BinaryBackend(self.root)
                    path = os.path.join(self.root, spec["path"])
                    module = bind_module(f"{self.package}._ops.{mod}", index, mod, self.backend, Kernel, (path, None),
                                         builtins, local, aliases)
                    for alias in aliases:  # as the import system sets a submodule on its package (a.b.c)
                        parent, _, child = alias.rpartition(".")
                        if not hasattr(sys.modules[parent], child):
                            setattr(sys.modules[parent], child, module)
                    if self.routed:
                        from .torch_ops import route_in_module

                        route_in_module(module, self.package, self.routed, self.ops)
                    self.modules[mod] = module
                    runtime = sys.modules[__package__]
                    if runtime.BUNDLE_WANTED:
                        runtime.first_call_done()
        return module

    def _import_rules(self, names: Any) -> dict[str, Any]:
        """The builtins of packaged code that imports the project modules ``names`` (dotted): one namespace for
        the package, whose import rules grow with every host module bound (see local_imports.local_builtins)."""
        with self.lock:
            self.local_tops.update(n.partition(".")[0] for n in names)
            if self.builtins is None:
                from .local_imports import local_builtins

                self.builtins = local_builtins(self.package, self.local_tops)
            return self.builtins

    def function(self, op: str) -> Callable[..., Any]:
        """The host function of an exported op."""
        fn = self.functions.get(op)
        if fn is None:
            fn = getattr(self.module(self.ops[op][0]), (self.ops[op][6:7] or (op,))[0])  # host_modules.host_name
            fn = getattr(fn, "__forge_host__", fn)
            self.functions[op] = fn
        return fn

    def preload(self, device: Any = None) -> int:
        """Define the custom ops, bind every host module, then load every binary the device can run (see
        BinaryBackend.preload)."""
        from .host_modules import load_index

        self.define_custom_ops()
        for mod in sorted(load_index(self.root)["modules"]):
            self.module(mod)
        return self.backend.preload(device)


class _HostModuleFinder:
    """``import <package>._ops.<module>`` binds the host module (the file alone, run by Python's own import
    system, would lack its kernel handles)."""

    def __init__(self, package: Package, modules: set[str]) -> None:
        self.package = package
        self.prefix, self.local_prefix = f"{package.package}._ops.", f"{package.package}._ops._local."
        self.names = modules
        self.specs: dict[str, Any] = {}
        self.host_modules: dict[str, str] = {}
        """Module name being imported -> the host module it is (``<package>._ops.<mod>``, or a kernel file imported
        by its project name)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix):
            return None
        from .local_imports import host_module_imported_as, package_local_spec

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

        self.host_modules[fullname] = mod
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        module = self.package.module(self.host_modules[spec.name])
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:  # the host file's own spec (not that of an alias imported)
        module.__spec__ = self.specs.pop(module.__spec__.name, module.__spec__)


def export(function: Callable[[str], Callable[..., Any]], namespace: str, op: str,
           custom: bool, spec: tuple[Any, ...] = ()) -> Callable[..., Any]:
    """The exported op: its host function (``function(op)``, loaded on the first call), the fast path in eager
    code; for a custom op (``spec``: its op table entry), ``torch.ops.<namespace>.<op>`` while torch.compile or
    torch.export trace (padded results unpadded by its rule), except a call needing gradients through an op with
    no backward in the manifest (its results would not differentiate, silently): the host code runs there, eagerly."""
    loaded: list[Callable[..., Any]] = []

    def load() -> Callable[..., Any]:
        fn = function(op)
        if not loaded:
            from .host_modules import dress_exported  # loaded by function(op)
            dress_exported(exported, fn, op, custom)
            loaded.append(fn)
        return fn

    import torch  # (imported: the ops take its tensors)

    if custom:
        is_compiling, rule, differentiable = torch.compiler.is_compiling, rule_of(spec), len(spec) > 2 and spec[2]
        if rule is not None:
            from .torch_ops import unpad
        eagerly: list[Callable[..., Any]] = []  # traced calls the custom op cannot take run host code eagerly

        def exported(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                if without_grad(differentiable, args, kwargs, f"{namespace}.{op}"):
                    call = custom_call(spec, args, kwargs)
                    if call is not None:
                        out = getattr(getattr(torch.ops, namespace), op)(*call[0], **call[1])
                        return out if rule is None else unpad(rule, out, *call, f"{namespace}.{op}")
                if not eagerly:
                    eagerly.append(torch._disable_dynamo(lambda *a, **k: (loaded[0] if loaded else load())(*a, **k)))
                return eagerly[0](*args, **kwargs)
            return (loaded[0] if loaded else load())(*args, **kwargs)
    else:
        def load_now() -> bool:  # while Dynamo traces: run, not traced (it cannot trace file reads and imports)
            return bool(loaded or load())
        load_now._dynamo_marked_constant = True  # type: ignore[attr-defined]  # (assume_constant_result's mark)

        def exported(*args: Any, **kwargs: Any) -> Any:
            if loaded:  # (one test on the fast path; a first call inside torch.compile, scattermoe's, loads
                return loaded[0](*args, **kwargs)  # while Dynamo traces and reads the host function afresh)
            return (load_now() and function(op) if torch.compiler.is_compiling() else load())(*args, **kwargs)

    exported.__name__ = exported.__qualname__ = op
    exported.__module__ = namespace
    return exported


def without_grad(differentiable: bool, args: tuple[Any, ...], kwargs: dict[str, Any], op: str) -> bool:
    """Whether a traced call may take the custom op: it has a backward, or nothing needs gradients. Where not, the
    graph breaks here saying why (``fullgraph=True`` raises that), and the host code runs eagerly with its autograd."""
    torch = sys.modules["torch"]  # imported: the package has custom ops
    flag = getattr(torch.compiler, "_is_exporting_flag", None)  # torch 2.11's Dynamo folds is_exporting() to True
    if differentiable or not torch.is_grad_enabled() or (flag if flag is not None else torch.compiler.is_exporting()) \
            or not any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values())):
        return True
    torch._dynamo.graph_break(msg=f"{op}: its inputs need gradients and the manifest gives it no backward "
                                  "([kernels.NAME.autograd]), so its custom op cannot take the call; it runs eagerly")
    return False


def rule_of(spec: tuple[Any, ...]) -> Any:
    """An op table entry's result rule, or None."""
    return spec[3] if len(spec) > 3 else None


def custom_call(spec: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
                ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """A traced call as the op's custom op takes it, or None where it runs as Python: it passes an argument the
    schema leaves out (left None, it is taken out), or more than it takes (``**kwargs`` the examples left empty)."""
    for name, position in reversed(spec[4] if len(spec) > 4 and spec[4] else ()):
        if 0 <= position < len(args):
            if args[position] is not None:
                return None
            args = (*args[:position], *args[position + 1:])
        elif kwargs.get(name) is not None:
            return None
        kwargs = {k: v for k, v in kwargs.items() if k != name}
    takes = spec[5] if len(spec) > 5 else None
    if takes is not None and (len(args) > takes[0] or any(k not in takes[1] for k in kwargs)):
        return None
    return args, kwargs


class LazyCustomOps:
    """A package's custom ops, defined once by ``define()``, from any thread (others wait; a look-up the defining
    thread makes meanwhile, as ``Library.define`` makes one, sees what is defined so far)."""

    def __init__(self, namespace: str, ops: dict[str, tuple[Any, ...]],
                 function: Callable[[str], Callable[..., Any]],
                 host_attr: Callable[[str, str], Callable[..., Any]]) -> None:
        self.args = (namespace, ops, function, host_attr)
        self.lock = threading.RLock()
        self.done = self.running = False

    def define(self) -> None:
        if self.done:
            return
        with self.lock:
            if self.done or self.running:
                return
            self.running = True
            try:
                from .custom_ops import register_custom_ops

                register_custom_ops(*self.args)
                self.done = True
            finally:
                self.running = False


@functools.cache
def _lazy_namespace() -> type:
    import torch._ops

    class LazyNamespace(torch._ops._OpNamespace):  # type: ignore[misc,name-defined]
        """``torch.ops.<package>``: the package's custom ops are defined on the first look-up of an op in it."""

        def __init__(self, name: str, pending: LazyCustomOps) -> None:
            super().__init__(name)
            self._forge_pending = pending

        def __getattr__(self, op_name: str) -> Any:
            if op_name.startswith("__"):  # introspection (copy, pickle, inspect) defines nothing
                return super().__getattr__(op_name)
            pending = self._forge_pending
            pending.define()
            with pending.lock:  # one OpOverloadPacket per op, also where threads look it up at once
                cached = vars(self).get(op_name)
                return cached if cached is not None else super().__getattr__(op_name)

    # _OpNamespace names its ops' module after its own (torch.export writes ``torch.ops.<package>.<op>`` from it)
    LazyNamespace.__module__ = torch._ops._OpNamespace.__module__
    LazyNamespace.__qualname__ = "LazyNamespace"
    return LazyNamespace


def define_lazily(namespace: str, ops: dict[str, tuple[Any, ...]], function: Callable[[str], Callable[..., Any]],
                  host_attr: Callable[[str, str], Callable[..., Any]]) -> tuple[set[str], Callable[[], None]]:
    """The ops of ``ops`` (host_modules.op_table) that are custom ops (those with a schema), and what defines them now:
    ``torch.ops.<namespace>`` defines them on first need (see ``custom_ops``) where it can be put in place, else
    they are defined here. ``function`` and ``host_attr``: see custom_ops.register_custom_ops."""
    with_schema = {op for op, spec in ops.items() if spec[1]}
    if not with_schema:
        return set(), lambda: None
    import torch

    pending = LazyCustomOps(namespace, ops, function, host_attr)
    try:
        placed = namespace not in vars(torch.ops)
        if placed:
            setattr(torch.ops, namespace, _lazy_namespace()(namespace, pending))
            torch.ops._dir.append(namespace)  # as _Ops.__getattr__ records a namespace it makes
    except Exception:  # a torch whose torch.ops differs: define them now
        placed = False
    if not placed:
        pending.define()
    return with_schema, pending.define


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
