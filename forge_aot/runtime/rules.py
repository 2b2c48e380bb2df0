"""The rules every reading of the package index shares, and the host helpers every call path shares.

Launch options, specialization codes, which table row is nearest a key, which built target runs on a device, how a
kernel's parameters read (``read_params``); ``triton.cdiv``, ``next_power_of_2``, ``set_allocator`` and the launches'
global scratch; re-exported from ``basics`` and ``selection`` (variant ids, how binaries fit a call, ``Config``), which
the lean first calls read without this module. Kept apart from ``tables`` (config tables, constraints) and
``host_triton`` (the rest of ``triton`` in host code) because the first calls of plain kernels (``cold``) need these
and nothing else: one definition for every path, so they choose alike. Imports: stdlib, ``basics``, ``selection`` and
``packing``'s constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .basics import (  # noqa: F401  (defined there: the lean first calls read them without this module)
    _EXACT,
    _INTS,
    HEURISTICS_HOOK,
    INDEX_FORMAT,
    KERNEL_SIDE_HOOK,
    SIZE_HINTS,
    SPEC_ABSENT,
    SPEC_DESC,
    SPEC_DIV16,
    SPEC_INT,
    SPEC_INT_DIV16,
    SPEC_INT_ONE,
    SPEC_NONE,
    SPEC_ONE,
    _fits,
    _log2,
    _SizeHints,
    cdiv,
    max_shared,
    next_power_of_2,
    pick_cuda_target,
    rank_rows,
    spec_fits,
    spec_rank,
)
from .packing import _INT_RANGES, DESC_PREFIX
from .selection import Config, best_binary, named_args, run_heuristics, variant_id  # noqa: F401  (defined there)

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")
"""Triton launch options a call site may pass (``kernel[grid](..., num_warps=8)``); ``COMPILE_OPTIONS`` among them
only change how a binary is compiled (accelerated-scan passes ``enable_fp_fusion=False``: no contracted FMA)."""
COMPILE_OPTIONS = ("enable_fp_fusion",)
LAUNCH_DEFAULTS: dict[str, Any] = {"num_ctas": 1, "maxnreg": None, "enable_fp_fusion": True}
"""Launch options every binary is built with unless declared otherwise: a call passing these needs nothing."""
LAUNCH_FLAGS = ("launch_pdl", "launch_cooperative_grid")
"""Launch attributes a call may ask for, set as Triton 3.6's launcher does (``cuLaunchKernelEx``): programmatic
dependent launch (the kernel may start while the previous one ends; ``gdc_wait`` waits for it) and a cooperative
grid (every program resident at once). They change how a binary launches, never which: read per call."""
LAUNCH_ATTR_PDL, LAUNCH_ATTR_COOPERATIVE = 1, 2  # a launcher's ``attrs`` bits (the C launch path's too)
TRITON_DEFAULTS: dict[str, int] = {"num_warps": 4, "num_stages": 3}
"""Triton's own defaults, for a call that leaves out a launch option the kernel takes at the call site."""


def call_defaults(kernel: Any) -> tuple[list[tuple[str, Any]], list[str]]:
    """A kernel's call-site values (``read_params``) as ``Kernel._bind`` completes a call: (name, default) of each a
    call may leave out (constexpr defaults, Triton's launch option defaults, launch flags off; heuristic parameters a
    call may pass stay out: the heuristics compute them), and the constexprs without a default, which it must pass.
    The C path (``fastpath.plan``), cold handles and lean plans read them from here."""
    defaults = [(n, kernel.constexpr_defaults[n]) for n in kernel.call_constexprs if n in kernel.constexpr_defaults]
    defaults += [(n, LAUNCH_DEFAULTS.get(n, TRITON_DEFAULTS.get(n))) for n in kernel.launch_axes]
    defaults += [(n, False) for n in kernel.launch_flags]
    return defaults, [n for n in kernel.call_constexprs if n not in kernel.constexpr_defaults]


