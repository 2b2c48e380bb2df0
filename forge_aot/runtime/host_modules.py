"""Host modules and the package entry point: run the shipped host code with its kernel handles bound."""

from __future__ import annotations

import json
import os
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .errors import ForgeRuntimeError
from .host_exec import bind_pre_hooks, host_file_module, run_host_file
from .host_triton import KernelSide, host_triton
from .rules import HEURISTICS_HOOK, INDEX_FORMAT, KERNEL_SIDE_HOOK


def exec_host_module(module_name: str, filename: str, kernels: dict[str, Any],
                     source: str | None = None, builtins: dict[str, Any] | None = None,
                     package: str | None = None, aliases: tuple[str, ...] = (),
                     compiles: bool = False) -> types.ModuleType:
    """Run a host-code module with its kernel handles and ``triton`` helpers bound before its first line.

    From the wheel the module is the packaged file; in development ``source`` is the same host code taken
    from the kernel file, compiled under the kernel file's name so tracebacks point at the author's lines.
    ``builtins``: the packaged code's import rules where it imports project modules (``local_builtins``);
    ``package``: the ``__package__`` its relative imports resolve against (a kernel file inside a package);
    ``aliases``: the other names project code imports this file by (its shipped name under ``_ops._local``), which
    are this module from before its first line, as a module importing itself back finds it; ``compiles``: the
    shipped code names ``torch.compile`` (see ``host_exec.run_module_code``).
    """
    if source is None:
        module = host_file_module(module_name, filename)
        if module is None:
            raise ForgeRuntimeError(f"cannot load host module {filename}")
        code = None
    else:
        module = types.ModuleType(module_name)
        module.__file__ = filename
        # dont_inherit: this module's `from __future__ import annotations` is not the host file's.
        code = compile(source, filename, "exec", dont_inherit=True)
    by_function = {getattr(k, "function", name): k for name, k in kernels.items()}

    def register_heuristics(function: str, values: dict[str, Callable[[dict[str, Any]], Any]],
                            outermost: bool = False) -> None:
        if function in by_function:  # else a kernel the package has no entry for (no shipped code launches it)
            by_function[function].add_heuristics(values, outermost)

    def kernel_side(name: str, module: str) -> Any:  # where the file defines a kernel (or other Triton code)
        return kernels[name] if name in kernels else KernelSide(name, module, filename)

    run_host_file(module, {**kernels, "triton": host_triton, HEURISTICS_HOOK: register_heuristics,
                           KERNEL_SIDE_HOOK: kernel_side}, builtins, package, aliases, compiles, code)
    bind_pre_hooks(module, filename, ((h, getattr(h, "spec", {}).get("pre_hooks", ())) for h in kernels.values()))
    return module


def load_index(root: str, module: str | None = None, read: dict[str, Any] | None = None) -> dict[str, Any]:
    """The package index; with ``module``, the part of it one host module needs (written by the build beside the
    index, so an op's first call parses only its own kernels, and of those only the variant, target and config
    it launches: see ``LazyJson``), or the whole index where there is none. ``read``: that part as already read
    from its file (``cold_binding.read_part``, for a module cold handles could not bind)."""
    path = os.path.join(root, "_forge", "index.json")
    part = read is not None or (module is not None
                                and os.path.exists(os.path.join(root, "_forge", "modules", f"{module}.json")))
    if read is not None:
        index = read
    else:
        if part:
            path = os.path.join(root, "_forge", "modules", f"{module}.json")
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    if index.get("format") != INDEX_FORMAT:
        raise ForgeRuntimeError(f"{root}: index format {index.get('format')} is not {INDEX_FORMAT}; reinstall "
                                "a package built by a matching forge-aot")
    if part and index.get("split_targets"):
        directory = os.path.join(root, "_forge", "modules", str(module))
        for spec in index["kernels"].values():
            for variant in spec["variants"].values():
                files = os.path.join(directory, variant["target_files"])
                variant["targets"] = {t: LazyJson(os.path.join(files, f"{t}.json"), _target_entry)
                                      for t in variant["targets"]}
    return index


