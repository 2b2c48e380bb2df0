"""What a cold handle (``cold``) launches with: a binary loaded as a C ``Launcher`` (laid out as
``launch._BinaryLauncher`` lays it out), the devices' figures, what a launch returns, and what the C path hands back
where a kernel's heuristics give values it has not seen. Imports: stdlib, the C extension (``fastpath``), ``drivers``,
``packing``, ``rules``, ``lean_launch`` (the C ``Launcher`` made as lean handles make it)."""

from __future__ import annotations

import hashlib
import os
import weakref
from typing import Any

from . import fastpath
from .drivers import driver
from .lean_launch import new_launcher
from .packing import _STRUCT_CODES, DESC_PREFIX, block_layout
from .rules import Config, binary_params

DEVICES: dict[int, dict[str, Any]] = {}
"""Device index → ``driver().describe(index)``, asked once per process."""


def device_info(device: int) -> dict[str, Any]:
    """The device's name, capability and shared memory (``DEVICES``)."""
    info = DEVICES.get(device)
    if info is None:
        info = DEVICES[device] = driver().describe(device)
    return info


def block_of(kernel: Any, binary: dict[str, Any]) -> tuple[tuple[int, ...], bytes, tuple[int, ...], int] | None:
    """A binary's parameter block as its C ``Launcher`` takes it: the runtime positions passed, their C kinds, the
    offsets (the two scratch pointers last) and the size; None where it takes descriptors (the full launcher lays
    those out)."""
    kept, params = binary_params(kernel, binary)
    types_ = [ty for _, ty in params]
    if any(ty.startswith(DESC_PREFIX) for ty in types_):
        return None
    offsets, size = block_layout(["Q" if t.startswith("*") else _STRUCT_CODES[t] for t in types_] + ["Q", "Q"])
    return tuple(kept), bytes(fastpath.kind(t) for t in types_), tuple(offsets), size


def load_launcher(kernel: Any, cold: Any, binary: dict[str, Any], device: int, attrs: int = 0) -> Any:
    """A binary of ``kernel`` (a ``ColdKernel``; ``cold``: its ``cold._Cold``) loaded on a device (its sha256
    checked: a mismatch is the full path's to report) as a C ``Launcher`` with the launch attributes ``attrs``
    (``rules.launch_attrs``), kept in ``cold.launchers`` under ``cold.lock``; None where the C path cannot launch it.
    Launchers of one binary with other attributes share its module (``cold.functions``), as the full path's
    ``_BinaryLauncher.with_attrs`` siblings do."""
    drv = driver()
    points = getattr(drv, "entry_points", None)
    if points is None:
        return None
    key, loaded = (device, binary["path"], attrs), (device, binary["path"])
    image = None
    if loaded not in cold.functions:
        with open(os.path.join(cold.root, binary["path"]), "rb") as f:
            image = f.read()
        if hashlib.sha256(image).hexdigest() != binary["sha256"]:
            return None
    layout = block_of(kernel, binary)
    if layout is None:
        return None
    with cold.lock:
        launcher = cold.launchers.get(key)
        if launcher is None:
            entry = points()
            if attrs and not entry.get("launch_ex"):  # (a driver without cuLaunchKernelEx: the full path says so)
                return None
            function = cold.functions.get(loaded)
            if function is None:  # (then the image was read above: functions are never dropped)
                function = cold.functions[loaded] = drv.load(device, image, binary["function"], binary["shared"],
                                                             device_info(device)["max_shared"])
            launcher = new_launcher(function, drv.primary_context(device), binary, layout, device, drv.check,
                                    kernel.function, entry, attrs)
            cold.launchers[key] = launcher
    return launcher


def new_heuristic_values(config: Config, kernel: Any, grid: Any, runtime: tuple[Any, ...], call: dict[str, Any],
                         heur: tuple[Any, ...]) -> Any:
    """What the C path hands a cold handle's call whose heuristics gave values it has not seen for a call it knows
    (flash-attention 2's ``EVEN_N`` over a length that is neither key nor specialized; a lean handle's too, made cold
    by ``lean_launch.Lean._late``; ``fastpath``'s ``_launch_after_hooks`` for a full handle; the heuristics ran once,
    in C): the binary of those values launched by the cold handle, else by the full path for the config the C path
    resolved (the handle promoted)."""
    from .cold import _MISSING, promoted

    cold = kernel.__dict__.get("_cold")
    if cold is not None:
        result = kernel._launch_bound(cold, grid, runtime, call, heur)
        if result is not _MISSING:
            return result
    kernel = promoted(kernel)
    return kernel.backend.launch(kernel, kernel._state(runtime, call), config, grid, runtime, call, heur)


class ColdLaunched:
    """What a cold handle's launch returns, as ``fastpath.Launched`` (Triton returns the binary it ran): the full
    result, made on the first attribute read (which promotes the handle; its binary is loaded again there, as the
    full path's own)."""

    __slots__ = ("_made", "_of", "config")

    def __init__(self, kernel: Any, binary: dict[str, Any], config: Config, call: dict[str, Any], device: int,
                 target: str) -> None:
        self._of = (weakref.ref(kernel), binary, call, device, target)
        self.config = config
        self._made: Any = None

    def _launched(self) -> Any:
        if self._made is None:
            from .cold import promoted

            ref, binary, call, device, target = self._of
            kernel = ref()
            if kernel is None:
                raise ReferenceError("the kernel handle this launch ran is gone")
            kernel = promoted(kernel)
            self._made = fastpath.launched(kernel, kernel.backend.load(kernel, binary, device), self.config,
                                           dict(call), target)
        return self._made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._launched(), name)

    def __getitem__(self, grid: Any) -> Any:
        return self._launched()[grid]

    def __repr__(self) -> str:
        return repr(self._launched())
