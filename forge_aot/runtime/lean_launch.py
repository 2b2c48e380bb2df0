"""A lean handle's calls (see ``lean``): a call the C path has not seen, bound as ``Kernel._bind`` binds it (call-site
constexprs and launch options included), resolved from the index as ``ColdKernel._resolve`` resolves it (dtypes and
call-site values -> variant, capability -> target, device name -> table, the key's row or the nearest usable one,
the most specialized binary of the ``@triton.heuristics`` values that fits; a descriptor hands over), its binary
loaded (sha256 checked) through the C ``Driver``, the config's pre-hook run (after which nothing hands the call over:
``AfterHook``), launched through a C ``Launcher`` with the call's launch attributes (``launch_pdl=``),
then registered with the C path (with a fallback for heuristic values it has not seen, ``Lean._late``). Imports:
stdlib, ``basics``, ``selection`` (torch, the C extension where called; ``rules`` and ``cold_launch`` where a
handle turns cold).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import weakref
from collections.abc import Collection, Sequence
from typing import Any

from .basics import (
    _KNOWN,
    SPEC_DESC,
    c_driver,
    check_cuda,
    compile_constraints,
    config_fits,
    dtype_name,
    extension,
    pick_config,
    target_table,
)
from .selection import Config, best_binary, grid_dims, named_args, run_heuristics, variant_id

_MISS = object()
_NO_CALL: dict[str, Any] = {}


def bind_call(args: tuple[Any, ...], kwargs: dict[str, Any], n: int, runtime_first: bool, params: Sequence[str],
              runtime_names: Sequence[str], names: Collection[str], defaults: Sequence[Sequence[Any]],
              required: Collection[str], ignored: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """A call's runtime arguments (in order) and call-site values as ``Kernel._bind`` binds them, or None where the
    full path binds it (and reports what is wrong): any argument by position or by keyword (Liger passes all by
    keyword), of the ``runtime_names`` and the call-site ``names`` only; a launch option of ``ignored`` at its default
    read as not passed (the tutorials' ``num_ctas=1``); each name of ``defaults`` ((name, value) pairs) a call leaves
    out takes its default, each of ``required`` must be passed. Lean and cold handles bind so."""
    if not kwargs and len(args) == n and runtime_first:
        if not defaults and not required:
            return args, _NO_CALL
        runtime, call = args, {}
    else:
        if len(args) > len(params):
            return None
        call = dict(zip(params, args))
        for k, v in kwargs.items():
            if k in call:
                return None
            call[k] = v
        if any(name not in call for name in runtime_names):
            return None
        runtime = tuple(call.pop(name) for name in runtime_names)
        for k in [k for k in call if k not in names and k in ignored]:
            if call[k] != ignored[k]:
                return None
            del call[k]
        if any(k not in names for k in call):
            return None  # tuned parameters, other launch options, unknown names: the full path says which
    for name, default in defaults:
        call.setdefault(name, default)
    if any(name not in call for name in required):
        return None
    return runtime, call


class Lean:
    """A lean handle's own state: its plan, what it resolved per (device, variant), its launchers."""

    def __init__(self, state: Any, mod: str, part: dict[str, Any], name: str, plan: dict[str, Any]) -> None:
        self.state, self.mod, self.part, self.name, self.plan = state, mod, part, name, plan
        self.lock = threading.Lock()
        self.tables: dict[tuple[int, str], Any] = {}
        self.launchers: dict[tuple[int, str, int], Any] = {}
        self.functions: dict[tuple[int, str], Any] = {}  # (launchers of one binary's launch attributes share it)
        self.constraints: list[Any] | None = None
        """The kernel's constraints, compiled when a key first misses every row."""
        self.heuristics: list[tuple[str, Any]] = []
        """``@triton.heuristics`` values (``LeanKernel.add_heuristics``), called as ``Kernel.run`` calls them."""

    def launch(self, kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Resolve a call the C path has not seen, launch it and register it there; its result, or ``_MISS``
        where a cold or full handle must serve it."""
        p = self.plan
        bound = bind_call(args, kwargs, p["n"], p["runtime_first"], p["params"], p["reading"]["runtime_names"],
                          p["reading"]["names"], p["defaults"], p["required"], p["ignored"])
        if bound is None:
            return _MISS
        return self._launch(kernel, grid, *bound)

    def _launch(self, kernel: Any, grid: Any, runtime: tuple[Any, ...], call: dict[str, Any],
                heur: tuple[Any, ...] | None = None) -> Any:
        """A bound call resolved, launched and registered (``heur``: None, or the heuristic values the C path
        computed for it); its result, or ``_MISS``."""
        p = self.plan
        fast = kernel._fast
        spec = fast.spec(runtime, call)
        if spec is None or SPEC_DESC in spec:  # (a call the C path does not read: a CPU tensor, an integer out of
            return _MISS  # range...; a descriptor passed to a pointer, the tutorial attention's: the full path's)
        ints = p["reading"]["pointer_ints"]  # (an integer where the manifest's *i32|i32 allows one: flash-attn's
        tensors = [None if type(runtime[i]) is int and i in ints else runtime[i] for i in p["device_pos"]]  # offsets)
        # (None: a pointer compiled in as absent, Liger's z_loss_ptr=None, or an integer; a type's dtype is its first
        # tensor's, as ColdKernel._resolve reads them; a type variable with no tensor: KeyError, the full path's case)
        dtypes = [None if t is None else dtype_name(t.dtype) for t in tensors]
        by_type: dict[str, str] = {}
        for declared, name in zip(p["declared"], dtypes):
            if name is not None:
                by_type.setdefault(declared, name)
        assignment = {tv: by_type[p["declared"][j]] for tv, j in p["type_vars"]}
        for declared, name in zip(p["declared"], dtypes):  # as packing.check_dtypes
            expected = assignment.get(declared, declared)
            if name is not None and expected in _KNOWN and name != expected:
                return _MISS
        built = {a: call[a] for a in p["axes"] if a in call}  # (the call's build values: not flags, heuristic inputs)
        assignment.update(built)
        vid = variant_id(assignment, p["axes"])
        first = next((t for t in tensors if t is not None), None)
        if first is None:
            return _MISS
        device = first.get_device()
        if vid not in self.part["kernels"][self.name]["variants"] or device < 0:
            return _MISS  # (a value that was not built: the full path reports it)
        table = self.tables.get((device, vid), False)
        if table is False:
            table = self.tables[(device, vid)] = self._table(device, vid)
        if table is None:
            return _MISS
        target, directory, configs, usable = table[:4]
        key = tuple(runtime[src] if is_rt else call[src] for is_rt, src in p["key"])
        if any(type(v) not in (int, bool) for v in key):
            return _MISS
        cid = pick_config(table, key, lambda: self._fits(configs, usable, key, assignment))
        if cid is None:
            return _MISS
        entry = configs[cid]
        binaries = entry.get("binaries")
        if binaries is None:
            with open(os.path.join(directory, entry["binaries_file"]), "rb") as f:
                binaries = entry["binaries"] = json.load(f)
        config = Config.from_entry(cid, entry, built)
        names = p["reading"]["heuristic_names"]
        hook = config.pre_hook if heur is None else None  # (from the C path: it ran both)
        nargs = None
        if heur is None and (names or hook):  # on the arguments by name, as every binding runs them
            nargs = named_args(p["reading"]["runtime_names"], runtime, call, config)
            heur = run_heuristics(self.heuristics, names, nargs)
        heur = heur or ()
        best = best_binary(binaries, names, heur, spec)
        if best is None or "block" not in best:
            return _MISS
        attrs = sum(bit for flag, bit in p.get("flags", ()) if call.get(flag))  # (launch_pdl=, as rules.launch_attrs)
        launcher = self.launchers.get((device, best["path"], attrs))
        if launcher is None:
            launcher = self._load(kernel, best, device, target, cid, entry, built, attrs)
            if launcher is None:
                return _MISS
        meta = config.launch_meta  # what a grid function sees: meta-parameters, call-site values, warps, stages
        if hook:  # as Kernel.run: after the heuristics, before the grid and the launch (split-K's zeroed output)
            fn = kernel.pre_hooks.get(hook)
            if fn is None:
                return _MISS
            fn(nargs)
            try:  # (from here on nothing hands the call over: the full path would run the hook again)
                dims = grid_dims(grid, meta, names, heur, lambda: nargs)
            except Exception as exc:  # the grid function's error: the handle raises it (LeanKernel.run)
                raise AfterHook from exc
        else:  # (a grid function reading an argument by name: on the arguments by name, as Kernel.run)
            dims = grid_dims(grid, meta, names, heur, lambda: nargs if nargs is not None else named_args(
                p["reading"]["runtime_names"], runtime, call, config))
        values = list(runtime)
        for i, t in zip(p["device_pos"], tensors):
            if t is not None:  # (an integer is passed as it is: the binary built for one takes it, see best_binary)
                values[i] = t.data_ptr()
        try:
            launcher(dims, values)
        except (TypeError, ValueError, OverflowError):  # raised before the launch: a grid the full launcher takes
            if not hook:
                raise
            from .cold_launch import new_heuristic_values  # (its hook ran: the rest of Kernel.run, as the C path's)

            return new_heuristic_values(config, kernel, dims, runtime, call, heur)
        try:  # (launched: a failure to register sends the next call here again, never this one elsewhere)
            if names or config.pre_hook:  # the C path runs them per call; values it has not seen come back to _late
                fast.register(runtime, call, launcher, meta, config, spec, heur, config.all_kwargs(), config.pre_hook,
                              functools.partial(self._late, cid, entry))
            else:
                fast.register(runtime, call, launcher, meta, config, spec)
        except (ValueError, TypeError, LookupError, OverflowError):
            pass
        return launcher.result

    def _late(self, cid: str, entry: dict[str, Any], kernel: Any, grid: Any, runtime: tuple[Any, ...],
              call: dict[str, Any], heur: tuple[Any, ...]) -> Any:
        """What the C path hands a call whose heuristics gave values it has not seen (FLA's ``scale=None``, then a
        float): launched here where this handle is still lean, else by the cold or full path for that config."""
        if "_lean" in kernel.__dict__:
            try:
                result = self._launch(kernel, grid, runtime, dict(call), heur)
            except (OSError, ValueError, LookupError, TypeError, AttributeError, OverflowError):
                result = _MISS
            if result is not _MISS:
                return result
        from .cold_launch import new_heuristic_values

        config = Config.from_entry(cid, entry, {a: call[a] for a in self.plan["axes"] if a in call})
        kernel = kernel._promoted() if "_lean" in kernel.__dict__ else kernel  # (lean -> cold)
        return new_heuristic_values(config, kernel, grid, runtime, call, heur)

    def _device(self, device: int) -> tuple[Any, ...]:
        info = self.state.devices.get(device)
        if info is None:
            _, drv = c_driver()  # type: ignore[misc]
            code, dev = drv.device(device)
            check_cuda(drv, code, "cuDeviceGet")
            got = [drv.attribute(a, dev) for a in (75, 76, 97)]  # capability, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            for code, _ in got:
                check_cuda(drv, code, "cuDeviceGetAttribute")
            code, name = drv.name(dev)
            check_cuda(drv, code, "cuDeviceGetName")
            code, ctx = drv.primary_context(dev)
            check_cuda(drv, code, "cuDevicePrimaryCtxRetain")
            info = self.state.devices[device] = (name, (got[0][1], got[1][1]), got[2][1], ctx)
        return info

    def _fits(self, configs: dict[str, Any], usable: set[str], key: tuple[Any, ...],
              assignment: dict[str, Any]) -> Any:
        kspec = self.part["kernels"][self.name]
        if self.constraints is None:
            self.constraints = compile_constraints(kspec.get("constraints", ()))
        return config_fits(self.constraints, configs, usable, dict(zip(kspec["key"], key)), assignment)

    def _table(self, device: int, vid: str) -> tuple[Any, ...] | None:
        """What a (device, variant) resolves to (``basics.target_table``, as ``ColdKernel._table``)."""
        return target_table(self.state.root, self.mod, self.part["kernels"][self.name]["variants"][vid],
                            self.part["targets"], self._device(device)[:3])

    def _load(self, kernel: Any, binary: dict[str, Any], device: int, target: str, cid: str,
              config: dict[str, Any], call: dict[str, Any], attrs: int = 0) -> Any:
        """A binary loaded on a device (sha256 checked: a mismatch is the full path's to report) as a C
        ``Launcher`` with the launch attributes ``attrs``, or None (attributes, a driver without cuLaunchKernelEx)."""
        loaded, image = (device, binary["path"]), None
        if loaded not in self.functions:
            with open(os.path.join(self.state.root, binary["path"]), "rb") as f:
                image = f.read()
            if hashlib.sha256(image).hexdigest() != binary["sha256"]:
                return None
        _, max_shared, ctx = self._device(device)[1:]
        _, drv = c_driver()  # type: ignore[misc]
        points = drv.entry_points()
        if attrs and not points.get("launch_ex"):
            return None
        with self.lock:
            launcher = self.launchers.get((*loaded, attrs))
            if launcher is None:
                fn = self.functions.get(loaded)
                if fn is None:  # (then the image was read above: functions are never dropped)
                    code, failed, fn = drv.load(ctx, image, binary["function"], binary["shared"], max_shared)
                    check_cuda(drv, code, failed or "load")
                    self.functions[loaded] = fn
                launcher = new_launcher(fn, ctx, binary, binary["block"], device, functools.partial(check_cuda, drv),
                                        kernel.function, points, attrs)
                launcher.result = LeanLaunched(kernel, binary, cid, config, call, device, target)
                self.launchers[(*loaded, attrs)] = launcher
        return launcher


def new_launcher(function: int, ctx: int, binary: dict[str, Any], layout: Any, device: int, check: Any, name: str,
                 points: dict[str, int], attrs: int = 0) -> Any:
    """The C ``Launcher`` of a binary loaded on a device (``function``, in context ``ctx``), as lean and cold handles
    make it: ``layout``, its parameter block (``cold_launch.block_of``); ``points``, the driver's entry points; global
    scratch allocated per launch where the binary asks for it (Triton's persistent TMA matmul)."""
    import torch

    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
        (lambda d: torch.cuda.current_stream(d).cuda_stream)
    scratch_sizes = int(binary.get("global_scratch_size", 0)), int(binary.get("profile_scratch_size", 0))
    scratch = None
    if any(scratch_sizes):
        from .rules import scratch_buffer

        scratch = functools.partial(scratch_buffer, torch, device, raw_stream)
    kept, kinds, offsets, size = layout
    return extension().Launcher(
        function, ctx, binary["warp_size"] * binary["num_warps"], binary["shared"], tuple(kept), bytes(kinds),
        tuple(offsets), size, *scratch_sizes, scratch, raw_stream, device, check, name, points["launch"],
        points["ctx_get"], points["ctx_push"], points["ctx_pop"], attrs, points.get("launch_ex", 0), None,
        points.get("tensor_map", 0))


class LeanLaunched:
    """What a lean handle's launch returns (Triton returns the binary it ran): ``cold_launch.ColdLaunched``, made on
    the first attribute read (which promotes the handle)."""

    __slots__ = ("_cold", "_of")

    def __init__(self, kernel: Any, binary: dict[str, Any], cid: str, config: dict[str, Any], call: dict[str, Any],
                 device: int, target: str) -> None:
        self._of = (weakref.ref(kernel), binary, cid, config, call, device, target)
        self._cold: Any = None

    def cold(self) -> Any:
        if self._cold is None:
            from .cold_launch import ColdLaunched

            ref, binary, cid, entry, call, device, target = self._of
            kernel = ref()
            if kernel is None:
                raise ReferenceError("the kernel handle this launch ran is gone")
            self._cold = ColdLaunched(kernel, binary, Config.from_entry(cid, entry, call), call, device, target)
        return self._cold

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cold(), name)

    def __getitem__(self, grid: Any) -> Any:
        return self.cold()[grid]

    def __repr__(self) -> str:
        return repr(self.cold())


class AfterHook(Exception):
    """Raised from an error after a call's config pre-hook ran (its grid function's, the cause): ``LeanKernel.run``
    raises the cause, as ``Kernel.run`` would, rather than hand the call over to a path that runs the hook again."""