class LazyJson(Mapping[str, Any]):
    """A JSON object of the index read from its own file on first access (keys, items or an item): a variant's
    target entry, a config's binaries. ``prepare`` runs once on what was read (under the lock)."""

    def __init__(self, path: str, prepare: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self._prepare = prepare
        self._data: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def _get(self) -> dict[str, Any]:
        data = self._data
        if data is None:
            with self._lock:
                data = self._data
                if data is None:
                    try:
                        with open(self.path, encoding="utf-8") as f:
                            data = json.load(f)
                    except (OSError, ValueError) as exc:
                        raise ForgeRuntimeError(f"{self.path}: cannot read this part of the package index ({exc}); "
                                                "reinstall the package") from None
                    if self._prepare is not None:
                        self._prepare(os.path.dirname(self.path), data)
                    self._data = data
        return data

    def __getitem__(self, name: str) -> Any:
        return self._get()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    @property
    def loaded(self) -> bool:
        """Whether the file has been read."""
        return self._data is not None


def _target_entry(directory: str, entry: dict[str, Any]) -> None:
    """A target entry just read: each config's binaries from their own file, when first needed."""
    for config in entry["configs"].values():
        name = config.pop("binaries_file", None)
        if name is not None:
            config["binaries"] = LazyJson(os.path.join(directory, name))


def bind_module(module_name: str, index: dict[str, Any], mod_name: str, backend: Any, kernel_class: Any,
                source: tuple[str, str | None], builtins: dict[str, Any] | None = None,
                package_prefix: str = "", aliases: tuple[str, ...] = ()) -> types.ModuleType:
    """Create the kernel handles of one host module and run it (``source``: filename, text or None to read
    the file; ``builtins``, ``aliases``: see ``exec_host_module``). A kernel file inside a package runs with that
    package (the index's ``package``) after ``package_prefix``: the packaged copies' place in a wheel."""
    # (two kernel files may each define a kernel of the same name: each module binds its own)
    specs = {spec["function"]: (name, spec) for name, spec in index["kernels"].items()
             if spec.get("module", mod_name) == mod_name}
    bound = {}
    for fn in index["modules"][mod_name]["kernels"]:
        name, spec = specs[fn]
        bound[fn] = kernel_class(name, spec, index["targets"], backend)
    package = index["modules"][mod_name].get("package")
    return exec_host_module(module_name, source[0], bound, source[1], builtins,
                            package_prefix + package if package else None, aliases,
                            bool(index["modules"][mod_name].get("torch_compile")))


def op_table(modules: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """op → (host module, schema or None[, (setup_context, backward) or None[, result rule[, left out[, what
    the schema takes: (positional count, names), where the host function's *args/**kwargs are left out[, the host
    function, where the op's name is another (``host_name``)]]]]])
    from an index's ``modules``: the table the build writes into a generated ``__init__`` and that
    ``register_custom_ops`` reads (the rule, schema.ResultRule as a tuple, where an argument selects the result's
    structure; the arguments the schema leaves out, ((name, position), ...): ``exports.custom_call``)."""
    def extra(spec: dict[str, Any], op: str) -> tuple[Any, ...]:
        ag, r, b = spec.get("autograd", {}).get(op), spec.get("results", {}).get(op), spec.get("buffers", {}).get(op)
        rule = r and (r["argument"], r["position"], r["default"], tuple(map(tuple, r["arities"])), r["width"],
                      r.get("fill", False))
        takes = spec.get("takes", {}).get(op)
        items = [ag and tuple(ag), rule, b and tuple(map(tuple, b)), takes and (takes[0], tuple(takes[1])),
                 op if op in spec.get("export_as", {}) else None]
        while items and not items[-1]:
            items.pop()
        return tuple(items)

    return {spec.get("export_as", {}).get(op, op): (mod, spec.get("schemas", {}).get(op) or None, *extra(spec, op))
            for mod, spec in sorted(modules.items()) for op in spec["ops"]}