def ignored_options(launch_axes: Sequence[str]) -> dict[str, Any]:
    """The launch options a call may pass at their default (``LAUNCH_DEFAULTS``) where the kernel does not take them
    at the call site: read as not passed (the Triton tutorials' ``num_ctas=1``), as ``Kernel._bind`` reads them."""
    return {k: v for k, v in LAUNCH_DEFAULTS.items() if k not in launch_axes}

# (The specialization codes, spec_fits, rank_rows, pick_cuda_target, cdiv and next_power_of_2 are basics': the lean
# first calls read them without this module.)


def launch_attrs(call: dict[str, Any]) -> int:
    """The launch attributes (``LAUNCH_ATTR_*`` bits) a call's bound call-site values ask for."""
    return (LAUNCH_ATTR_PDL if call.get("launch_pdl") else 0) \
        | (LAUNCH_ATTR_COOPERATIVE if call.get("launch_cooperative_grid") else 0)


def binary_params(kernel: Any, binary: dict[str, Any]) -> tuple[list[int], list[tuple[str, str]]]:
    """How a binary of ``kernel`` takes a call's runtime arguments (both bindings' launchers lay it out so): the
    positions it takes (those specialized to the constant 1 or None are compiled in, not passed) and, per position,
    (name, type) as the binary takes it: a pointer parameter passed a tensor descriptor (code T) as a descriptor,
    one passed an integer (codes i, d) as that integer (``*i32|i32``)."""
    codes = {pos: code for (pos, _), code in zip(kernel.spec_slots, binary["spec"])}
    kept = [i for i in range(len(kernel.runtime)) if codes.get(i) not in (SPEC_ONE, SPEC_ABSENT, SPEC_INT_ONE)]
    params = [(kernel.runtime_names[i], DESC_PREFIX + ">") if codes.get(i) == SPEC_DESC else
              (kernel.runtime_names[i], kernel.pointer_ints[i]) if codes.get(i) in (SPEC_INT, SPEC_INT_DIV16)
              else kernel.runtime[i] for i in kept]
    return kept, params


# Which packaged target runs on this device

def pick_hip_target(gfx: str, targets: dict[str, dict[str, Any]]) -> str | None:
    """The built HIP target for a device whose gfx name (``gfx942:sramecc+:xnack-``) is given: exact only."""
    base = gfx.split(":")[0]
    for name, info in targets.items():
        if info["backend"] == "hip" and info["arch"] == base:
            return name
    return None


