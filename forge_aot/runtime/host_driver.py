"""``triton.runtime.driver`` in packaged host code, and torch.library's Triton entry points.

Host code written like the Triton tutorial "Fused Softmax" or flash-linear-attention's ``utils`` asks Triton's
driver about the device (its properties, its target); host code in PyTorch's style launches through
``torch.library.wrap_triton`` and decorates ops with ``@triton_op`` or ``@torch.library.custom_op``. The host
``triton`` (host_triton) loads this module where host code first reads ``triton.runtime`` or those entry points:
most never does.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any, NamedTuple


class GPUTarget(NamedTuple):
    """``triton.runtime.driver.active.get_current_target()``: Triton's GPUTarget, read only. ``arch`` is the compute
    capability as an int (90) on NVIDIA, the gfx name on AMD, as in Triton."""

    backend: str
    arch: int | str
    warp_size: int

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("GPUTarget is read-only")


DEVICE_PROFILE: list[Any] = [None]
"""While the build traces host code, the GPU it stands for: (GPUTarget, properties dict), so
``driver.active`` answers as a representative GPU of the target being traced. None: the real device."""


class _DriverUtils:
    def get_device_properties(self, device: Any = None) -> dict[str, Any]:
        """Triton's ``driver.active.utils.get_device_properties(device)``: the same keys (``max_shared_mem``,
        ``max_num_regs``, ``multiprocessor_count``, ``warpSize``, ``sm_clock_rate``, ``mem_clock_rate``,
        ``mem_bus_width``; on AMD also ``arch`` and ``max_threads_per_sm``), read from the driver."""
        profile = DEVICE_PROFILE[0]
        if profile is not None:
            return dict(profile[1])
        index = _device_index(device)
        props = _PROPERTIES.get(index)
        if props is None:
            from .drivers import driver

            props = _PROPERTIES[index] = driver().properties(index)
        return dict(props)  # a copy: host code may change its own


_TARGETS: dict[int, GPUTarget] = {}
"""Each device's target, read once (host code like the tutorial's ``is_hip()`` asks on every call)."""
_PROPERTIES: dict[int, dict[str, Any]] = {}
"""Each device's properties, read once: the driver takes about 0.13 ms per attribute on the H100 host (0.9 ms for
the seven), and host code in FLA's style asks on every call (Triton reads them again each time)."""


def _device_index(device: Any) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


class _ActiveDriver:
    """``triton.runtime.driver.active`` in host code: what host code reads from it (the device, its stream, its
    target and properties), answered from torch and the GPU driver, never Triton."""

    def __init__(self) -> None:
        self.utils = _DriverUtils()

    @property
    def active(self) -> _ActiveDriver:  # ``triton.runtime.driver.active``: the driver is its own active one
        return self

    def get_current_device(self) -> int:
        import torch

        return 0 if DEVICE_PROFILE[0] is not None else torch.cuda.current_device()

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cuda", self.get_current_device())

    def get_device_interface(self) -> Any:
        import torch

        return torch.cuda

    def get_current_stream(self, device: Any = None) -> int:
        import torch

        if DEVICE_PROFILE[0] is not None:
            return 0
        return torch.cuda.current_stream(_device_index(device)).cuda_stream

    def get_current_target(self) -> GPUTarget:
        profile = DEVICE_PROFILE[0]
        if profile is not None:
            return profile[0]
        index = self.get_current_device()
        target = _TARGETS.get(index)
        if target is None:
            from .drivers import driver

            drv = driver()
            info = drv.describe(index)
            if drv.backend == "cuda":
                major, minor = info["capability"]
                target = GPUTarget("cuda", major * 10 + minor, 32)
            else:
                target = GPUTarget("hip", info["arch"], drv.properties(index)["warpSize"])
            _TARGETS[index] = target
        return target

    def is_active(self) -> bool:
        return True


class _HostRuntime(types.ModuleType):
    """``triton.runtime`` in host code: its ``driver`` only."""

    def __init__(self) -> None:
        super().__init__("triton.runtime", "triton.runtime.driver, provided by the forge-aot runtime")
        self.driver = _ActiveDriver()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"packaged host code may use triton.runtime.driver only, not triton.runtime.{name}")


def _wrap_triton(kernel: Any) -> Any:
    """``torch.library.wrap_triton(kernel)`` (and ``capture_triton``) in host code: a packaged kernel handle as it
    is; anything else goes to torch's own."""
    from . import fastpath

    # Every handle's base: the C one where the extension is loaded (a Kernel, or a cold one: cold.py), else the
    # kernel module's, loaded wherever a handle exists (so a first call with cold handles loads no ``kernel``)
    base = fastpath.c.KernelBase if fastpath.c is not None else \
        getattr(sys.modules.get(f"{__package__}.kernel"), "KernelBase", None)
    if base is not None and isinstance(kernel, base):
        return kernel
    import torch

    return torch.library.wrap_triton(kernel)


