"""Which host modules bind cold handles (``cold``), and binding them: every kernel of the module plain, run with its
handles and a small ``triton`` (``host_values.SmallTriton``), through ``host_exec`` as ``host_modules.exec_host_module``
runs it. ``FORGE_NO_COLD=1`` turns cold handles off. Imports: stdlib, the C extension (``fastpath``), ``rules``,
``cold``, ``host_exec``."""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Collection
from typing import Any

from . import fastpath
from .cold import ColdKernel
from .host_exec import bind_pre_hooks, host_file_module, kernel_side, run_host_file, small_triton
from .rules import (
    HEURISTICS_HOOK,
    INDEX_FORMAT,
    KERNEL_SIDE_HOOK,
    call_defaults,
    ignored_options,
    launch_attrs,
    read_params,
)

_NOT_PLAIN = ("grid_args",)
"""Index entries of a kernel that only the full ``Kernel`` serves."""


def not_plain(spec: dict[str, Any]) -> str | None:
    """Why ``ColdKernel`` may not serve a kernel (its index entry), or None where it may: runtime parameters of types
    the C path reads, tuned meta-parameters, call-site constexprs and launch options (bound as ``Kernel._bind``
    binds them, see ``ColdKernel._bind``), heuristic parameters (``@triton.heuristics``, ``ColdKernel.add_heuristics``;
    also where a call passes them, as Unsloth's do) and launch options they compute (gsplat's ``num_warps``), launch
    attributes, config pre-hooks, integers passed to pointer parameters typed ``*i32|i32``, nothing in
    ``_NOT_PLAIN``."""
    for k in _NOT_PLAIN:
        if spec.get(k):
            return k
    runtime = [(n, t) for n, t in spec["params"] if t not in ("meta", "constexpr", "heuristic")]
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


def bind(package: str, root: str, mod: str, index: dict[str, Any], upgrade: Callable[[str], Any],
         builtins: dict[str, Any] | None = None, aliases: tuple[str, ...] = (),
         ) -> tuple[types.ModuleType, list[ColdKernel]] | None:
    """Run host module ``mod`` with cold handles for its kernels (``upgrade(name)``: what promotes one, see
    ``ColdKernel``), or None where it needs the full binding (``plain_module``); ``builtins``, ``aliases``: as
    ``host_modules.exec_host_module`` takes them."""
    kernels = plain_module(index, mod)
    if kernels is None:
        return None
    handles = {fn: ColdKernel(name, spec, index["targets"], root, mod, upgrade) for fn, (name, spec) in kernels.items()}
    filename = os.path.join(root, index["modules"][mod]["path"])
    module = host_file_module(f"{package}._ops.{mod}", filename)
    if module is None:
        return None

    def register_heuristics(function: str, values: Any, outermost: bool = False) -> None:
        if function in handles:  # (a name no heuristic parameter has: the full handle reports it)
            handles[function].add_heuristics(values, outermost)

    def side(name: str, of: str) -> Any:  # where the file defines a kernel (or other Triton code)
        return handles[name] if name in handles else kernel_side(name, of, filename)

    spec = index["modules"][mod]
    run_host_file(module, {**handles, "triton": small_triton(), HEURISTICS_HOOK: register_heuristics,
                           KERNEL_SIDE_HOOK: side}, builtins,
                  f"{package}._ops._local.{spec['package']}" if spec.get("package") else None,  # relative imports
                  aliases, bool(spec.get("torch_compile")))
    bind_pre_hooks(module, filename, ((handles[fn], s.get("pre_hooks", ())) for fn, (_, s) in kernels.items()))
    return module, list(handles.values())


