"""Launching packaged binaries: the binary a call takes, loading (integrity checked) and the driver call."""

from __future__ import annotations

import copy
import ctypes
import functools
import hashlib
import operator
import os
import struct
import threading
from collections.abc import Sequence
from typing import Any

from . import fastpath, packing
from .drivers import driver
from .errors import IntegrityError
from .host_triton import scratch_buffer
from .kernel import Kernel, _VariantState
from .packing import _CTYPES, _STRUCT_CODES, DESC_PREFIX, TENSOR_MAP_ALIGN, _pack_bf16, block_layout, block_struct
from .rules import binary_params
from .tables import (
    SPEC_DESC,
    Config,
    ConfigTable,
    argument_spec,
    choose_binary,
    launch_attrs,
    pick_cuda_target,
    pick_hip_target,
    pointer_value,
    resolve_table,
)


class BinaryBackend:
    """Launches packaged binaries with the driver API; loads each lazily (or at ``preload``), once per device."""

    c_launch = True
    """Plain calls, once resolved here, may be launched by the C path (fastpath.py) with this class's semantics.
    Declared per class: a subclass that changes how launches resolve or run keeps the generic path unless it
    declares it too."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._devices: dict[int, dict[str, Any]] = {}
        self._loaded: dict[tuple[int, str], _BinaryLauncher] = {}
        self._load_lock = threading.Lock()
        self.kernels: list[Kernel] = []

    def register(self, kernel: Kernel) -> None:
        self.kernels.append(kernel)
        if fastpath.c is not None:
            fastpath.use_c_launch(kernel)

    def device(self, index: int) -> dict[str, Any]:
        info = self._devices.get(index)
        if info is None:
            info = self._devices[index] = driver().describe(index)
        return info

    def resolve(self, kernel: Kernel, variant: dict[str, Any], assignment: dict[str, Any],
                device: int) -> tuple[str, ConfigTable]:
        return resolve_table(kernel, variant, assignment, driver().backend, self.device(device))

    def load(self, kernel: Kernel, binary: dict[str, Any], device: int) -> _BinaryLauncher:
        """The launcher of a binary on a device, loading it the first time (integrity checked)."""
        key = (device, binary["path"])
        launcher = self._loaded.get(key)
        if launcher is None:
            with self._load_lock:
                launcher = self._loaded.get(key)
                if launcher is None:
                    launcher = _BinaryLauncher(kernel, binary, os.path.join(self.root, binary["path"]), device,
                                               self.device(device)["max_shared"])
                    self._loaded[key] = launcher
        return launcher

    def preload(self, device: Any = None) -> int:
        """Load every binary this device can run, so nothing loads later (a module load during CUDA-graph
        capture breaks the capture). Returns how many binaries are loaded for the device."""
        import torch

        where = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        index = torch.cuda.current_device() if where.index is None else where.index
        info = self.device(index)
        cuda = driver().backend == "cuda"
        for kernel in self.kernels:
            for variant in kernel.variants.values():
                built = {t: kernel.targets[t] for t in variant["targets"]}
                target = pick_cuda_target(info["capability"], built) if cuda else pick_hip_target(info["arch"], built)
                if target is None:
                    continue
                for config in variant["targets"][target]["configs"].values():
                    for binary in config.get("binaries", {}).values():
                        if binary["shared"] <= info["max_shared"]:
                            self.load(kernel, binary, index)
        return sum(1 for d, _ in self._loaded if d == index)

    def launcher_for(self, kernel: Kernel, state: _VariantState, config: Config, heur: tuple[Any, ...], spec: str,
                     runtime: Sequence[Any]) -> Any:
        """The launcher of the binary serving a call, loaded once per config, heuristics, specialization, blocks."""
        if kernel.desc_pos or SPEC_DESC in spec:
            from .descriptors import block_shapes

            descs = block_shapes(kernel, runtime)
        else:
            descs = ()
        key = (config.id, heur, spec, descs)
        if (launcher := state.launchers.get(key)) is None:
            with state.lock:
                if (launcher := state.launchers.get(key)) is None:
                    binaries = kernel.variants[state.variant]["targets"][state.target]["configs"][config.id]
                    binary = choose_binary(kernel, binaries["binaries"], heur, spec, descs)
                    launcher = state.launchers[key] = self.load(kernel, binary, state.device)
        return launcher

    def compiled(self, kernel: Kernel, state: _VariantState, config: Config, heur: tuple[Any, ...],
                 runtime: Sequence[Any], call: dict[str, Any], generic: bool = False) -> Any:
        """``kernel.warmup(...)``: the binary a launch with these arguments takes, loaded (compiled.packaged)."""
        from .compiled import packaged

        return packaged(self, kernel, state, config, heur, runtime, call, generic)

    def launch(self, kernel: Kernel, state: _VariantState, config: Config, grid: Sequence[int],
               runtime: Sequence[Any], call: dict[str, Any], heur: tuple[Any, ...]) -> Any:
        values = list(runtime)
        try:
            for i in kernel.ptr_pos:  # None: only a binary built for None takes the call
                values[i] = None if runtime[i] is None else runtime[i].data_ptr()
        except AttributeError:  # a tensor descriptor (or an integer) where the kernel also takes a pointer
            values[i:] = [pointer_value(v) if j in kernel.ptr_pos else v for j, v in enumerate(runtime[i:], i)]
        spec = argument_spec(kernel.spec_slots, values)
        launcher = self.launcher_for(kernel, state, config, heur, spec, runtime)
        result = fastpath.launched(kernel, launcher, config, call, state.target)  # (Triton returns the binary)
        if call and (attrs := launch_attrs(call)):
            launcher = launcher.with_attrs(attrs)
        # The C launcher (where the extension is loaded) packs and launches for the Python path too: calls the C
        # path cannot take whole (config pre-hooks, keyword arguments, first calls) still skip the ctypes packing.
        # (Only for the launcher class itself: a subclass that changes the launch keeps it.)
        c_launcher = launcher.c_launcher() if kernel._c_launch and type(launcher) is _BinaryLauncher else None
        try:
            if c_launcher is None:
                launcher(grid, values)
            else:
                try:
                    c_launcher(grid, values)
                except (TypeError, ValueError, OverflowError):  # raised before any launch: a grid or value it
                    launcher(grid, values)  # leaves to the ctypes launcher (NaN, numpy scalars, huge grids)
        except struct.error:
            packing.out_of_range(kernel.function, kernel.int_checks, values, kernel.runtime, kernel.pointer_ints)
            raise
        if kernel._fast is not None:
            kernel._fast.last = None  # this launch is the latest (fastpath.best_config)
            if c_launcher is not None:
                fastpath.remember(kernel, state, runtime, call, c_launcher, config, spec, heur, result)
        kernel._last_config = config
        return result


class _ArgBuffer:
    """One thread's kernel-parameter block and the pointer array handed to the driver (reused each launch)."""

    __slots__ = ("args", "ctx", "ctx_ref", "params", "shift")

    def __init__(self, launcher: _BinaryLauncher) -> None:
        # packed from a 64-byte aligned offset: a tensor map parameter needs it, scalars less
        self.args = (ctypes.c_char * (launcher.block_size + TENSOR_MAP_ALIGN))()
        self.shift = -ctypes.addressof(self.args) % TENSOR_MAP_ALIGN
        base = ctypes.addressof(self.args) + self.shift
        self.params = launcher.params_type(*[base + off for off in launcher.offsets])
        self.ctx = ctypes.c_void_p()
        self.ctx_ref = ctypes.byref(self.ctx)


