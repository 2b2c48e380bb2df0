"""The C launch path: the optional ``_fastlaunch`` extension and what the Python path hands it.

``forge-aot build`` compiles ``_fastlaunch.c`` into the wheel (``_fastlaunch.abi3.so``, CPython's limited API:
one binary for every CPython >= 3.9). With it, ``kernel[grid](*args, **kwargs)`` is one C call (parameters by
position or by name, in whatever order the kernel declares them; launch options as keywords) once the Python path
has resolved the call's (dtypes, call-site values, device, key values, specialization) before. The C code reads
the arguments as the Python path does (devices, dtypes, pointers, integer ranges, fp16/bf16 encodings, Triton's
specialization), finds the launch the Python path remembered for them, evaluates the grid, packs the parameter
block and calls ``cuLaunchKernel`` (``cuLaunchKernelEx`` for a call with launch attributes, ``launch_pdl=True``...)
on torch's current stream under the device's primary context.
For a kernel with ``@triton.heuristics`` or a config ``pre_hook`` it calls the heuristics, then the pre-hook, on
the arguments by name as ``Kernel.run`` does; host-side tensor descriptors (``tensordesc<T>`` parameters, or pointer
parameters passed one, as the Triton tutorials' TMA matmul and attention do) are read after that, their tensor maps
encoded through the driver (and remembered per binary); it launches the binary the Python path resolved for those
heuristic values and block shapes. Values not seen before are launched by the Python path from that point on
(``BinaryBackend.launch``), which remembers them: heuristics and pre-hooks run once per call. Every other call,
and every call it cannot read exactly as the Python path would (a CPU tensor, an integer out of range, a
``numpy`` scalar, an unknown keyword, ``LAUNCHES.skip``...), goes to ``Kernel.run`` untouched: errors and rare
cases are the Python path's.

Without the extension (a wheel built without a C compiler, a ``.so`` that does not load on this machine) or
with ``FORGE_NO_C_LAUNCH=1`` in the environment, the runtime is pure Python. ``use_c_launch(kernel, False)``
turns the C path off for one kernel handle (its launches then pack through ctypes too: the pure-Python path).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from .basics import ABI, FILENAME, LAUNCHES, _LaunchState, extension, fast_kernel  # noqa: F401  (read here by the rest)

KINDS = {"*": 0, "i1": 1, "i8": 1, "i16": 2, "i32": 3, "i64": 4, "u8": 5, "u16": 6, "u32": 7, "u64": 8,
         "fp16": 9, "bf16": 10, "fp32": 11, "fp64": 12, "tensordesc": 13}
"""Argument kinds as _fastlaunch.c numbers them (``*`` is any pointer, ``tensordesc`` a host tensor descriptor)."""

c: Any = extension()
"""The extension module, or None (loaded once per process: ``basics.extension``)."""


def kind(ty: str) -> int | None:
    """The C kind of a signature type (``*fp16``, ``i32``, ``tensordesc<T>``...), or None for one the C path does
    not pack."""
    return KINDS.get("*" if ty.startswith("*") else "tensordesc" if ty.startswith("tensordesc<") else ty)


_MISSING = object()
"""Default of a call-site constexpr that has none (a call must pass it; the Python path says so)."""


def reading(kernel: Any) -> dict[str, Any] | None:
    """How the C path reads a kernel's calls, as plain data (what a build could write down beside the index), or
    None when its calls never take the C path: ``plan`` hands it to ``FastKernel`` with the process's own objects
    (tensor types, ``LAUNCHES``, the heuristics, the defaults' missing marker). ``names``: the call-site
    constexprs, launch options and heuristic parameters a call may pass, in the order ``plan``'s defaults follow."""
    kinds = [kind(ty) for _, ty in kernel.runtime]
    if None in kinds or kernel.grid_args:  # (a grid function that puts arguments in: Kernel.run reads them back)
        return None
    names = (*kernel.call_constexprs, *kernel.launch_axes, *kernel.launch_flags, *kernel.call_heuristics)
    return {"kinds": bytes(kinds), "device_pos": tuple(kernel.device_pos),
            "spec_pos": tuple(p for p, _ in kernel.spec_slots),
            "spec_ptr": tuple(int(is_ptr) for _, is_ptr in kernel.spec_slots),
            "axis_pos": tuple(src for is_rt, src in kernel.axis_sources if is_rt),
            "key_pos": tuple(src for is_rt, src in kernel.key_sources if is_rt), "names": names,
            "runtime_names": tuple(kernel.runtime_names), "heuristic_names": tuple(kernel.heuristic_names),
            "type_next": _type_next(kernel), "param_slots": _param_slots(kernel, names),
            "pointer_ints": tuple(kernel.pointer_ints),
            "pointer_int_kinds": bytes(KINDS[t] for t in kernel.pointer_ints.values()),
            "written_pos": kernel.written_pos}  # checked while a custom op's guard stands (guard.py)


def plan(kernel: Any) -> Any:
    """The C reading of a kernel's calls (a ``FastKernel``), or None when its calls never take the C path."""
    if c is None:
        return None
    read = reading(kernel)
    if read is None:
        return None
    from .rules import call_defaults, ignored_options

    # Call-site constexprs and launch options, with the defaults Kernel._bind gives those a call leaves out.
    given = dict(call_defaults(kernel)[0])
    defaults = tuple(given.get(n, _MISSING) for n in read["names"])
    import torch

    if getattr(torch.version, "hip", None):
        return None  # the C launcher drives CUDA only: on ROCm every call takes the Python path
    # Heuristics, as Kernel.run calls them: in registration order, on the arguments by name.
    try:
        return fast_kernel(c, read, defaults, _MISSING, kernel.heuristics, ignored_options(kernel.launch_axes))
    except (TypeError, ValueError, OverflowError):  # beyond the C path's limits (arguments, keys, dtypes)
        return None


def _type_next(kernel: Any) -> tuple[int, ...]:
    """Per runtime argument typed with a type variable, the next argument of that type (else -1): where the first
    is None the C path reads the next, as ``Kernel.axis_values`` does."""
    types = [ty for _, ty in kernel.runtime]
    tv_types = {types[src] for is_rt, src in kernel.axis_sources if is_rt}
    return tuple(next((j for j in range(i + 1, len(types)) if types[j] == ty), -1) if ty in tv_types else -1
                 for i, ty in enumerate(types))


def _param_slots(kernel: Any, names: tuple[str, ...]) -> tuple[int, ...]:
    """What each parameter, in order, is to the C path when a call passes it by position: its runtime index, or
    the number of runtime arguments plus its index in ``names`` (call-site constexprs: mamba passes ``IS_RMS_NORM,
    BLOCK_N, ...`` after its runtime arguments, Liger's cross entropy has constexprs between them), or -1 (tuned or
    heuristic: the Python path binds or refuses it)."""
    n = kernel.n_runtime
    return tuple(kernel.runtime_names.index(p) if p in kernel.runtime_names else n + names.index(p) if p in names
                 else -1 for p in kernel.param_names)


def use_c_launch(kernel: Any, enabled: bool = True) -> bool:
    """Turn the C path on or off for one kernel handle; returns whether it is on (it stays off where the
    extension is absent, the backend is not the packaged one, or the kernel's calls never qualify)."""
    if c is None or not isinstance(kernel, c.KernelBase):
        return False
    promote = getattr(type(kernel), "_promoted", None)
    while promote is not None:  # a lean or cold handle: the full Kernel's paths are the ones chosen between
        kernel = promote(kernel)
        promote = getattr(type(kernel), "_promoted", None)
    kernel._c_launch = enabled
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


def remember(kernel: Any, state: Any, runtime: Any, call: dict[str, Any], c_launcher: Any, config: Any, spec: str,
             heur: tuple[Any, ...] = (), result: Any = None) -> None:
    """After the Python path launched a call through ``c_launcher`` (its binary's C ``Launcher``) with its runtime
    arguments bound in order in ``runtime`` (a tuple, or the list the Python path bound from keywords) and its
    call-site values in ``call`` (and, for a kernel with heuristics, their values ``heur``), resolved in ``state``
    (``kernel._state``) to ``config``: let the C path launch such calls from now on, by position or by name. For
    values the C path resolves per call (heuristics, the config's pre-hook, tensor descriptors' block shapes), it
    launches those it has not seen through ``BinaryBackend.launch`` with this state and config."""
    fast = kernel._fast
    if fast is not None:
        c_launcher.result = result  # what the C path's launches of this binary return (``Launched``)
        runtime = tuple(runtime)
        named = config.all_kwargs() if heur or config.pre_hook else None
        fast.register(runtime, call, c_launcher, config.launch_meta, config, spec, heur, named, config.pre_hook,
                      functools.partial(_launch_after_hooks, state, config))


def _launch_after_hooks(state: Any, config: Any, kernel: Any, grid: Any, runtime: tuple[Any, ...],
                        call: dict[str, Any], heur: tuple[Any, ...]) -> Any:
    """What the C path hands a call whose heuristics and pre-hook it ran, when their values (or the descriptors'
    block shapes) are new to it: the rest of ``Kernel.run``. (Bound to the state and config only: the C path's
    cache holds it, and a reference to the kernel would keep the kernel alive through its own ``_fast``.)"""
    return kernel.backend.launch(kernel, state, config, grid, runtime, call, heur)


class Launched:
    """What ``kernel[grid](...)`` returns, as Triton's launch returns the ``CompiledKernel`` it ran (Unsloth's MoE
    GEMMs log ``.name``, ``.n_regs``, ``.n_spills``, ``.metadata`` of it after every launch): the binary's
    ``compiled.CompiledKernel``, made on the first attribute read (a launch loads no more of the runtime) and kept,
    so the driver is asked its figures once. One per binary, made by its first launch. It holds its binary's
    launcher, which holds it, and its kernel only weakly until that first read: a cycle the collector does not see
    through the C ``Launcher`` (a discarded kernel's binaries, and once read its handle, stay loaded)."""

    __slots__ = ("_made", "_of")

    def __init__(self, kernel: Any, launcher: Any, config: Any, call: dict[str, Any], target: str) -> None:
        self._of = (weakref.ref(kernel), launcher, config, call, target)
        self._made: Any = None

    def _compiled(self) -> Any:
        if self._made is None:
            from .compiled import CompiledKernel

            ref, launcher, config, call, target = self._of
            kernel = ref()
            if kernel is None:
                raise ReferenceError("the kernel handle this launch ran is gone")
            self._made = CompiledKernel(kernel, launcher, config, call, kernel.targets[target])
        return self._made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled(), name)

    def __getitem__(self, grid: Any) -> Any:
        return self._compiled()[grid]

    def __repr__(self) -> str:
        return repr(self._compiled())