def lean_plans(part: dict[str, Any], without: Collection[str] = (),
               ) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
    """Each host module's lean plan (``lean.py``; ``part``: the package's index, or the modules and kernels of it),
    as (plan, None), or (None, why not): where a lean handle cannot serve one of its kernels, or where a kernel file it
    imports by its project name (``imported_as``; a package above one: ``imports_host``) has none (``without``: the
    modules given none for another reason), since that import would hand the package over in the middle of its
    binding. Kernels are read as the C path (``fastpath.reading``) and the cold handles (``rules.read_params``) read
    them. A plan, per kernel function: [index name, {reading, n, device_pos, declared, type_vars, axes, key, params,
    runtime_first, defaults, ignored, required, flags}]: ``axes`` the variant axes in order (type variables,
    call-site constexprs, launch options), ``key`` where each key value comes from ([true, runtime position] or
    [false, call-site name]), ``defaults`` the value ``Kernel._bind`` gives each call-site name (``reading``'s
    ``names``) a call leaves out, as [name, value] (``required``: the constexprs without a default, which a call must
    pass), ``ignored`` the launch options a call may pass at their default (``rules.ignored_options``), ``flags``
    the launch attributes a call may ask for, as [name, bit] (``rules.launch_attrs``). A module whose file defines
    no kernel gets an empty plan."""
    out = {mod: (None, "given none by the caller") if mod in without else _lean(part, mod) for mod in part["modules"]}
    blocked = {mod for mod, (plan, _) in out.items() if plan is None}
    # Kernel files imported by their project names: the lean path binds them too (local_imports.lean_local_spec),
    # so a module importing one without a plan has none (spread to its own importers, once per module)
    by_name = {name: m for m, s in part["modules"].items() for name in s.get("imported_as", ())}
    deps = {m: ({by_name[n] for n in s.get("local_modules", ()) if n in by_name} | set(s.get("imports_host", ())))
            - {m} for m, s in part["modules"].items()}
    while grown := {m for m, d in deps.items() if m not in blocked and d & blocked}:
        blocked |= grown
        out.update((m, (None, "imports a kernel file with no lean plan by its project name")) for m in grown)
    return out


def lean_plan(part: dict[str, Any], mod: str, without: Collection[str] = ()) -> dict[str, Any] | None:
    """Host module ``mod``'s lean plan, or None (see ``lean_plans``)."""
    return lean_plans(part, without)[mod][0]


def lean_blocker(part: dict[str, Any], mod: str, without: Collection[str] = ()) -> str | None:
    """Why host module ``mod`` gets no lean plan (``lean_plans``; ``scripts/census_cold.py`` counts them), or None."""
    return lean_plans(part, without)[mod][1]


def _lean(part: dict[str, Any], mod: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the plan of ``mod``'s own kernels, None) or (None, why not), its imports aside (see ``lean_plans``)."""
    spec = part["modules"][mod]
    out: dict[str, Any] = {}
    by_function = {s["function"]: (name, s) for name, s in part["kernels"].items() if s.get("module", mod) == mod}
    for fn in spec["kernels"]:
        if fn not in by_function:
            return None, f"kernel {fn}: no index entry"
        name, kspec = by_function[fn]
        kernel = types.SimpleNamespace()
        read_params(kernel, kspec)
        # (call-site constexprs, launch options and flags, heuristics, pre-hooks and integers passed to pointers are
        # served; the rest are the cold handles')
        for why, blocks in (("descriptors", kernel.desc_pos), ("grid arguments", kernel.grid_args)):
            if blocks:
                return None, why
        tv_names = [tv for tv, _ in kernel.type_vars]
        if kernel.axes != [*tv_names, *(a for a in kernel.axes if a in kernel.call_names)]:
            return None, "an axis neither a type variable nor a call-site value"  # (the full path's)
        r = fastpath.reading(kernel)
        # (every call-site value selects the build, or is a heuristic's input: Unsloth's DO_SOFTCAPPING=...)
        if r is None or not set(r["names"]) - {*kernel.call_heuristics, *kernel.launch_flags} <= set(kernel.axes):
            return None, ("a call-site value that selects no build" if r is not None
                          else "parameter types the C path does not read")
        device_pos = list(kernel.device_pos)
        declared = [kernel.runtime[i][1][1:] for i in device_pos]
        # a type variable's dtype: its first tensor's, that is, the first pointer of its source's type
        type_vars = [[tv, next(j for j, i in enumerate(device_pos) if kernel.runtime[i][1] == kernel.runtime[src][1])]
                     for tv, src in kernel.type_vars]
        defaults, required = call_defaults(kernel)
        r = {**r, "kinds": list(r["kinds"]), "pointer_int_kinds": list(r["pointer_int_kinds"])}  # (JSON)
        out[fn] = [name, {"reading": r,
                          "n": kernel.n_runtime, "device_pos": device_pos, "declared": declared,
                          "type_vars": type_vars, "axes": kernel.axes,
                          "key": [[is_rt, src] for is_rt, src in kernel.key_sources],
                          "params": kernel.param_names, "runtime_first": kernel._runtime_first,
                          "defaults": [list(d) for d in defaults], "ignored": ignored_options(kernel.launch_axes),
                          "required": required, "flags": [[f, launch_attrs({f: True})] for f in kernel.launch_flags]}]
    return out, None
