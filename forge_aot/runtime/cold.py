"""The first calls of plain kernels, without the rest of the runtime.

An op's first call in a fresh process used to load the whole runtime (binding, tables, constraints, heuristics,
descriptors, the ctypes launcher: about 200 KB of bytecode) before its first launch. A *plain* kernel needs none of
that (``cold_binding.not_plain``): runtime arguments passed by position, tuned meta-parameters from the table,
call-site constexprs and launch options (host code choosing ``BLOCK_SIZE`` and ``num_warps``) bound as
``Kernel._bind`` binds them, ``@triton.heuristics`` of constexpr parameters (called as ``Kernel.run`` calls them;
the C path calls them too, and hands values it has not seen back: ``cold_launch.new_heuristic_values``), config
pre-hooks (run after the heuristics, before the launch, as ``Kernel.run`` runs them; the C path too), integers
passed to pointer parameters typed ``*i32|i32`` (flash-attn's rotary offsets), no descriptors or grid arguments,
on CUDA (launch attributes, ``launch_pdl=`` and
``launch_cooperative_grid=``, are read per call as the full path reads them). ``ColdKernel`` serves it:
the C extension reads its calls (``FastKernel``) as it reads a full ``Kernel``'s; a call the C path has not seen
comes to ``ColdKernel.run``, which resolves it from the index with the shared ``rules`` (the variant from the dtypes
and call-site values, the target from the capability, the nearest table row whose config fits, the binary of its
heuristic values, the most specialized that fits), loads the binary (sha256 checked) through the driver's C calls
(``cold_launch``), launches it through its C ``Launcher`` and lets the C path launch such calls from then on.

Anything else promotes the handle in place to a full ``Kernel`` (the same object, so host code keeps its
reference), which then serves every call as before: keywords of other parameters or options, a call the C path
cannot read (a CPU tensor, another dtype, an integer out of range: the full path reports it), call-site values
that were not built, ``LAUNCHES.skip`` (custom ops' tracing, guards), a binary or device the rules find nothing for,
and any attribute only a full handle has (``warmup``, ``spec``...). A host module runs with these handles where all
its kernels are plain (``cold_binding.bind``), with a small ``triton`` (``host_values.SmallTriton``: ``cdiv``,
``next_power_of_2``, module-level constexprs, element types; the rest read from ``host_triton`` on first use).
``FORGE_NO_COLD=1`` turns it off.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable
from typing import Any

from . import fastpath
from .basics import compile_constraints, config_fits, pick_config, target_table
from .cold_launch import ColdLaunched, device_info, load_launcher, new_heuristic_values
from .lean_launch import bind_call
from .packing import check_dtypes, dtype_name
from .rules import (
    SPEC_DESC,
    Config,
    best_binary,
    call_defaults,
    ignored_options,
    launch_attrs,
    named_args,
    read_params,
    run_heuristics,
    variant_id,
)
from .selection import grid_dims

_MISSING = fastpath._MISSING  # a call-site constexpr without a default: a call must pass it


class _Cold:
    """A cold handle's own state: what it resolved, per (device, dtypes) and per binary."""

    def __init__(self, root: str, mod: str, upgrade: Callable[[str], Any]) -> None:
        self.root, self.mod, self.upgrade = root, mod, upgrade
        self.lock = threading.Lock()
        self.tables: dict[tuple[Any, ...], Any] = {}
        """(device, variant id) → (target, target entry's directory, configs, usable ids, rows, row ids), or None."""
        self.launchers: dict[tuple[int, str, int], Any] = {}
        """(device, binary path, launch attributes) → its C Launcher."""
        self.functions: dict[tuple[int, str], Any] = {}
        """(device, binary path) → its loaded function (the launchers of its launch attributes share it)."""
        self.last: Any = None
        """What the last launch resolved here returned (``ColdLaunched``)."""


