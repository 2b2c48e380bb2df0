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
- ``host_modules``: running the shipped host code, the package entry point.
"""

from .errors import (
    DriverError,
    ForgeRuntimeError,
    IntegrityError,
    NotBuiltError,
    UnsupportedDeviceError,
    UnsupportedDtypeError,
)
from .expressions import Expression
from .host_modules import (
    INDEX_FORMAT,
    bind_module,
    bind_ops,
    exec_host_module,
    load_index,
    load_package,
    register_torch_ops,
)
from .host_triton import _HostTriton, cdiv, host_triton, next_power_of_2
from .kernel import Kernel
from .launch import BinaryBackend, _BinaryLauncher, choose_binary
from .packing import _pack_bf16, _pack_fp16, dtype_name
from .tables import (
    HEURISTICS_HOOK,
    LAUNCH_DEFAULTS,
    LAUNCH_OPTIONS,
    SPEC_DIV16,
    SPEC_NONE,
    SPEC_ONE,
    TRITON_DEFAULTS,
    Config,
    ConfigTable,
    argument_spec,
    pick_cuda_target,
    pick_hip_target,
    rank_rows,
    resolve_table,
    spec_fits,
    spec_rank,
    variant_id,
)

__all__ = [
    "HEURISTICS_HOOK",
    "INDEX_FORMAT",
    "LAUNCH_DEFAULTS",
    "LAUNCH_OPTIONS",
    "SPEC_DIV16",
    "SPEC_NONE",
    "SPEC_ONE",
    "TRITON_DEFAULTS",
    "BinaryBackend",
    "Config",
    "ConfigTable",
    "DriverError",
    "Expression",
    "ForgeRuntimeError",
    "IntegrityError",
    "Kernel",
    "NotBuiltError",
    "UnsupportedDeviceError",
    "UnsupportedDtypeError",
    "_BinaryLauncher",
    "_HostTriton",
    "_pack_bf16",
    "_pack_fp16",
    "argument_spec",
    "bind_module",
    "bind_ops",
    "cdiv",
    "choose_binary",
    "dtype_name",
    "exec_host_module",
    "host_triton",
    "load_index",
    "load_package",
    "next_power_of_2",
    "pick_cuda_target",
    "pick_hip_target",
    "rank_rows",
    "register_torch_ops",
    "resolve_table",
    "spec_fits",
    "spec_rank",
    "variant_id",
]
