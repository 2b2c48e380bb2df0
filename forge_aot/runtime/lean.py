"""``import <package>`` and the first calls of its simplest ops, with no other runtime module loaded.

Loading the runtime's modules, not the first call's work, took most of a fresh process's import + first call (session
57), so the package's ``__init__`` imports this module alone. It defines the exported ops and ``torch.ops.<package>``
(custom ops defined on first need) and serves an op's first call itself where the build wrote a *lean plan* for its
host module (``_forge/modules/<module>.json``'s ``lean``, see ``cold_binding.lean_plan``; the package's ``__init__``
names those modules): its kernels take runtime arguments, call-site values (``BLOCK_SIZE=``, ``num_warps=``), launch
flags, ``@triton.heuristics``, config pre-hooks and integers passed to pointer parameters (``*i32|i32``), no
descriptors; kernel files it imports by their project names have plans too. Project modules it imports load under
the package's import rules (``local_imports``); in a package routing ops by name (autograd, ``[exports]``) its ops'
globals are routed as the full runtime routes them (``torch_ops.route_in_module``). The module runs with
``LeanKernel`` handles: a call the C path has not seen comes to ``LeanKernel.run``, bound as ``Kernel._bind`` binds it
(``lean_launch.bind_call``), resolved as ``ColdKernel._resolve`` resolves it, its binary loaded (sha256 checked)
through the C ``Driver``, launched through a C ``Launcher`` and registered with the C path.

Everything else hands over to the full runtime (``LeanPackage.full``: ``entry.adopt``), once, binding nothing twice:
the full ``Package`` adopts the modules bound here, their handles and import rules; a handle asked what a lean handle
does not serve (keywords it does not bind, ``LAUNCHES.skip``, another dtype, an attribute such as ``warmup``, a bad
checksum: the full path reports it) becomes a ``ColdKernel`` in place, then a full ``Kernel``. Handed over:
``torch.compile``/``torch.export`` tracing an op, ``preload``, ``import <package>._ops.<module>``, ROCm, no C
extension, ``FORGE_NO_LEAN=1`` (or ``FORGE_NO_COLD``/``FORGE_NO_C_LAUNCH``).

This module: the package entry; ``lean_kernel``: binding a host module with lean handles; ``lean_launch``: their first
calls; ``basics``: what every path reads alike. Imports: stdlib, ``basics`` (torch where called).
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
"""The build's sha256 of the runtime's sources (the package's ``__init__``'s): the bundle is used only if for them."""


def full_runtime() -> None:
    """The full runtime's modules served from the bytecode bundle from now on, where valid (the lean path's: not)."""
    if FINGERPRINT is not None:
        from .bundle import use_bundle

        use_bundle(FINGERPRINT)

# -- the exported ops and torch.ops.<package> -----------------------------------------------------------------

def host_name(op: str, spec: tuple[Any, ...]) -> str:
    """The host function of an op (the op table entry's last item: ``[ops.NAME] function``, see ``op_table``)."""
    return spec[6] if len(spec) > 6 and spec[6] else op


def applied_function(fn: Any) -> type | None:
    """The ``torch.autograd.Function`` whose ``apply`` ``fn`` is (tutorial 05's ``LayerNorm.apply``), else None."""
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
    """A package's custom ops, defined once by ``define()`` from any thread (the defining thread sees them so far)."""

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
    """The ops of ``ops`` that are custom ops (a schema), and what defines them now: ``torch.ops.<namespace>`` defines
    them on first need where it can be put in place, else here (``function``, ``host_attr``: see ``custom_ops``)."""
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
    see FINGERPRINT; ``lean_modules``: the host modules with a lean plan, None: unknown): its exported ops and
    ``preload``. Lean where it may serve and some module has a lean plan, else ``entry.load_package``'s."""
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
    """Whether lean first calls may serve: the C extension is there, torch drives CUDA, no ``FORGE_NO_*`` is set."""
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
        self.lean_modules = None if lean_modules is None else frozenset(lean_modules)  # (the others hand over)
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
        # as ``entry.Package``'s, which adopts them: ops routed by name, project modules' import rules
        self.routed: dict[str, bool] = {}
        self.local_tops: set[str] = set()
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
        if module is None and self.handed is None and (self.lean_modules is None or mod in self.lean_modules):
            from .lean_kernel import bind, read_part

            part = read_part(self, mod)  # (outside the lock: it may import the file's project packages)
            with self.lock:
                module = self.modules.get(mod)
                if module is None and self.handed is None and part is not None:
                    module = bind(self, mod, part)
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


def ops_package(package: str, root: str) -> None:
    """``<package>._ops`` imported (under the package's lock; ``import <package>._ops.<mod> as m`` reads it), made as
    the import system makes it, with no search and nothing run (the build writes its ``__init__.py`` empty)."""
    name = f"{package}._ops"
    if name not in sys.modules:
        from importlib.util import module_from_spec, spec_from_file_location

        path = os.path.join(root, "_ops", "__init__.py")
        spec = spec_from_file_location(name, path, submodule_search_locations=[os.path.dirname(path)])
        sys.modules[name] = module = module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[package]._ops = module


class _LeanFinder:
    """``import <package>._ops.<module>``: handed to the full runtime's finder (which binds the host module, or
    finds the one bound here); before a hand-over, project modules load here (``local_imports.lean_local_spec``)."""

    def __init__(self, state: LeanPackage) -> None:
        self.state, self.prefix = state, f"{state.package}._ops."

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix):
            return None
        state = self.state
        if state.handed is None:  # (project modules, kernel files by their project names: lean_local_spec)
            from .local_imports import lean_local_spec

            found = lean_local_spec(state, fullname)
            if found is not False:
                return found
        state.full()
        return state.handed[2].find_spec(fullname, path, target)
