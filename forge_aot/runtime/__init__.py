"""forge-aot runtime: launches the binaries packaged in a wheel through the GPU driver API.

Shipped verbatim inside every generated package as ``<package>/_runtime``. It needs torch (tensors, streams)
and the GPU driver (``libcuda.so.1`` or ``libamdhip64.so``) only: never Triton, never forge-aot, never a
compiler, so every import here is relative. forge-aot imports this same package for its development mode and
its build-time checks, so the rules (table lookup, binary selection, constraints) are the same in the source
tree and in the wheel. One module per concern:

- ``errors``: the error hierarchy;      ``expressions``: the constraint language;
- ``host_triton``: ``triton`` in host code;      ``tables``: variants, specializations, configs, targets;
- ``cuda``, ``hip``, ``drivers``: the driver libraries;      ``packing``: argument encodings;
- ``kernel``: kernel handles and call binding;      ``launch``: binary choice, loading, the launch;
- ``host_modules``: running the shipped host code;      ``entry``: the package entry point (lazy);
- ``fastpath``: the optional C launch path (``_fastlaunch.c``, compiled into wheels by ``forge-aot build``).

Names are loaded on first access (PEP 562): ``import <package>`` imports this file and ``entry`` only.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_EXPORTS = {
    "DriverError": "errors",
    "ForgeRuntimeError": "errors",
    "IntegrityError": "errors",
    "NotBuiltError": "errors",
    "UnsupportedDeviceError": "errors",
    "UnsupportedDtypeError": "errors",
    "Expression": "expressions",
    "INDEX_FORMAT": "host_modules",
    "bind_module": "host_modules",
    "bind_ops": "host_modules",
    "exec_host_module": "host_modules",
    "load_index": "host_modules",
    "register_torch_ops": "host_modules",
    "load_package": "entry",
    "_HostTriton": "host_triton",
    "cdiv": "host_triton",
    "host_triton": "host_triton",
    "next_power_of_2": "host_triton",
    "Kernel": "kernel",
    "BinaryBackend": "launch",
    "_BinaryLauncher": "launch",
    "choose_binary": "launch",
    "_pack_bf16": "packing",
    "_pack_fp16": "packing",
    "dtype_name": "packing",
    "HEURISTICS_HOOK": "tables",
    "LAUNCH_DEFAULTS": "tables",
    "LAUNCH_OPTIONS": "tables",
    "SPEC_DIV16": "tables",
    "SPEC_NONE": "tables",
    "SPEC_ONE": "tables",
    "TRITON_DEFAULTS": "tables",
    "Config": "tables",
    "ConfigTable": "tables",
    "argument_spec": "tables",
    "pick_cuda_target": "tables",
    "pick_hip_target": "tables",
    "rank_rows": "tables",
    "resolve_table": "tables",
    "spec_fits": "tables",
    "spec_rank": "tables",
    "variant_id": "tables",
}
_SUBMODULES = frozenset({"cuda", "drivers", "entry", "errors", "expressions", "fastpath", "hip", "host_modules",
                         "host_triton", "kernel", "launch", "packing", "tables"})
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})


class _Runtime(types.ModuleType):
    """``host_triton`` names both a submodule and the object exported from it: importing the submodule (lazily,
    whenever another module needs it) must not replace the exported object."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and name in _SUBMODULES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Runtime