class ColdKernel(fastpath.c.KernelBase if fastpath.c is not None else object):  # type: ignore[misc]
    """A plain kernel's handle until something needs the full ``Kernel`` (see the module's docstring)."""

    def __init__(self, name: str, spec: dict[str, Any], targets: dict[str, dict[str, Any]], root: str, mod: str,
                 upgrade: Callable[[str], Any], pre_hooks: dict[str, Any] | None = None) -> None:
        self.name, self.function, self.targets, self.variants = name, spec["function"], targets, spec["variants"]
        read_params(self, spec)
        self.heuristics: list[tuple[str, Callable[[dict[str, Any]], Any]]] = []
        """``@triton.heuristics`` values (``add_heuristics``), called as ``Kernel.run`` calls them."""
        self.pre_hooks: dict[str, Callable[[dict[str, Any]], Any]] = dict(pre_hooks or {})
        """Config pre-hooks by name, bound from the host module (``host_exec.bind_pre_hooks``), as ``Kernel``'s."""
        self.key_names = tuple(spec["key"])
        self.constraints: list[Any] = list(spec.get("constraints", ()))
        """Their texts, compiled (``expressions``) when a key first misses every row."""
        # what a call may leave out and what it must pass, as Kernel._bind completes a call
        self._call_defaults, self._required = call_defaults(self)
        self._ignored = ignored_options(self.launch_axes)
        self._cold = _Cold(root, mod, upgrade)
        self._set_fast(fastpath.plan(self))

    def __repr__(self) -> str:
        return f"<forge-aot kernel {self.name} ({self.function}), builds: {list(self.variants)}>"

    def add_heuristics(self, values: dict[str, Callable[[dict[str, Any]], Any]], outermost: bool = False) -> None:
        """As ``Kernel.add_heuristics`` (a name that is no heuristic parameter: the full handle reports it)."""
        if any(name not in self.heuristic_names for name in values):
            self._promoted().add_heuristics(values, outermost)
            return
        self.heuristics = [*values.items(), *self.heuristics] if outermost else [*self.heuristics, *values.items()]
        self._set_fast(fastpath.plan(self))  # the C path calls the heuristics too: read again with them

    def __getattr__(self, name: str) -> Any:  # what only a full handle has: promote, then read it there
        if "_cold" not in self.__dict__ or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._promoted(), name)

    def _promoted(self) -> Any:
        """This handle, made a full ``Kernel`` in place (once; ``upgrade`` gives its index entry, the package's
        targets and backend, and the class)."""
        cold = self.__dict__.get("_cold")
        if cold is None:
            return self
        with cold.lock:
            if self.__dict__.get("_cold") is None:
                return self
            spec, targets, backend, kernel_class = cold.upgrade(self.name)
            last = self._fast.last if self._fast is not None else None
            last = cold.last if last is None else last
            name, heuristics, pre_hooks = self.name, self.heuristics, self.pre_hooks
            self.__dict__.clear()
            self.__class__ = kernel_class
            kernel_class.__init__(self, name, spec, targets, backend, pre_hooks=pre_hooks)  # (bound already)
            if heuristics:  # registered on the cold handle: the full one calls them as it would have
                self.heuristics = heuristics
                if self._fast is not None:
                    fastpath.use_c_launch(self, True)
            if last is not None:  # best_config: the config the latest launch ran
                self._last_config = last.config
        return self

    def named_args(self, runtime: Any, call: dict[str, Any], config: Any) -> dict[str, Any]:
        """As ``Kernel.named_args`` (the C path's, for a grid function reading an argument by name: no promotion)."""
        return named_args(self.runtime_names, runtime, call, config)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """A call's runtime arguments (in order) and call-site values as ``Kernel._bind`` binds them (defaults for
        those it leaves out), or None where the full path binds it (and reports what is wrong): any argument by
        position or by keyword (Liger passes all by keyword), of the runtime parameters, call-site constexprs and
        launch options only."""
        return bind_call(args, kwargs, self.n_runtime, self._runtime_first, self.param_names, self.runtime_names,
                         self.call_names, self._call_defaults, self._required, self._ignored)

    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        cold = self.__dict__.get("_cold")
        bound = self._bind(args, kwargs) if cold is not None and fastpath.LAUNCHES.skip is False else None
        if bound is not None:
            result = self._launch_bound(cold, grid, *bound)
            if result is not _MISSING:
                return result
        return self._promoted().run(grid, args, kwargs)

    def _launch_bound(self, cold: _Cold, grid: Any, runtime: tuple[Any, ...], call: dict[str, Any],
                      heur: tuple[Any, ...] | None = None) -> Any:
        """Resolve a bound call (``heur``: its heuristic values where the C path computed them, after which it ran
        the config's pre-hook too), launch it and let the C path launch such calls; what the launch returns, or
        ``_MISSING`` where the full path serves it."""
        from_c = heur is not None
        try:
            found = self._resolve(cold, runtime, call, heur)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # the full path reports it
            return _MISSING
        if found is None:
            return _MISSING
        launcher, config, launch_meta, spec, result, heur, nargs = found
        hooked = bool(config.pre_hook and not from_c)
        if hooked:  # as Kernel.run: after the heuristics, before the grid and the launch
            hook = self.pre_hooks.get(config.pre_hook)
            if hook is None:
                return _MISSING
            hook(nargs)
        try:  # (the grid function sees the heuristic values, else the arguments by name, as Kernel.run's does)
            dims = grid_dims(grid, launch_meta, self.heuristic_names, heur, lambda: nargs if nargs is not None
                             else named_args(self.runtime_names, runtime, call, config))
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
            if hooked:  # the grid function's error, raised as Kernel.run raises it: the hook ran once
                raise
            return _MISSING
        try:
            values = list(runtime)
            for i in self.ptr_pos:
                if runtime[i] is not None and type(runtime[i]) is not int:  # (None: compiled in, not passed;
                    values[i] = runtime[i].data_ptr()  # an integer: the binary takes it as one, see _resolve)
            launcher(dims, values)
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError):  # raised before any launch: values
            if hooked:  # the full launcher packs itself; launched there, the hook not run again
                full = promoted(self)
                return full.backend.launch(full, full._state(runtime, call), config, dims, runtime, call, heur)
            return _MISSING
        self._fast.last = None
        cold.last = result
        launcher.result = result
        if heur or config.pre_hook:  # the C path runs them per call; values it has not seen come back here
            self._fast.register(runtime, call, launcher, launch_meta, config, spec, heur, config.all_kwargs(),
                                config.pre_hook, functools.partial(new_heuristic_values, config))
        else:
            self._fast.register(runtime, call, launcher, launch_meta, config, spec)
        return result

    def _resolve(self, cold: _Cold, args: tuple[Any, ...], call: dict[str, Any],
                 heur: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        """(C launcher, config, launch meta, specialization, result, heuristic values, the arguments by name where
        they were read here, else None) of a call (its runtime arguments and bound call-site values; ``heur``: None,
        or the heuristic values the C path computed), or None where the full path serves it."""
        fast = self._fast
        spec = fast.spec(args, call) if fast is not None else None  # None: a call the C path does not read
        # (None: Liger's z_loss_ptr=None; an integer where the manifest's *i32|i32 allows one: flash-attn's offsets)
        dtypes = [None if args[i] is None or (type(args[i]) is int and i in self.pointer_ints) else args[i].dtype
                  for i in self.device_pos]
        by_type: dict[str, Any] = {}  # a type's dtype: its first tensor's
        for i, d in zip(self.device_pos, dtypes):
            if d is not None:
                by_type.setdefault(self.runtime[i][1], d)
        if spec is None or SPEC_DESC in spec or not by_type:  # (a descriptor passed to a pointer: the full path's)
            return None
        device = next(args[i] for i, d in zip(self.device_pos, dtypes) if d is not None).get_device()
        # a type variable's dtype: its first tensor's (all None: KeyError, the full path's case)
        assignment = {tv: dtype_name(by_type[self.runtime[src][1]]) for tv, src in self.type_vars}
        if call:
            assignment.update((a, call[a]) for a in self.axes if a in call)
        check_dtypes(self.function, [self.runtime[i] for i in self.device_pos], dtypes, assignment)
        vid = variant_id(assignment, self.axes)
        table = cold.tables.get((device, vid), False)
        if table is False:
            table = cold.tables[(device, vid)] = self._table(cold, device, vid)
        if table is None:
            return None
        target, directory, configs, usable = table[:4]
        key = tuple(args[src] if is_rt else call[src] for is_rt, src in self.key_sources)
        if any(type(v) not in (int, bool) for v in key):  # (FLA keys on REVERSE, a bool)
            return None
        cid = pick_config(table, key, lambda: self._fits(configs, usable, dict(zip(self.key_names, key)), assignment))
        if cid is None:
            return None
        entry = configs[cid]
        config = Config.from_entry(cid, entry, {a: v for a, v in assignment.items() if a in self.call_names})
        nargs = None
        if heur is None:  # as Kernel.heuristic_values (the pre-hook sees the arguments by name, theirs included)
            if self.heuristics or config.pre_hook:
                nargs = named_args(self.runtime_names, args, call, config)
                heur = run_heuristics(self.heuristics, self.heuristic_names, nargs)
            else:
                heur = ()
        binaries = entry.get("binaries")
        if binaries is None:
            with open(os.path.join(directory, entry["binaries_file"]), "rb") as f:
                binaries = entry["binaries"] = json.load(f)
        binary = best_binary(binaries, self.heuristic_names, heur, spec)  # (as tables.choose_binary)
        if binary is None:
            return None
        attrs = launch_attrs(call) if self.launch_flags else 0  # (launch_pdl=, launch_cooperative_grid=)
        launcher = cold.launchers.get((device, binary["path"], attrs))
        if launcher is None:
            launcher = load_launcher(self, cold, binary, device, attrs)
            if launcher is None:
                return None
        result = launcher.result  # one per binary, as the full path's ``Launched``
        if result is None:
            result = ColdLaunched(self, binary, config, call, device, target)
        return launcher, config, config.launch_meta, spec, result, heur, nargs

    def _fits(self, configs: dict[str, Any], usable: set[str], keys: dict[str, int],
              assignment: dict[str, Any]) -> Callable[[str], bool]:
        """Whether a config fits a key: ``ConfigTable._fits`` over the index's configs (``basics.config_fits``)."""
        if self.constraints and isinstance(self.constraints[0], str):
            self.constraints = compile_constraints(self.constraints)
        return config_fits(self.constraints, configs, usable, keys, assignment)

    def _table(self, cold: _Cold, device: int, vid: str) -> tuple[Any, ...] | None:
        """What a (device, variant) resolves to, as ``tables.resolve_table``: None where the full path serves it."""
        variant = self.variants.get(vid)
        info = device_info(device)
        if variant is None:
            return None
        return target_table(cold.root, cold.mod, variant, self.targets,
                            (info["name"], info["capability"], info["max_shared"]))

def promoted(kernel: Any) -> Any:
    """A kernel handle as a full ``Kernel``: a lean one (``lean_kernel``'s ``LeanKernel``) or a cold one promoted (see
    ``ColdKernel``), any other as it is."""
    promote = getattr(type(kernel), "_promoted", None)
    while promote is not None:  # (lean, then cold, then full)
        kernel = promote(kernel)
        promote = getattr(type(kernel), "_promoted", None)
    return kernel
