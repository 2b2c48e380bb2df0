"""Lean handles (see ``lean``): binding a host module with ``LeanKernel`` handles (``bind``); a handle's first calls
are resolved and launched by ``lean_launch``; anything else makes the handle a ``ColdKernel`` in place, after the
full runtime took the package over. Imports: stdlib, ``basics``, ``host_values``, ``lean_launch`` (torch, the C
extension where called; ``host_exec`` for modules importing project modules or binding pre-hooks).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import types
from typing import Any

from .basics import HEURISTICS_HOOK, KERNEL_SIDE_HOOK, LAUNCHES, c_driver, extension, fast_kernel
from .host_values import small_triton
from .lean import ops_package
from .lean_launch import _MISS, AfterHook, Lean, LeanLaunched
from .selection import named_args


def read_part(state: Any, mod: str) -> dict[str, Any] | None:
    """Host module ``mod``'s part of the index where it has a lean plan and this process can serve it (the C extension
    and the driver are there), else None; with what its binding needs first, as ``entry.Package.module`` does it
    (outside the package's lock: a thread running a package ``__init__`` that imports the file back waits for that
    lock): the package's import rules for its project modules, then the parent packages of the names project code
    imports the file by (an ``__init__`` importing it back binds it there)."""
    try:
        with open(os.path.join(state.root, "_forge", "modules", f"{mod}.json"), "rb") as f:
            part = json.load(f)
    except (OSError, ValueError):  # the full path reads it again and says what is wrong
        return None
    if part.get("lean") is None or extension() is None or c_driver() is None:  # (an empty plan: no kernel in it)
        return None
    spec = part["modules"][mod]
    if spec.get("imported_as"):
        import importlib

        from .local_imports import import_rules

        with state.lock:
            ops_package(state.package, state.root)
        import_rules(state, spec.get("local_modules", ()))
        for name in spec["imported_as"]:
            importlib.import_module(f"{state.package}._ops._local.{name}".rpartition(".")[0])
    return part


def bind(state: Any, mod: str, part: dict[str, Any]) -> types.ModuleType | None:
    """Run host module ``mod`` with lean handles (``part``: ``read_part``'s, under the package's lock), or None where
    the file cannot be loaded."""
    plan, c = part["lean"], extension()
    spec = part["modules"][mod]
    ops_package(state.package, state.root)
    aliases = tuple(f"{state.package}._ops._local.{n}" for n in spec.get("imported_as", ()))
    cls = _handle_class(c)
    handles = {fn: cls(state, mod, part, name, kplan) for fn, (name, kplan) in plan.items()}
    name = f"{state.package}._ops.{mod}"
    from importlib.util import module_from_spec, spec_from_file_location

    filename = os.path.join(state.root, spec["path"])
    module_spec = spec_from_file_location(name, filename)
    if module_spec is None or module_spec.loader is None:
        return None
    module = module_from_spec(module_spec)

    def side(fn: str, of: str) -> Any:  # where the file defines a kernel (or other Triton code)
        if fn in handles:
            return handles[fn]
        from .host_exec import kernel_side

        return kernel_side(fn, of, filename)

    def heuristics(function: str, values: Any, outermost: bool = False) -> None:  # @triton.heuristics
        if function in handles:
            handles[function].add_heuristics(values, outermost)

    bound = {**handles, "triton": small_triton(), HEURISTICS_HOOK: heuristics, KERNEL_SIDE_HOOK: side}
    package = f"{state.package}._ops._local.{spec['package']}" if spec.get("package") else None
    if spec.get("local_modules") or spec.get("torch_compile") or aliases:
        # The file imports project modules (Liger's ``from ligerlike.ops.utils import calculate_settings``, relative
        # imports too), names torch.compile or is imported by its project name: run as the cold and full bindings
        # run it, its imports under the package's import rules (``local_imports``; ``_LeanFinder`` loads those
        # modules until a hand-over, kernel files imported by their project names bound here too)
        from .host_exec import run_host_file
        from .local_imports import import_rules

        builtins = import_rules(state, spec["local_modules"]) if spec.get("local_modules") else None
        run_host_file(module, bound, builtins, package, aliases, bool(spec.get("torch_compile")))
    else:  # (the same, without loading host_exec: the plain module's first call loads nothing more)
        module.__dict__.update(bound)
        if package:  # (with no project modules, no relative import reads it)
            module.__dict__["__package__"] = package
        sys.modules[name] = module
        try:
            exec(module_spec.loader.get_code(name), module.__dict__)  # type: ignore[attr-defined]
        except BaseException:
            if sys.modules.get(name) is module:
                del sys.modules[name]
            raise
    hooks = [(h, part["kernels"][h.name].get("pre_hooks", ())) for h in handles.values()]
    if any(names for _, names in hooks):  # triton.Config(pre_hook=...): functions of the module, by name
        from .host_exec import bind_pre_hooks

        bind_pre_hooks(module, filename, hooks)
    state.kernels.extend(handles.values())
    return module


@functools.cache
def _handle_class(c: Any) -> type:
    """``LeanKernel``, on the extension's ``KernelBase`` (the C path reads its calls as a full handle's)."""

    class LeanKernel(c.KernelBase):  # type: ignore[misc,name-defined]
        """A kernel handle of a lean-bound host module, until anything but a plain first call needs more: then a
        ``ColdKernel`` in place (the same object: host code keeps its reference), and so on to a full ``Kernel``."""

        def __init__(self, state: Any, mod: str, part: dict[str, Any], name: str,
                     plan: dict[str, Any]) -> None:
            self.name, self.function = name, part["kernels"][name]["function"]
            self.pre_hooks: dict[str, Any] = {}  # (bound after the host file ran; the C path reads them here too)
            self._lean = Lean(state, mod, part, name, plan)
            self._set_fast(_fast_kernel(c, plan, ()))

        def add_heuristics(self, values: dict[str, Any], outermost: bool = False) -> None:
            """As ``Kernel.add_heuristics``; the C path calls them too (a name that is no heuristic parameter: the
            full handle reports it)."""
            lean = self.__dict__.get("_lean")
            if lean is None or any(n not in lean.plan["reading"]["heuristic_names"] for n in values):
                return self._promoted().add_heuristics(values, outermost)
            lean.heuristics = [*values.items(), *lean.heuristics] if outermost else [*lean.heuristics, *values.items()]
            self._set_fast(_fast_kernel(c, lean.plan, lean.heuristics))

        def named_args(self, runtime: Any, call: dict[str, Any], config: Any) -> dict[str, Any]:
            """As ``Kernel.named_args`` (the C path's, for a grid function reading an argument by name)."""
            return named_args(self._lean.plan["reading"]["runtime_names"], runtime, call, config)

        def __repr__(self) -> str:
            builds = list(self._lean.part["kernels"][self.name]["variants"])
            return f"<forge-aot kernel {self.name} ({self.function}), builds: {builds}>"

        def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            lean = self.__dict__.get("_lean")
            if lean is not None and LAUNCHES.skip is False:
                try:
                    result = lean.launch(self, grid, args, kwargs)
                except AfterHook as exc:  # (the grid function's error after the pre-hook ran: the caller's)
                    raise exc.__cause__ from None  # type: ignore[misc]
                except (OSError, ValueError, LookupError, TypeError, AttributeError, OverflowError):
                    result = _MISS  # raised before any launch: the cold or full path serves it and says what is wrong
                if result is not _MISS:
                    return result
            return self._promoted().run(grid, args, kwargs)

        def __getattr__(self, name: str) -> Any:  # what a lean handle lacks: a cold one's (which promotes further)
            if "_lean" not in self.__dict__ or name.startswith("__"):
                raise AttributeError(name)
            return getattr(self._promoted(), name)

        def _promoted(self) -> Any:
            """This handle, made a ``ColdKernel`` in place (once; its binaries load again there, as the full
            path's own): the full runtime takes the package over first."""
            lean = self.__dict__.get("_lean")
            if lean is None:
                return self
            full = lean.state.full()
            with lean.state.lock:
                if "_lean" not in self.__dict__:  # (another thread did)
                    return self
                from .cold import ColdKernel

                last = self._fast.last if self._fast is not None else None
                name, mod, part, hooks = self.name, lean.mod, lean.part, self.pre_hooks
                self.__dict__.clear()
                self.__class__ = ColdKernel
                ColdKernel.__init__(self, name, part["kernels"][name], part["targets"], lean.state.root, mod,
                                    lambda n: full._upgrade(mod, n), hooks)  # (pre-hooks bound from the module)
                if lean.heuristics:  # registered on the lean handle: the cold one calls them as it would have
                    from .fastpath import plan

                    self.heuristics = list(lean.heuristics)
                    self._set_fast(plan(self))
                if isinstance(last, LeanLaunched):  # (best_config: the config the latest launch ran)
                    self._cold.last = last.cold()
            return self

    return LeanKernel


def _fast_kernel(c: Any, plan: dict[str, Any], heuristics: Any) -> Any:
    """The C reading (``FastKernel``) of a lean handle's calls from the plan's ``reading``, as ``fastpath.plan`` makes
    it: with the heuristics registered so far ((name, function) pairs, in calling order)."""
    r, defaults = plan["reading"], dict(plan["defaults"])  # (a name without a default: a call must pass it)
    return fast_kernel(c, r, tuple(defaults.get(n, _MISS) for n in r["names"]), _MISS, heuristics, plan["ignored"])