def _triton_op(name: str, fn: Any = None, /, *, mutates_args: Any, schema: Any = None) -> Any:
    """``@torch.library.triton_op(name, mutates_args=...)`` in host code: the function, called as it is (a
    ``_TritonOp``). The package registers its ops itself, as ``torch.ops.<package>.<op>`` with a Meta implementation
    from the host code (so ``torch.compile`` sees one opaque op). The name given is defined, as
    ``<package>__ns::name`` (see _custom_op), only where host code looks it up (torchao's
    ``register_sharding(torch.ops.torchao.triton_to_mxfp8_dim1.default)``: ``_ops_namespace``, ``_op_name``) or a
    call needs the autograd registered on it: defining ops costs the import time."""
    def define(f: Any) -> Any:
        op = _PENDING.setdefault(name.partition("::")[0], {})[name] = _TritonOp(name, f, mutates_args, schema)
        return op

    return define(fn) if fn is not None else define


class _TritonOp:
    """What ``@triton_op`` makes in host code: its function, with ``CustomOpDef``'s registrations. PyTorch trains
    through a triton_op by ``register_autograd`` (axolotl's Gemma-4 fused RMSNorm + RoPE): a call that needs
    gradients (grad mode on, a tensor argument requiring grad) goes through the op, defined then with that autograd
    and the fake its author registered (else the host code's, launches skipped); any other call runs the function,
    as before. ``_init_fn`` and ``_abstract_fn`` as ``CustomOpDef`` names them (custom_ops' Meta implementation)."""

    def __init__(self, name: str, fn: Any, mutates_args: Any, schema: Any) -> None:
        import functools

        self.name, self._init_fn, self._options = name, fn, (mutates_args, schema)
        self._abstract_fn: Any = None
        self._autograd: tuple[Any, Any] | None = None
        self._op: Any = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._autograd is not None and _needs_grad(args, kwargs):
            if self._op is None:
                _op_name(self.name)  # defines the pending ops of its namespace, this one's ``_op`` among them
            return self._op(*args, **kwargs)
        return self._init_fn(*args, **kwargs)

    def register_autograd(self, backward: Any, /, *, setup_context: Any = None) -> None:
        self._autograd = (backward, setup_context)
        if self._op is not None:
            self._op.register_autograd(backward, setup_context=setup_context)

    def register_fake(self, fn: Any = None, /) -> Any:
        def register(f: Any) -> Any:
            self._abstract_fn = f
            if self._op is not None:
                self._op.register_fake(f)
            return f

        return register(fn) if fn is not None else register


def _needs_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    import torch

    if not torch.is_grad_enabled():
        return False
    values = [*args, *kwargs.values()]
    values += [v for a in values if isinstance(a, (list, tuple)) for v in a]
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


_PENDING: dict[str, dict[str, _TritonOp]] = {}
"""Namespace → ops ``@triton_op`` named there, not defined yet: name → its ``_TritonOp``."""
_DEFINED: list[Any] = []
"""The custom ops defined from them (kept: an op's registration lives as long as its definition)."""


_DEFINING = threading.Lock()


def _define_pending(ns: str) -> None:
    import torch

    from .torch_ops import fake_call

    with _DEFINING:  # (another thread looking the namespace up meanwhile waits for the ops)
        for name, pending in _PENDING.get(ns, {}).items():
            fn, (mutates_args, schema) = pending._init_fn, pending._options
            op = torch.library.custom_op(f"{_namespace(ns)}::{name.partition('::')[2]}", fn,
                                         mutates_args=mutates_args, schema=schema)
            op.register_fake(pending._abstract_fn or (lambda *args, _fn=fn, **kwargs: fake_call(_fn, args, kwargs)))
            if pending._autograd is not None:
                op.register_autograd(pending._autograd[0], setup_context=pending._autograd[1])
            pending._op = op
            _DEFINED.append(op)
        _PENDING.pop(ns, None)  # (after: a thread that saw it pending has waited for them)


def _custom_op(name: str, fn: Any = None, /, **options: Any) -> Any:
    """``@torch.library.custom_op("ns::name", ...)`` in host code: the op defined in the package's own namespace,
    ``<package>__ns::name``. Under the library's name, the wheel's definition and the library's own (a process that
    imports both) would each replace the other (torch destroys an op's earlier registration when it is defined
    again), leaving the earlier one's callers on a freed operator; apart, each keeps its own."""
    import torch

    return torch.library.custom_op(_op_name(name), fn, **options)


def _op_name(name: str) -> str:
    """``"ns::name"`` where host code names an op its file defines with ``custom_op`` (``register_fake("ns::name")``,
    ``opcheck``...): the name the package defined it under (sourcesplit rewrites the string to this call)."""
    ns, sep, op = name.partition("::")
    if ns in _PENDING:
        _define_pending(ns)
    return f"{_namespace(ns)}{sep}{op}"


def _namespace(ns: str) -> str:
    """The package's namespace for the ops a library defines in ``ns``: ``<package>__ns``."""
    return f"{__name__.partition('.')[0]}__{ns}"  # <package>._runtime.host_driver: the package


def _ops_namespace(ns: str) -> Any:
    """``torch.ops.ns`` where host code calls an op its file defines with ``custom_op`` by name (sourcesplit
    rewrites it to this call): the package's namespace of such ops."""
    import torch

    if ns in _PENDING:
        _define_pending(ns)
    return getattr(torch.ops, _namespace(ns))


HOST_RUNTIME = _HostRuntime()
"""``triton.runtime`` in host code."""