def best_config(kernel: Any) -> Any:
    """``kernel.best_config``: as Triton's autotuner keeps the config its last call ran (Unsloth's MoE GEMMs log it
    after every autotuned launch), the config (``tables.Config``) of the binary this handle last launched, None
    before any launch. The C path keeps its last launch (``FastKernel.last``); a launch by the Python path keeps its
    config (``_last_config``; development mode's too) and forgets the C path's, so the C path's, where set, is the
    latest."""
    last = kernel._fast.last if kernel._fast is not None else None
    return last._of[2] if last is not None else kernel.__dict__.get("_last_config")


def launched(kernel: Any, launcher: Any, config: Any, call: dict[str, Any], target: str) -> Launched:
    """The ``Launched`` of a binary's launches (``launcher``: its ``_BinaryLauncher``), made once."""
    result = getattr(launcher, "launched", None)
    if result is None:
        result = launcher.launched = Launched(kernel, launcher, config, call, target)
    return result


def not_launched(kernel: Any, call: dict[str, Any]) -> Any:
    """What a launch returns where launches are skipped (a custom op's Meta implementation), as the build's trace
    returns it: a placeholder compiled kernel (``compiled.PlaceholderCompiled``)."""
    from .compiled import PlaceholderCompiled

    return PlaceholderCompiled(kernel, call)