def read_params(kernel: Any, spec: dict[str, Any]) -> None:
    """Set on ``kernel`` how its calls read: the parameters' kinds and positions, the variant axes and the table key
    and where a call gives each (``Kernel`` and the first call's ``ColdKernel`` alike, so the C path reads both
    the same: ``fastpath.plan``)."""
    params = spec["params"]
    kinds = {"meta", "constexpr", "heuristic"}
    kernel.param_names = [p[0] for p in params]
    kernel.runtime = [(n, t) for n, t in params if t not in kinds]
    kernel.runtime_names = [n for n, _ in kernel.runtime]
    kernel.meta_names = {n for n, t in params if t == "meta"}
    # constexpr parameters the heuristics compute, then launch options they compute (``num_warps``...)
    kernel.heuristic_names = [n for n, t in params if t == "heuristic"] + spec.get("launch_heuristics", [])
    kernel.axes = list(spec["axes"])
    kernel.launch_axes = [a for a in kernel.axes if a in LAUNCH_OPTIONS]
    # Call-site constexprs and launch options: the values the call passes select the build.
    kernel.call_constexprs = [n for n, t in params if t == "constexpr"]
    # Launch attributes host code passes (launch_pdl=...), bound with their defaults: the C path reads them too.
    kernel.launch_flags = [f for f in LAUNCH_FLAGS if f in spec.get("launch_flags", ())]
    # Heuristic parameters host code also passes (Unsloth: DO_SOFTCAPPING=..., coerced by its heuristic).
    kernel.call_heuristics = spec.get("call_heuristics", [])
    kernel.call_names = {*kernel.call_constexprs, *kernel.launch_axes, *kernel.launch_flags, *kernel.call_heuristics}
    kernel.constexpr_defaults = spec.get("constexpr_defaults", {})
    kernel.n_runtime = len(kernel.runtime)
    kernel._runtime_first = kernel.param_names[: kernel.n_runtime] == kernel.runtime_names  # (fast binding, as usual)
    kernel.ptr_pos = [i for i, (_, t) in enumerate(kernel.runtime) if t.startswith("*")]
    kernel.desc_pos = [i for i, (_, t) in enumerate(kernel.runtime) if t.startswith(DESC_PREFIX)]  # see descriptors
    kernel.written_pos = tuple(i for i, n in enumerate(kernel.runtime_names) if n in spec.get("writes", ()))  # guard
    kernel.grid_args = spec.get("grid_args", [])  # what a grid function puts in (vLLM's causal_conv1d: Kernel.run)
    kernel.device_pos = kernel.ptr_pos + kernel.desc_pos  # a descriptor answers get_device() for its tensor
    kernel.int_pos = [i for i, (_, t) in enumerate(kernel.runtime) if t in _INT_RANGES]
    # Pointer parameters a call may also pass an integer (manifest type ``*i32|i32``): position -> its type.
    kernel.pointer_ints = {kernel.runtime_names.index(n): t for n, t in spec.get("pointer_ints", {}).items()}
    spec_params = spec.get("spec_params", [])
    # (position, is pointer) of every argument specialized like Triton's JIT does, in order.
    kernel.spec_slots = [(kernel.runtime_names.index(n), kernel.runtime[kernel.runtime_names.index(n)][1]
                          .startswith("*")) for n in spec_params]
    kernel.int_checks = [(i, kernel.runtime[i][0], kernel.runtime[i][1], *_INT_RANGES[kernel.runtime[i][1]])
                         for i in kernel.int_pos]
    type_args = spec["dtype_args"]
    kernel.type_vars = [(tv, kernel.runtime_names.index(type_args[tv])) for tv in kernel.axes if tv in type_args]
    # How each variant axis is read: (True, runtime position) for a type variable's tensor, (False, name) else.
    kernel.axis_sources = [(True, kernel.runtime_names.index(type_args[a])) if a in type_args else (False, a)
                           for a in kernel.axes]
    kernel.key_sources = [(True, kernel.runtime_names.index(k)) if k in kernel.runtime_names
                          else (False, k) for k in spec["key"]]


SCRATCH_ALLOCATOR: list[Any] = [None]
"""The allocator host code gave ``triton.set_allocator`` (one per process, as in Triton), or None: the runtime
then allocates kernels' global scratch (tensor descriptors built in the kernel) through torch itself."""


def set_allocator(allocator: Any) -> None:
    """``triton.set_allocator``: ``allocator(size, alignment, stream)`` returns a buffer (an object with
    ``data_ptr()``) for a launch's global scratch, as under Triton's JIT."""
    SCRATCH_ALLOCATOR[0] = allocator


_SCRATCH_ALIGN = 256


def scratch_buffer(torch: Any, device: int, raw_stream: Any, size: int, programs: int) -> tuple[Any, int]:
    """Global or profile scratch for one launch: a buffer (kept alive until the launch returns) and its address,
    256-byte aligned. From the host code's ``triton.set_allocator`` allocator where it gave one, else torch."""
    allocator = SCRATCH_ALLOCATOR[0]
    if allocator is not None:
        buf = allocator(programs * size, _SCRATCH_ALIGN, raw_stream(device))
        ptr = buf.data_ptr()
        if ptr % _SCRATCH_ALIGN == 0:
            return buf, ptr
        from .errors import ForgeRuntimeError

        raise ForgeRuntimeError(f"the triton.set_allocator allocator returned an address ({ptr:#x}) that is not "
                                f"{_SCRATCH_ALIGN}-byte aligned")
    buf = torch.empty(programs * size + _SCRATCH_ALIGN, dtype=torch.uint8, device=f"cuda:{device}")
    ptr = buf.data_ptr()
    return buf, (ptr + _SCRATCH_ALIGN - 1) // _SCRATCH_ALIGN * _SCRATCH_ALIGN
