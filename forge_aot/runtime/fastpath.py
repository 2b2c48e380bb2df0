"""The C launch path: the optional ``_fastlaunch`` extension and what the Python path hands it.

``forge-aot build`` compiles ``_fastlaunch.c`` into the wheel (``_fastlaunch.abi3.so``, CPython's limited API:
one binary for every CPython >= 3.9). With it, ``kernel[grid](*args)`` is one C call for the common case: the
runtime arguments passed positionally, nothing chosen at the call site, no ``@triton.heuristics`` or config
pre-hooks, and a call
whose (dtypes, device, key values, specialization) the Python path has resolved once before (to a config
without a pre-hook). The C code reads the arguments as the Python path does (devices, dtypes, pointers, integer
ranges, fp16/bf16 encodings, Triton's specialization), finds the launch the Python path remembered for them,
evaluates the grid, packs the parameter block and calls ``cuLaunchKernel`` on torch's current stream under the
device's primary context. Every other call — and every call it cannot read exactly as the Python path would
(a CPU tensor, an integer out of range, a ``numpy`` scalar, ``LAUNCHES.skip``...) — goes to ``Kernel.run``
untouched, so errors and rare cases are the Python path's own.

Without the extension (a wheel built without a C compiler, a ``.so`` that does not load on this machine) or
with ``FORGE_NO_C_LAUNCH=1`` in the environment, the runtime is pure Python. ``use_c_launch(kernel, False)``
turns the C path off for one kernel handle.
"""

from __future__ import annotations

import os
from typing import Any

KINDS = {"*": 0, "i1": 1, "i8": 1, "i16": 2, "i32": 3, "i64": 4, "u8": 5, "u16": 6, "u32": 7, "u64": 8,
         "fp16": 9, "bf16": 10, "fp32": 11, "fp64": 12}
"""Argument kinds as _fastlaunch.c numbers them (``*`` is any pointer)."""
ABI = 1


def _load() -> Any:
    if os.environ.get("FORGE_NO_C_LAUNCH", "") not in ("", "0"):
        return None
    try:
        from . import _fastlaunch  # type: ignore[attr-defined]
    except Exception:  # absent, or built for another platform: the Python path serves every call
        return None
    return _fastlaunch if getattr(_fastlaunch, "ABI", None) == ABI else None


c: Any = _load()
"""The extension module, or None."""


def kind(ty: str) -> int | None:
    """The C kind of a signature type (``*fp16``, ``i32``...), or None for one the C path does not pack."""
    return KINDS.get("*" if ty.startswith("*") else ty)


def plan(kernel: Any) -> Any:
    """The C reading of a kernel's calls (a ``FastKernel``), or None when its calls never take the C path."""
    if c is None or not kernel._plain or kernel.spec.get("pre_hooks"):
        return None
    from .kernel import LAUNCHES
    kinds = [kind(ty) for _, ty in kernel.runtime]
    if None in kinds or not all(is_rt for is_rt, _ in kernel.key_sources + kernel.axis_sources):
        return None
    import torch

    try:
        return c.FastKernel(bytes(kinds), tuple(kernel.ptr_pos), tuple(p for p, _ in kernel.spec_slots),
                            tuple(int(is_ptr) for _, is_ptr in kernel.spec_slots),
                            tuple(src for _, src in kernel.axis_sources), tuple(src for _, src in kernel.key_sources),
                            (torch.Tensor, torch.nn.Parameter), torch.Tensor.get_device, torch.Tensor.data_ptr,
                            LAUNCHES)
    except (TypeError, ValueError, OverflowError):  # beyond the C path's limits (arguments, keys, dtypes)
        return None


def use_c_launch(kernel: Any, enabled: bool = True) -> bool:
    """Turn the C path on or off for one kernel handle; returns whether it is on (it stays off where the
    extension is absent, the backend is not the packaged one, or the kernel's calls never qualify)."""
    if c is None or not isinstance(kernel, c.KernelBase):
        return False
    fast = plan(kernel) if enabled and launches_from_c(kernel) else None
    kernel._set_fast(fast)
    return fast is not None


def launches_from_c(kernel: Any) -> bool:
    """Whether the kernel's calls may skip its Python ``run``: a backend class that declares ``c_launch = True``
    itself (``BinaryBackend``; a subclass inherits nothing, so one that changes the launch keeps the generic
    path), and a kernel class that keeps ``Kernel.run`` and ``Kernel.named_args``."""
    from .kernel import Kernel

    cls = type(kernel)
    return (bool(type(kernel.backend).__dict__.get("c_launch", False)) and cls.run is Kernel.run
            and cls.named_args is Kernel.named_args)


def remember(kernel: Any, runtime: Any, launcher: Any, config: Any, spec: str) -> None:
    """After the Python path launched a plain call: let the C path launch the same call from now on."""
    fast = kernel._fast
    c_launcher = launcher.c_launcher()
    if fast is not None and c_launcher is not None and type(runtime) is tuple:
        fast.register(runtime, c_launcher, config.launch_meta, config, spec)
