"""Which host modules bind cold handles (``cold``), and binding them: every kernel of the module plain, run with its
handles and a small ``triton`` (see ``cold``'s docstring), as ``host_modules.exec_host_module`` runs it.
``FORGE_NO_COLD=1`` turns cold handles off. Imports: stdlib, the C extension (``fastpath``), ``rules``, ``cold``."""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from . import fastpath
from .cold import ColdKernel, promoted
from .rules import HEURISTICS_HOOK, INDEX_FORMAT, KERNEL_SIDE_HOOK, cdiv, next_power_of_2, set_allocator

_NOT_PLAIN = ("pre_hooks", "grid_args", "pointer_ints", "launch_heuristics", "launch_flags",
              "call_heuristics")
"""Index entries of a kernel that only the full ``Kernel`` serves."""


def not_plain(spec: dict[str, Any]) -> str | None:
    """Why ``ColdKernel`` may not serve a kernel (its index entry), or None where it may: runtime parameters of types
    the C path reads, tuned meta-parameters, call-site constexprs and launch options (bound as ``Kernel._bind``
    binds them, see ``ColdKernel._bind``), nothing in ``_NOT_PLAIN``."""
    for k in _NOT_PLAIN:
        if spec.get(k):
            return k
    kinds = [t for _, t in spec["params"]]
    if "heuristic" in kinds:
        return "heuristics"
    runtime = [(n, t) for n, t in spec["params"] if t not in ("meta", "constexpr")]
    if not all(fastpath.kind(t) is not None and not t.startswith("tensordesc<") for _, t in runtime):
        return "parameter types only the full path reads"
    return None


def plain_kernel(spec: dict[str, Any]) -> bool:
    """Whether ``ColdKernel`` may serve a kernel (its index entry): see ``not_plain``."""
    return not_plain(spec) is None


def available() -> bool:
    """Whether cold handles may serve this process: the C extension is loaded, torch drives CUDA, not turned off."""
    if fastpath.c is None or os.environ.get("FORGE_NO_COLD", "") not in ("", "0"):
        return False
    import torch  # (imported already where an op was called; a module imported first may have none yet)

    return not getattr(torch.version, "hip", None)


def read_part(root: str, mod: str) -> dict[str, Any] | None:
    """A host module's part of the index as written (``_forge/modules/<mod>.json``), or None where the package
    has none or it is of another format."""
    try:
        with open(os.path.join(root, "_forge", "modules", f"{mod}.json"), "rb") as f:
            index = json.load(f)
    except (OSError, ValueError):  # missing or damaged: the full path reads it again and says which
        return None
    return index if index.get("format") == INDEX_FORMAT and index.get("split_targets") else None


def plain_module(index: dict[str, Any], mod: str) -> dict[str, tuple[str, dict[str, Any]]] | None:
    """The kernels (function → (name, index entry)) of a host module cold handles can bind, or None where the
    module or one of its kernels needs the full binding."""
    spec = index["modules"][mod]
    entries = {s["function"]: (name, s) for name, s in index["kernels"].items() if s.get("module", mod) == mod}
    if any(fn not in entries or not plain_kernel(entries[fn][1]) for fn in spec["kernels"]):
        return None
    return {fn: entries[fn] for fn in spec["kernels"]}


class _Triton(types.ModuleType):
    """``triton`` in a host module bound with cold handles: ``cdiv``, ``next_power_of_2`` and ``set_allocator`` here,
    anything else
    ``host_triton``'s, read from it on first use (PEP 562: a missing attribute only)."""

    def __init__(self) -> None:
        super().__init__("triton", "host-side helpers of Triton, provided by the forge-aot runtime")
        self.cdiv, self.next_power_of_2, self.set_allocator = cdiv, next_power_of_2, set_allocator
        self.__getattr__ = self._missing

    def _missing(self, name: str) -> Any:
        from .host_triton import host_triton

        value = getattr(host_triton, name)
        setattr(self, name, value)
        return value


_TRITON: list[_Triton] = []


def bind(package: str, root: str, mod: str, index: dict[str, Any], upgrade: Callable[[str], Any],
         builtins: dict[str, Any] | None = None, aliases: tuple[str, ...] = (),
         ) -> tuple[types.ModuleType, list[ColdKernel]] | None:
    """Run host module ``mod`` with cold handles for its kernels (``upgrade(name)``: what promotes one, see
    ``ColdKernel``), or None where it needs the full binding (``plain_module``); ``builtins``, ``aliases``: as
    ``host_modules.exec_host_module`` takes them."""
    kernels = plain_module(index, mod)
    if kernels is None:
        return None
    import importlib.util

    handles = {fn: ColdKernel(name, spec, index["targets"], root, mod, upgrade) for fn, (name, spec) in kernels.items()}
    filename = os.path.join(root, index["modules"][mod]["path"])
    module_name = f"{package}._ops.{mod}"
    spec = importlib.util.spec_from_file_location(module_name, filename)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    if not _TRITON:
        _TRITON.append(_Triton())

    def register_heuristics(function: str, values: Any, outermost: bool = False) -> None:
        if function in handles:  # (an index entry without heuristic parameters: the full handle reports it)
            promoted(handles[function]).add_heuristics(values, outermost)

    def kernel_side(name: str, module: str) -> Any:
        if name in handles:
            return handles[name]
        from .host_triton import KernelSide

        return KernelSide(name, module, filename)

    namespace = module.__dict__
    namespace.update(handles)
    namespace.update({"triton": _TRITON[0], HEURISTICS_HOOK: register_heuristics, KERNEL_SIDE_HOOK: kernel_side})
    if builtins is not None:  # project modules' import rules (local_imports)
        namespace["__builtins__"] = builtins
    if index["modules"][mod].get("package"):  # a kernel file inside a package: its relative imports' anchor
        namespace["__package__"] = f"{package}._ops._local.{index['modules'][mod]['package']}"
    names = (module_name, *aliases)
    for name in names:
        sys.modules[name] = module
    try:
        if index["modules"][mod].get("torch_compile"):
            from .host_modules import run_module_code

            run_module_code(spec.loader, module, True)
        else:
            exec(spec.loader.get_code(module_name), namespace)  # type: ignore[attr-defined]
    except BaseException:
        for name in names:
            if sys.modules.get(name) is module:
                del sys.modules[name]
        raise
    return module, list(handles.values())