class _BinaryLauncher:
    """One loaded binary on one device, with its argument layout precomputed."""

    def __init__(self, kernel: Kernel, binary: dict[str, Any], path: str, device: int, max_shared: int) -> None:
        import torch

        with open(path, "rb") as f:
            image = f.read()
        digest = hashlib.sha256(image).hexdigest()
        if digest != binary["sha256"]:
            raise IntegrityError(f"{path}: sha256 {digest[:16]}… does not match the {binary['sha256'][:16]}… "
                                 "recorded when the package was built; the binary was modified or corrupted and is "
                                 "not launched (reinstall the package)")
        self.path = path
        self.spec = binary["spec"]
        self.drv = driver()
        self.device = device
        self.function = self.drv.load(device, image, binary["function"], binary["shared"], max_shared)
        self.block = binary["warp_size"] * binary["num_warps"]
        self.shared = binary["shared"]
        self.global_scratch = int(binary.get("global_scratch_size", 0))
        self.profile_scratch = int(binary.get("profile_scratch_size", 0))
        self.name = kernel.function
        self.symbol = binary["function"]
        """The function's name inside the binary."""
        # Arguments specialized to the constant 1 or to None are compiled into the binary, not passed; pointers
        # passed descriptors or integers are laid out as those (rules.binary_params, the cold launcher's too).
        kept, params = binary_params(kernel, binary)
        self.kept = kept
        self.select = (operator.itemgetter(*kept) if len(kept) > 1 else (lambda v, k=kept: [v[i] for i in k])) \
            if len(kept) < len(kernel.runtime) else None
        self.kinds = [fastpath.kind(ty) for _, ty in params]
        self.bf16_pos = [j for j, (_, ty) in enumerate(params) if ty == "bf16"]
        # The parameter block's C layout (each scalar aligned to its size, as ctypes lays out the Args struct
        # the Python path packs), with the two trailing pointers of Triton 3.6 kernels: global and profile
        # scratch. Computed here, not through ctypes: where the C launcher serves, the ctypes types are never made.
        self._types = [ty for _, ty in params]
        self.desc_slots = [j for j, ty in enumerate(self._types) if ty.startswith(DESC_PREFIX)]
        self._desc_layouts: tuple[Any, ...] | None = None
        if self.desc_slots:  # several parameters per tensor descriptor (descriptors.py, loaded for such kernels only)
            from .descriptors import c_layouts, launch_layout

            self._codes, self._expand = launch_layout(params, binary, _STRUCT_CODES, self.drv.encode_tensor_map)
            self._desc_layouts = c_layouts(params, binary)
        else:
            self._codes = ["Q" if ty.startswith("*") else _STRUCT_CODES[ty] for ty in self._types]
        self._codes += ["Q", "Q"]
        self.offsets, self.block_size = block_layout(self._codes)
        self.cuda = self.drv.backend == "cuda"
        self.ctx = self.drv.primary_context(device) if self.cuda else 0
        try:
            self.raw_stream = torch._C._cuda_getCurrentRawStream
        except AttributeError:  # pragma: no cover - older torch
            self.raw_stream = lambda d: torch.cuda.current_stream(d).cuda_stream
        self.torch = torch
        # scratch(size, programs) -> (keep-alive, address): one callable for the Python and the C path
        self.scratch = functools.partial(scratch_buffer, torch, device, self.raw_stream)
        self._c: Any = False
        self._siblings: dict[int, _BinaryLauncher] = {}

    attrs = 0
    """Launch attributes (``tables.LAUNCH_ATTR_*`` bits) this launcher sets; ``with_attrs`` makes the others."""

    def with_attrs(self, attrs: int) -> _BinaryLauncher:
        """This binary launched with launch attributes (a call's ``launch_pdl=True``...): same module, own C path."""
        sibling = self._siblings.get(attrs)
        if sibling is None:
            sibling = copy.copy(self)
            sibling.attrs, sibling._c = attrs, False
            self._siblings[attrs] = sibling  # two threads may both make one: either serves
        return sibling

    def c_launcher(self) -> Any:
        """This binary as a C ``Launcher`` (fastpath.py), made on first use; None where the C path cannot launch
        it (no extension, a driver without C entry points, a parameter block beyond its limits)."""
        if self._c is False:
            self._c = None
            entry = getattr(self.drv, "entry_points", None)
            if fastpath.c is not None and self.cuda and entry is not None and None not in self.kinds:
                points = entry()
                scratch = self.scratch if self.global_scratch or self.profile_scratch else None
                try:
                    self._c = fastpath.c.Launcher(
                        self.function, self.ctx, self.block, self.shared, tuple(self.kept), bytes(self.kinds),
                        tuple(self.offsets), self.block_size, self.global_scratch,
                        self.profile_scratch, scratch, self.raw_stream, self.device, self.drv.check, self.name,
                        points["launch"], points["ctx_get"], points["ctx_push"], points["ctx_pop"], self.attrs,
                        points.get("launch_ex", 0), self._desc_layouts, points.get("tensor_map", 0))
                except (TypeError, ValueError, OverflowError):
                    self._c = None
        return self._c

    # The pure-Python launch's own state, made on its first launch (a launch the C launcher serves needs none).
    @functools.cached_property
    def args_type(self) -> Any:
        """The parameter block as a ctypes structure (its layout is ``offsets``)."""
        fields = [(f"a{j}", ctypes.c_uint64 if ty.startswith("*") else _CTYPES[ty]) for j, ty in enumerate(self._types)]
        fields += [("global_scratch", ctypes.c_uint64), ("profile_scratch", ctypes.c_uint64)]
        args_type = type("Args", (ctypes.Structure,), {"_fields_": fields})
        assert [getattr(args_type, name).offset for name, _ in fields] == self.offsets
        assert ctypes.sizeof(args_type) == self.block_size
        return args_type

    @functools.cached_property
    def packer(self) -> struct.Struct:
        """One ``pack_into`` fills the whole parameter block: explicit padding reproduces the C layout."""
        return block_struct(self.offsets, self._codes)

    @functools.cached_property
    def params_type(self) -> Any:
        return ctypes.c_void_p * (len(self.offsets) + 1)  # NULL after the last, as the C launcher passes them

    @functools.cached_property
    def _tls(self) -> threading.local:
        return threading.local()

    def __call__(self, grid: Sequence[int], values: list[Any]) -> None:
        gx = grid[0]
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        if gx * gy * gz == 0:
            return
        if self.select is not None:
            values = list(self.select(values))
        for i in self.bf16_pos:
            values[i] = _pack_bf16(values[i])
        if self.desc_slots:
            values = self._expand(values)
        keep = None
        gs = ps = 0
        if self.global_scratch:
            keep, gs = self.scratch(self.global_scratch, gx * gy * gz)
        if self.profile_scratch:
            keep2, ps = self.scratch(self.profile_scratch, gx * gy * gz)
            keep = (keep, keep2)
        buf = getattr(self._tls, "buf", None)
        if buf is None:
            buf = self._tls.buf = _ArgBuffer(self)
        self.packer.pack_into(buf.args, buf.shift, *values, gs, ps)
        stream = self.raw_stream(self.device)
        drv = self.drv
        pushed = False
        if self.cuda:
            drv.ctx_get_current(buf.ctx_ref)
            if buf.ctx.value != self.ctx:
                # This thread runs under another context (another device, or none yet): launch under ours.
                drv.push(self.ctx)
                pushed = True
        try:
            if self.attrs:
                code = drv.launch_ex(self.function, gx, gy, gz, self.block, self.shared, stream, buf.params,
                                     self.attrs)
            else:
                code = drv.launch(self.function, gx, gy, gz, self.block, 1, 1, self.shared, stream, buf.params,
                                  None)
        finally:
            if pushed:
                drv.pop()
        if code != 0:
            drv.check(code, f"launch of {self.name} (grid {gx}x{gy}x{gz}, block {self.block})")
        del keep
