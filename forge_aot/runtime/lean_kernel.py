"""Lean handles (see ``lean``): binding a host module with ``LeanKernel`` handles (``bind``), and their first calls,
resolved from the index as ``ColdKernel._resolve`` resolves them and launched through the C extension; anything
else makes the handle a ``ColdKernel`` in place, after the full runtime took the package over. Imports: stdlib,
``basics`` (torch, the C extension where called).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import types
import weakref
from typing import Any

from .basics import (
    _KNOWN,
    HEURISTICS_HOOK,
    KERNEL_SIDE_HOOK,
    LAUNCHES,
    c_driver,
    check_cuda,
    compile_constraints,
    config_fits,
    dtype_name,
    extension,
    pick_config,
    small_triton,
    spec_fits,
    spec_rank,
    target_table,
)
from .lean import ops_package

_MISS = object()
_NO_CALL: dict[str, Any] = {}


def bind(state: Any, mod: str) -> types.ModuleType | None:
    """Run host module ``mod`` with lean handles (under the package's lock), or None where its part of the index has
    no lean plan, or the extension, the driver or the file cannot serve it here."""
    try:
        with open(os.path.join(state.root, "_forge", "modules", f"{mod}.json"), "rb") as f:
            part = json.load(f)
    except (OSError, ValueError):  # the full path reads it again and says what is wrong
        return None
    plan = part.get("lean")
    c = extension() if plan else None
    if c is None or c_driver() is None:
        return None
    spec = part["modules"][mod]
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

    def heuristics(function: str, values: Any, outermost: bool = False) -> None:  # (the full handle's to take)
        if function in handles:
            handles[function]._promoted().add_heuristics(values, outermost)

    module.__dict__.update(handles)
    module.__dict__.update({"triton": small_triton(), HEURISTICS_HOOK: heuristics, KERNEL_SIDE_HOOK: side})
    if spec.get("package"):  # (as host_exec.run_host_file; with no project modules, no relative import reads it)
        module.__dict__["__package__"] = f"{state.package}._ops._local.{spec['package']}"
    ops_package(state.package, state.root)
    sys.modules[name] = module
    try:
        exec(module_spec.loader.get_code(name), module.__dict__)  # type: ignore[attr-defined]
    except BaseException:
        if sys.modules.get(name) is module:
            del sys.modules[name]
        raise
    state.kernels.extend(handles.values())
    return module


class _Lean:
    """A lean handle's own state: its plan, what it resolved per (device, variant), its launchers."""

    def __init__(self, state: Any, mod: str, part: dict[str, Any], name: str, plan: dict[str, Any]) -> None:
        self.state, self.mod, self.part, self.name, self.plan = state, mod, part, name, plan
        self.lock = threading.Lock()
        self.tables: dict[tuple[int, str], Any] = {}
        self.launchers: dict[tuple[int, str], Any] = {}
        self.constraints: list[Any] | None = None
        """The kernel's constraints, compiled when a key first misses every row."""

    def launch(self, kernel: Any, grid: Any, args: tuple[Any, ...]) -> Any:
        """Resolve a call the C path has not seen, launch it and register it there; its result, or ``_MISS``
        where a cold or full handle must serve it."""
        p = self.plan
        if len(args) != p["n"]:
            return _MISS
        fast = kernel._fast
        spec = fast.spec(args, _NO_CALL)
        if spec is None:  # (a call the C path does not read: a CPU tensor, an integer out of range...)
            return _MISS
        tensors = [args[i] for i in p["device_pos"]]
        dtypes = [dtype_name(t.dtype) for t in tensors]  # (None: AttributeError, the full path's case)
        assignment = {tv: dtypes[j] for tv, j in p["type_vars"]}
        for declared, name in zip(p["declared"], dtypes):  # as packing.check_dtypes
            expected = assignment.get(declared, declared)
            if expected in _KNOWN and name != expected:
                return _MISS
        vid = p["variants"].get(",".join(assignment[tv] for tv, _ in p["type_vars"]))
        device = tensors[0].get_device()
        if vid is None or device < 0:
            return _MISS
        table = self.tables.get((device, vid), False)
        if table is False:
            table = self.tables[(device, vid)] = self._table(device, vid)
        if table is None:
            return _MISS
        target, directory, configs, usable = table[:4]
        key = tuple(args[i] for i in p["key_pos"])
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
        best = None  # as rules.best_binary for a kernel without heuristics
        for b in binaries.values():
            if not b.get("heur") and spec_fits(b["spec"], spec) and (best is None
                                                                     or spec_rank(b["spec"]) > spec_rank(best["spec"])):
                best = b
        if best is None or "block" not in best:
            return _MISS
        launcher = self.launchers.get((device, best["path"]))
        if launcher is None:
            launcher = self._load(kernel, best, device, target, cid, entry)
            if launcher is None:
                return _MISS
        meta = entry.get("launch_meta")
        if meta is None:
            meta = entry["launch_meta"] = {**entry["meta"], "num_warps": entry["num_warps"],
                                           "num_stages": entry["num_stages"]}
        dims = grid(meta) if callable(grid) else grid
        values = list(args)
        for i, t in zip(p["device_pos"], tensors):
            values[i] = t.data_ptr()
        launcher(dims, values)
        fast.register(args, _NO_CALL, launcher, meta, cid, spec)
        return launcher.result

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
              config: dict[str, Any]) -> Any:
        """A binary loaded on a device (sha256 checked: a mismatch is the full path's to report) as a C
        ``Launcher``, or None."""
        with open(os.path.join(self.state.root, binary["path"]), "rb") as f:
            image = f.read()
        if hashlib.sha256(image).hexdigest() != binary["sha256"]:
            return None
        _, max_shared, ctx = self._device(device)[1:]
        _, drv = c_driver()  # type: ignore[misc]
        with self.lock:
            launcher = self.launchers.get((device, binary["path"]))
            if launcher is None:
                code, failed, fn = drv.load(ctx, image, binary["function"], binary["shared"], max_shared)
                check_cuda(drv, code, failed or "load")
                launcher = new_launcher(fn, ctx, binary, binary["block"], device, functools.partial(check_cuda, drv),
                                        kernel.function, drv.entry_points())
                launcher.result = _LeanLaunched(kernel, binary, cid, config, device, target)
                self.launchers[(device, binary["path"])] = launcher
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


