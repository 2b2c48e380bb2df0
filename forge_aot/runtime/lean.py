"""``import <package>`` and the first calls of its simplest ops, with no other runtime module loaded.

Measured (session 57, ``scripts/probe_lean_first_call.py``): about 4 of a fresh process's 6 ms to import a wheel and
call an op went to loading the runtime's modules (~130 KB of bytecode), not to what the first call does. So the
package's ``__init__`` imports this module alone. It defines the exported ops and ``torch.ops.<package>`` (its custom
ops defined on first need, as before), and serves an op's first call itself where the build wrote a *lean plan* for its
host module (``_forge/modules/<module>.json``'s ``lean``, see ``lean_plan``): every kernel of the module takes its
runtime arguments and call-site values (constexprs and launch options host code chooses: ``BLOCK_SIZE=...``,
``num_warps=...``; since session 62) by position or by keyword, its table key and variant from their values and dtypes
(no launch flags, heuristics, pre-hooks, integer pointers, descriptors), and the module imports no kernel file by its
project name. Project modules it imports (Liger's ``ligerlike.ops.utils``; since session 63) load as the full runtime
loads them, the package's copies under its import rules (``local_imports``; ``_LeanFinder`` finds them until a
hand-over, and the full ``Package`` adopts those rules). In a package that routes ops by name (manifest autograd,
``[exports]``; lean since session 63 too) each module bound here has its ops' globals routed as the full runtime routes
them (``torch_ops.route_in_module``). The host module then runs with ``LeanKernel`` handles; a call
the C path (``_fastlaunch``) has not seen comes to ``LeanKernel.run``, which binds it as ``Kernel._bind`` does
(``lean_launch.bind_call``) and resolves it as ``ColdKernel._resolve`` does (dtypes and call-site values -> variant,
capability -> target, device name -> table, the key's row or the nearest usable one, the most specialized binary that
fits), loads the binary (sha256 checked) through the C ``Driver``, launches it through a C ``Launcher`` and registers
the call with the C path.

Everything else hands over to the full runtime (``LeanPackage.full``: ``entry.adopt``), once, without binding anything
twice: the full ``Package`` adopts the modules bound here and their handles; a handle asked anything a lean handle does
not serve (keywords it does not bind, ``LAUNCHES.skip`` from a custom op's tracing or guard, another dtype, an attribute
such as ``warmup``, a binary whose checksum is wrong: the full path reports it) becomes a ``ColdKernel`` in place
(``LeanKernel._promoted``), and then a full ``Kernel`` as cold handles do. Handed over: ``torch.compile`` and
``torch.export`` tracing an op, ``preload``, ``import <package>._ops.<module>``, ROCm, no C extension,
``FORGE_NO_LEAN=1`` (or ``FORGE_NO_COLD``/``FORGE_NO_C_LAUNCH``).

This module: the package entry (exported ops, ``torch.ops.<package>``, the hand-over); ``lean_kernel``: binding a
host module with lean handles; ``lean_launch``: their first calls; ``basics``: what every path reads alike.
Imports: stdlib, ``basics`` (torch where called).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

FILENAME = "_fastlaunch.abi3.so"
"""The C extension's file beside this one, under the name the build gives it (``basics.extension`` loads it)."""
FINGERPRINT: str | None = None
"""The build's sha256 of the runtime's sources, handed over by the package's ``__init__``: the bytecode bundle
(``bundle``) is used only where it was written for them."""


def full_runtime() -> None:
    """The full runtime's modules served from the bytecode bundle from now on, where it is valid (read once, when
    the full runtime is first needed: the lean path's own modules load without it)."""
    if FINGERPRINT is not None:
        from .bundle import use_bundle

        use_bundle(FINGERPRINT)

# -- the exported ops and torch.ops.<package> -----------------------------------------------------------------

def host_name(op: str, spec: tuple[Any, ...]) -> str:
    """The host function of an op (its op table entry's last item where the package exports it under another
    name, ``[ops.NAME] function``; see ``host_modules.op_table``)."""
    return spec[6] if len(spec) > 6 and spec[6] else op


def applied_function(fn: Any) -> type | None:
    """The ``torch.autograd.Function`` whose ``apply`` ``fn`` is (Triton's tutorial 05 exports ``layer_norm =
    LayerNorm.apply``), else None."""
    owner = getattr(fn, "__self__", None)
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(owner, type) or getattr(fn, "__name__", None) != "apply":
        return None
    return owner if issubclass(owner, torch.autograd.Function) else None


def dress_exported(exported: Callable[..., Any], fn: Callable[..., Any], op: str, custom: bool = False) -> None:
    """An exported op takes its host function's name, docstring and signature (through ``__wrapped__``); for
    ``op = Cls.apply``, the op's name, the Function's module and docstring and its forward's parameters. A custom
    op's leaves out Dynamo's marks (FLA's ops are ``@torch.compiler.disable``d: torch.compile then stopped at the
    exported op, which would have traced it as its custom op)."""
    functools.update_wrapper(exported, fn)
    for mark in [k for k in vars(exported) if custom and k.startswith("_torchdynamo")]:
        delattr(exported, mark)
    owner = applied_function(fn)
    if owner is not None:
        from .exports import host_signature

        exported.__name__ = exported.__qualname__ = op
        exported.__module__, exported.__doc__ = owner.__module__, owner.__doc__
        exported.__signature__ = host_signature(fn)  # type: ignore[attr-defined]


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


