"""The runtime package's names (its ``__getattr__`` and ``dir()``): what each is exported from, loaded on first access.

Apart from the package's ``__init__`` (which every fresh process runs first, so it holds nothing else): forge-aot
and the tests read these names; a wheel's own modules import what they need by module.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_PACKAGE = __name__.rpartition(".")[0]

_EXPORTS = {
    "DriverError": "errors", "ForgeRuntimeError": "errors", "IntegrityError": "errors", "NotBuiltError": "errors",
    "UnsupportedDeviceError": "errors", "UnsupportedDtypeError": "errors", "Expression": "expressions",
    "INDEX_FORMAT": "host_modules", "bind_module": "host_modules", "bind_ops": "dev_binding",
    "exec_host_module": "host_modules", "imports_first": "dev_binding", "project_names_bound": "dev_binding",
    "load_index": "host_modules", "register_torch_ops": "dev_binding", "register_custom_ops": "custom_ops",
    "route_in_module": "torch_ops", "ROUTING": "torch_ops", "load_package": "entry", "_HostTriton": "host_triton",
    "HOST_DTYPES": "host_triton", "HostDtype": "host_triton", "cdiv": "host_triton", "host_triton": "host_triton",
    "next_power_of_2": "host_triton", "Kernel": "kernel", "TensorDescriptor": "descriptors",
    "desc_dtype": "descriptors", "desc_signature": "descriptors", "PlaceholderCompiled": "compiled",
    "launched": "fastpath", "CompiledBase": "compiled", "DEVICE_PROFILE": "host_driver", "GPUTarget": "host_driver",
    "BinaryBackend": "launch", "_BinaryLauncher": "launch", "choose_binary": "tables", "_pack_bf16": "packing",
    "_pack_fp16": "packing", "dtype_name": "packing", "HEURISTICS_HOOK": "tables", "KERNEL_SIDE_HOOK": "tables",
    "LAUNCH_DEFAULTS": "tables", "LAUNCH_OPTIONS": "tables", "COMPILE_OPTIONS": "tables", "LAUNCH_FLAGS": "tables",
    "launch_attrs": "rules", "SPEC_DIV16": "tables", "SPEC_ABSENT": "tables", "SPEC_DESC": "tables",
    "pointer_value": "tables", "block_shapes": "descriptors", "SPEC_NONE": "tables", "SPEC_ONE": "tables",
    "SPEC_INT": "tables", "SPEC_INT_DIV16": "tables", "SPEC_INT_ONE": "tables", "PointerInt": "tables",
    "TRITON_DEFAULTS": "tables", "Config": "tables", "ConfigTable": "tables", "argument_spec": "tables",
    "pick_cuda_target": "tables", "pick_hip_target": "tables", "rank_rows": "tables", "resolve_table": "tables",
    "spec_fits": "tables", "spec_rank": "tables", "variant_id": "tables", "BUNDLED": "bundling",
    "use_bundle": "bundle", "write_bundle": "bundle", "bundle_path": "bundle", "first_call_done": "bundle",
    "run_first_call": "bundle", "source": "bundle", "FIRST_CALL": "bundle", "BUNDLE_FORMAT": "bundle",
}
_SUBMODULES = frozenset({"compiled", "cuda", "cuda_ctypes", "descriptors", "drivers", "entry", "errors", "expressions",
                        "fastpath", "hip", "host_driver", "host_modules", "host_triton", "kernel", "launch",
                        "local_imports", "packing", "tables", "torch_ops", "fake_env", "bundling", "custom_ops",
                        "bundle", "dev_binding", "host_decorators", "rules", "cold", "cold_binding", "exports",
                        "host_exec", "cold_launch", "lean", "names", "basics", "lean_kernel",
                        "lean_launch", "host_values", "host_language", "selection"})


def attribute(name: str) -> Any:
    """The runtime package's attribute ``name`` (its ``__getattr__``), kept on the package once loaded."""
    package = sys.modules[_PACKAGE]
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", _PACKAGE), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", _PACKAGE)
    elif name == "__all__":
        value = sorted(_EXPORTS)
    else:
        raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
    vars(package)[name] = value
    return value


def listing() -> list[str]:
    """The runtime package's ``dir()``."""
    return sorted({*vars(sys.modules[_PACKAGE]), *_EXPORTS, *_SUBMODULES})


class _Runtime(types.ModuleType):
    """``host_triton`` names both a submodule and the object exported from it: importing the submodule (lazily,
    whenever another module needs it) must not replace the exported object."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and name in _SUBMODULES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


# Installed when this module loads: the package's __getattr__ loads it, and so does ``host_triton`` (whose
# import would otherwise replace the exported object on the package).
sys.modules[_PACKAGE].__class__ = _Runtime