class _LeanLaunched:
    """What a lean handle's launch returns (Triton returns the binary it ran): ``cold_launch.ColdLaunched``, made on
    the first attribute read (which promotes the handle)."""

    __slots__ = ("_cold", "_of")

    def __init__(self, kernel: Any, binary: dict[str, Any], cid: str, config: dict[str, Any], device: int,
                 target: str) -> None:
        self._of = (weakref.ref(kernel), binary, cid, config, device, target)
        self._cold: Any = None

    def cold(self) -> Any:
        if self._cold is None:
            from .cold_launch import ColdLaunched
            from .rules import Config

            ref, binary, cid, entry, device, target = self._of
            kernel = ref()
            if kernel is None:
                raise ReferenceError("the kernel handle this launch ran is gone")
            config = Config(cid, entry["meta"], entry["num_warps"], entry["num_stages"], {}, entry.get("maxnreg"),
                            entry.get("pre_hook"))
            self._cold = ColdLaunched(kernel, binary, config, {}, device, target)
        return self._cold

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cold(), name)

    def __getitem__(self, grid: Any) -> Any:
        return self.cold()[grid]

    def __repr__(self) -> str:
        return repr(self.cold())


@functools.cache
def _handle_class(c: Any) -> type:
    """``LeanKernel``, on the extension's ``KernelBase`` (the C path reads its calls as a full handle's)."""

    class LeanKernel(c.KernelBase):  # type: ignore[misc,name-defined]
        """A kernel handle of a lean-bound host module, until anything but a plain first call needs more: then a
        ``ColdKernel`` in place (the same object: host code keeps its reference), and so on to a full ``Kernel``."""

        def __init__(self, state: Any, mod: str, part: dict[str, Any], name: str,
                     plan: dict[str, Any]) -> None:
            self.name, self.function = name, part["kernels"][name]["function"]
            self._lean = _Lean(state, mod, part, name, plan)
            r = plan["reading"]
            import torch

            self._set_fast(c.FastKernel(
                bytes(r["kinds"]), tuple(r["device_pos"]), tuple(r["spec_pos"]), tuple(r["spec_ptr"]),
                tuple(r["axis_pos"]), tuple(r["key_pos"]), (), (), _MISS, (torch.Tensor, torch.nn.Parameter),
                torch.Tensor.get_device, torch.Tensor.data_ptr, LAUNCHES, tuple(r["runtime_names"]), (), (),
                tuple(r["type_next"]), tuple(r["param_slots"]), (), b"", tuple(r["written_pos"])))

        def __repr__(self) -> str:
            builds = list(self._lean.plan["variants"].values())
            return f"<forge-aot kernel {self.name} ({self.function}), builds: {builds}>"

        def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            lean = self.__dict__.get("_lean")
            if lean is not None and not kwargs and LAUNCHES.skip is False:
                try:
                    result = lean.launch(self, grid, args)
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
                name, mod, part = self.name, lean.mod, lean.part
                self.__dict__.clear()
                self.__class__ = ColdKernel
                ColdKernel.__init__(self, name, part["kernels"][name], part["targets"], lean.state.root, mod,
                                    lambda n: full._upgrade(mod, n))
                if isinstance(last, _LeanLaunched):  # (best_config: the config the latest launch ran)
                    self._cold.last = last.cold()
            return self

    return LeanKernel