# -- the lean package ------------------------------------------------------------------------------------------

PACKAGES: dict[str, LeanPackage] = {}


def load_package(package: str, root: str, ops: dict[str, tuple[Any, ...]], exports: dict[str, str] | None = None,
                 fingerprint: str | None = None, lean_modules: tuple[str, ...] | None = None,
                 ) -> tuple[dict[str, Callable[..., Any]], Callable[..., int]]:
    """Entry point of a generated package (``ops``, ``exports``: as ``entry.load_package`` takes them; ``fingerprint``:
    see FINGERPRINT; ``lean_modules``: the host modules with a lean plan, None where the build did not say, which
    then reads each module's part to find out): its exported ops and ``preload``. Lean where it may serve (see the
    module's docstring) and some module has a lean plan, else ``entry.load_package``'s, its first call's modules run
    now from the bytecode bundle where it is valid."""
    global FINGERPRINT
    FINGERPRINT = FINGERPRINT or fingerprint
    if lean_modules == () or not _lean_wanted():  # (no lean plan: the full runtime from import on, as before)
        full_runtime()
        from .bundle import run_first_call

        run_first_call()
        from .entry import load_package as load_full

        return load_full(package, root, ops, exports)
    state = PACKAGES[package] = LeanPackage(package, root, ops, lean_modules)
    if not any(isinstance(f, _LeanFinder) and f.prefix == f"{package}._ops." for f in sys.meta_path):
        sys.meta_path.insert(0, _LeanFinder(state))
    custom, state.define_custom_ops = define_lazily(package, ops, state.function, state.host_attr)
    if exports or any(len(spec) > 2 and spec[2] for spec in ops.values()):  # host code may call ops by name
        state.routed = {op: op in custom for op in ops}  # (as entry.load_package: see torch_ops.route_in_module)
    exported = {op: state.export(op, op in custom) for op in sorted(ops)}
    return exported, state.preload


def _lean_wanted() -> bool:
    """Whether lean first calls may serve this process: the C extension's file is there, torch drives CUDA, and
    none of ``FORGE_NO_LEAN``, ``FORGE_NO_COLD``, ``FORGE_NO_C_LAUNCH`` is set."""
    if any(os.environ.get(v, "") not in ("", "0") for v in ("FORGE_NO_LEAN", "FORGE_NO_COLD", "FORGE_NO_C_LAUNCH")):
        return False
    if not os.path.isfile(os.path.join(os.path.dirname(__file__), FILENAME)):
        return False
    import torch

    return not getattr(torch.version, "hip", None)


