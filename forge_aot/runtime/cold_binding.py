"""Which host modules bind cold handles (``cold``), and binding them: every kernel of the module plain, its binding
needing nothing more than its handles and a small ``triton`` (see ``cold``'s docstring). ``FORGE_NO_COLD=1`` turns
cold handles off. Imports: stdlib, the C extension (``fastpath``), ``rules``, ``cold``."""

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


def plain_kernel(spec: dict[str, Any]) -> bool:
    """Whether ``ColdKernel`` may serve a kernel (its index entry): see the module's docstring."""
    if any(spec.get(k) for k in _NOT_PLAIN):
        return False
    kinds = [t for _, t in spec["params"]]
    n = sum(t not in ("meta", "constexpr", "heuristic") for t in kinds)
    if any(t != "meta" for t in kinds[n:]):
        return False  # call-site constexprs or heuristics, or tuned parameters before runtime ones
    names = {p[0] for p in spec["params"][:n]}
    return all(fastpath.kind(t) is not None and not t.startswith("tensordesc<") for t in kinds[:n]) \
        and all(a in spec["dtype_args"] for a in spec["axes"]) and all(k in names for k in spec["key"])


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
    if spec.get("local_modules") or spec.get("imported_as") or spec.get("torch_compile"):
        return None
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
         ) -> tuple[types.ModuleType, list[ColdKernel]] | None:
    """Run host module ``mod`` with cold handles for its kernels (``upgrade(name)``: what promotes one, see
    ``ColdKernel``), or None where it needs the full binding (``plain_module``)."""
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
    if index["modules"][mod].get("package"):  # a kernel file inside a package: its relative imports' anchor
        namespace["__package__"] = f"{package}._ops._local.{index['modules'][mod]['package']}"
    sys.modules[module_name] = module
    try:
        exec(spec.loader.get_code(module_name), namespace)  # type: ignore[attr-defined]
    except BaseException:
        if sys.modules.get(module_name) is module:
            del sys.modules[module_name]
        raise
    return module, list(handles.values())
