"""Host modules and the package entry point: run the shipped host code with its kernel handles bound."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from .entry import LIBRARIES
from .errors import ForgeRuntimeError
from .host_triton import host_triton
from .kernel import Kernel, call_without_launches
from .tables import HEURISTICS_HOOK

INDEX_FORMAT = 2
"""Version of ``_forge/index.json``; a package refuses an index of another format."""



def exec_host_module(module_name: str, filename: str, kernels: dict[str, Any],
                     source: str | None = None) -> types.ModuleType:
    """Run a host-code module with its kernel handles and ``triton`` helpers bound before its first line.

    From the wheel the module is the packaged file; in development ``source`` is the same host code taken
    from the kernel file, compiled under the kernel file's name so tracebacks point at the author's lines.
    """
    if source is None:
        spec = importlib.util.spec_from_file_location(module_name, filename)
        if spec is None or spec.loader is None:
            raise ForgeRuntimeError(f"cannot load host module {filename}")
        module = importlib.util.module_from_spec(spec)
    else:
        module = types.ModuleType(module_name)
        module.__file__ = filename
    by_function = {getattr(k, "function", name): k for name, k in kernels.items()}

    def register_heuristics(function: str, values: dict[str, Callable[[dict[str, Any]], Any]]) -> None:
        by_function[function].add_heuristics(values)

    module.__dict__.update(kernels)
    module.__dict__["triton"] = host_triton
    module.__dict__[HEURISTICS_HOOK] = register_heuristics
    sys.modules[module_name] = module
    try:
        if source is None:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    for handle in kernels.values():
        for hook in getattr(handle, "spec", {}).get("pre_hooks", []):
            fn = module.__dict__.get(hook)
            if not callable(fn):
                raise ForgeRuntimeError(f"{filename}: config pre-hook '{hook}' of {handle.function} is not a "
                                        "function of the host module")
            handle.pre_hooks[hook] = fn
    return module


def load_index(root: str, module: str | None = None) -> dict[str, Any]:
    """The package index; with ``module``, the part of it one host module needs (written by the build beside the
    index, so an op's first call parses only its own kernels), or the whole index where there is none."""
    path = os.path.join(root, "_forge", "index.json")
    if module is not None and os.path.exists(os.path.join(root, "_forge", "modules", f"{module}.json")):
        path = os.path.join(root, "_forge", "modules", f"{module}.json")
    with open(path, encoding="utf-8") as f:
        index = json.load(f)
    if index.get("format") != INDEX_FORMAT:
        raise ForgeRuntimeError(f"{root}: index format {index.get('format')} is not {INDEX_FORMAT}; reinstall "
                                "a package built by a matching forge-aot")
    return index


def bind_module(module_name: str, index: dict[str, Any], mod_name: str, backend: Any, kernel_class: Any,
                source: tuple[str, str | None]) -> types.ModuleType:
    """Create the kernel handles of one host module and run it (``source``: filename, text or None to read
    the file)."""
    specs = {spec["function"]: (name, spec) for name, spec in index["kernels"].items()}
    bound = {}
    for fn in index["modules"][mod_name]["kernels"]:
        name, spec = specs[fn]
        bound[fn] = kernel_class(name, spec, index["targets"], backend)
    return exec_host_module(module_name, source[0], bound, source[1])


def bind_ops(package: str, index: dict[str, Any], backend: Any,
             sources: dict[str, tuple[str, str | None]]) -> dict[str, Callable[..., Any]]:
    """Run every host module with its kernel handles; returns the exported ops by name.

    ``sources`` maps each host module to (filename, source or None to read the file).
    """
    ops: dict[str, Callable[..., Any]] = {}
    for mod_name, mod in sorted(index["modules"].items()):
        module = bind_module(f"{package}._ops.{mod_name}", index, mod_name, backend, Kernel, sources[mod_name])
        for op in mod["ops"]:
            ops[op] = getattr(module, op)
    return ops


def _fake(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A custom op's fake (meta) implementation: the op's own host code on meta tensors, kernel launches skipped,
    so output shapes, dtypes and strides are exactly those the real call allocates."""

    def fake(*args: Any, **kwargs: Any) -> Any:
        return call_without_launches(fn, *args, **kwargs)

    return fake


def _dispatching(fn: Callable[..., Any], torch_op: Any, is_compiling: Callable[[], bool]) -> Callable[..., Any]:
    """The exported op: the host function itself in eager code (the fast path), the registered custom op while
    torch.compile or torch.export trace, so they see one opaque op instead of the host code."""

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return torch_op(*args, **kwargs)
        return fn(*args, **kwargs)

    return op


def register_torch_ops(package: str, index: dict[str, Any],
                       ops: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Register every op that has a schema as ``torch.ops.<package>.<op>`` (real implementation: the host code;
    meta: the host code with launches skipped) and return the exported callables."""
    import torch

    schemas = {op: s for m in index["modules"].values() for op, s in m.get("schemas", {}).items() if op in ops}
    if not schemas:
        return ops
    lib = torch.library.Library(package, "FRAGMENT")
    LIBRARIES.append(lib)
    namespace = getattr(torch.ops, package)
    out = dict(ops)
    for op, schema in sorted(schemas.items()):
        try:
            lib.define(f"{op}{schema}")
        except RuntimeError:
            continue  # defined by an earlier import of this package in the process: keep that one
        lib.impl(op, ops[op], "CompositeExplicitAutograd")
        # A Meta kernel serves fake tensors too (FakeTensorMode runs it on meta tensors), and registering one
        # costs a tenth of torch.library.register_fake, which reads the caller's source file: import stays fast.
        lib.impl(op, _fake(ops[op]), "Meta")
        out[op] = _dispatching(ops[op], getattr(namespace, op), torch.compiler.is_compiling)
    return out


def load_package(package: str, root: str) -> tuple[dict[str, Callable[..., Any]], Callable[..., int]]:
    """Entry point of a generated package (see entry.load_package: host code bound on first use)."""
    from .entry import load_package as lazy

    return lazy(package, root)