class LeanPackage:
    """One generated package served lean until it hands over to the full runtime (``full``)."""

    def __init__(self, package: str, root: str, ops: dict[str, tuple[Any, ...]],
                 lean_modules: tuple[str, ...] | None = None) -> None:
        self.package, self.root, self.ops = package, root, ops
        self.lean_modules = None if lean_modules is None else frozenset(lean_modules)
        """The host modules with a lean plan (the others hand over at once: no part read twice, no lean module
        loaded for them; in a routed package they cost a first call about 1.5 ms on an H200, session 63 r2)."""
        self.lock = threading.RLock()
        """Also the full ``Package``'s lock once handed over: one lock binds every host module."""
        self.modules: dict[str, types.ModuleType] = {}
        """Host modules bound here (the full ``Package`` adopts them)."""
        self.kernels: list[Any] = []
        """The lean handles bound (adopted as cold handles: ``preload`` promotes them)."""
        self.functions: dict[str, Callable[..., Any]] = {}
        self.handed: Any = None
        """(the full ``Package``, its exported ops, its host-module finder) once handed over."""
        self.define_custom_ops: Callable[[], None] = lambda: None
        self.devices: dict[int, tuple[Any, ...]] = {}
        """Device index → (name, capability, max shared memory, CUdevice), asked once."""
        self.routed: dict[str, bool] = {}
        """Where the package has autograd or ``[exports]``: every op (→ whether it is a custom op), which host code
        calling it by name reaches through ``torch_ops.route_in_module`` (``entry.Package.routed``)."""
        self.local_tops: set[str] = set()
        """Top-level names of the project modules the host modules bound here import (``entry.Package``'s, which
        adopts them with ``builtins``: the import rules made here keep serving)."""
        self.builtins: dict[str, Any] | None = None
        self._imported_as: dict[str, str] | None = None

    def full(self) -> Any:
        """The full runtime's ``Package`` for this package, adopting what was bound here (made once)."""
        handed = self.handed
        if handed is None:
            with self.lock:
                handed = self.handed
                if handed is None:
                    full_runtime()
                    from .bundle import first_call_done
                    from .entry import adopt

                    handed = self.handed = adopt(self)
                    first_call_done()  # (writes the bundle where this process found none valid)
        return handed[0]

    def full_exported(self, op: str) -> Callable[..., Any]:
        self.full()
        return self.handed[1][op]

    def function(self, op: str) -> Callable[..., Any]:
        """The host function of an exported op (its module bound here where lean, else by the full runtime)."""
        fn = self.functions.get(op)
        if fn is None:
            module = self.handed is None and self.module(self.ops[op][0])
            if not module:
                return self.full().function(op)
            fn = getattr(module, host_name(op, self.ops[op]))
            fn = self.functions[op] = getattr(fn, "__forge_host__", fn)
        return fn

    def host_attr(self, op: str, name: str) -> Callable[..., Any]:
        return getattr(self.full().module(self.ops[op][0]), name)

    def module(self, mod: str) -> types.ModuleType | None:
        """Host module ``mod`` bound here, or None where it is the full runtime's to bind."""
        module = self.modules.get(mod)
        if module is None:
            with self.lock:
                module = self.modules.get(mod)
                lean = self.lean_modules is None or mod in self.lean_modules
                if module is None and self.handed is None and lean:
                    from .lean_kernel import bind

                    module = bind(self, mod)
                    if module is not None:
                        if self.routed:
                            from .torch_ops import route_in_module

                            route_in_module(module, self.package, self.routed, self.ops)
                        self.modules[mod] = module
        return module

    def preload(self, device: Any = None) -> int:
        """``<package>.preload``: the full runtime's (see ``entry.Package.preload``)."""
        return self.full().preload(device)

    def export(self, op: str, custom: bool) -> Callable[..., Any]:
        """The exported op: its host function, loaded on the first call (lean where it may be); while torch.compile
        or torch.export trace it, the full runtime's exported op (its custom op, see ``exports.export``)."""
        import torch

        is_compiling = torch.compiler.is_compiling
        loaded: list[Callable[..., Any]] = []

        def hand_over() -> bool:  # Dynamo calls it, marked constant, rather than tracing the runtime's loading
            return bool(self.full_exported(op))
        hand_over._dynamo_marked_constant = True  # type: ignore[attr-defined]  # (assume_constant_result's mark)

        def load() -> Callable[..., Any]:
            fn = self.function(op)
            if not loaded:
                dress_exported(exported, fn, op, custom)
                loaded.append(fn)
            return fn

        if custom:
            def exported(*args: Any, **kwargs: Any) -> Any:
                if is_compiling():
                    return (hand_over() and self.handed[1][op])(*args, **kwargs)
                return (loaded[0] if loaded else load())(*args, **kwargs)
        else:
            def exported(*args: Any, **kwargs: Any) -> Any:
                if loaded:
                    return loaded[0](*args, **kwargs)
                if is_compiling():
                    return (hand_over() and self.handed[1][op])(*args, **kwargs)
                return load()(*args, **kwargs)

        exported.__name__ = exported.__qualname__ = op
        exported.__module__ = self.package
        return exported


def exported(package: str, module: str, name: str) -> Any:
    """``package.NAME``, a class or function exported as it is (manifest ``[exports]``), on first access: its host
    module bound here where it has a lean plan, else by the full runtime (``entry.exported``)."""
    state = PACKAGES.get(package)
    bound = state is not None and state.handed is None and state.module(module)
    if bound:
        return getattr(bound, name)
    if state is not None:
        return getattr(state.full().module(module), name)
    from .entry import exported as full_exported  # (the package went to the full runtime at import)

    return full_exported(package, module, name)


def ops_package(package: str, root: str) -> None:
    """``<package>._ops`` imported (under the package's lock): ``import <package>._ops.<mod> as m`` after a first call
    reads it (a module in sys.modules counts as imported with its parents). Made as the import system makes it, with
    no search and nothing run: the build writes its ``__init__.py`` empty."""
    name = f"{package}._ops"
    if name not in sys.modules:
        from importlib.util import module_from_spec, spec_from_file_location

        path = os.path.join(root, "_ops", "__init__.py")
        spec = spec_from_file_location(name, path, submodule_search_locations=[os.path.dirname(path)])
        sys.modules[name] = module = module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[package]._ops = module


class _LeanFinder:
    """``import <package>._ops.<module>``: handed to the full runtime's finder (which binds the host module, or
    finds the one bound here). Before a hand-over, the project modules that host modules bound here import
    (``<package>._ops._local.*``, shipped files) load here as the full runtime's finder loads them; a name there
    that is a host module's project name hands over."""

    def __init__(self, state: LeanPackage) -> None:
        self.state, self.prefix = state, f"{state.package}._ops."
        self.local = f"{self.prefix}_local"

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix):
            return None
        state = self.state
        if state.handed is None and state.builtins is not None:  # (a module bound here imports project modules)
            if fullname == self.local:
                return None  # the directory's own __init__, found by Python's path finder (as the full runtime)
            if fullname.startswith(self.local + "."):
                from .local_imports import host_module_imported_as, package_local_spec

                spec = package_local_spec(state, fullname)
                if spec is not None or host_module_imported_as(state, fullname) is None:
                    return spec
        state.full()
        return state.handed[2].find_spec(fullname, path, target)
