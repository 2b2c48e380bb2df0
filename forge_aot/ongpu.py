"""While the build runs host code (the examples, the tuning inputs, an op's Meta implementation), its tensors
answer as CUDA tensors: ``tensors_on_gpu``.

The trace keeps its tensors on the meta device or the CPU (no memory, no GPU needed), but host code branches on
where its tensors are (Liger's fused add-RMSNorm sizes its backward's ``rows_per_program`` constexpr from the SM
count only ``if S.device.type == "cuda"``; bitsandbytes asserts ``x.is_cuda``), and the wheel serves a process whose
tensors are on the GPU. ROCm's torch names its devices "cuda" too. A torch-function mode answers; it is
thread-local, as torch's modes are, except for the autograd engine's entry into a Function's backward, which is
patched process-wide while any thread traces (the engine runs backwards without the caller's modes), acting for the
threads that trace only (``patched_while_inside``, which the trace's Triton-launch guard uses too).

Torch's dispatcher routes by where a tensor really is, so an op a library registers for CUDA only (vLLM's
``Library.impl(..., dispatch_key="CUDA")``) serves CPU too while the build binds host code and runs its examples:
``cuda_registrations_serve_cpu``."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

_LOCAL = threading.local()
"""Per thread: ``homes``, the homes of its active ``tensors_on_gpu`` blocks (innermost last), and ``cpu``, the
tensors host code made CPU ones on purpose (``x.cpu()``), which answer as CPU tensors: id -> weak reference."""
_PATCH_LOCK = threading.Lock()
_PATCHES: dict[tuple[Any, str], list[Any]] = {}
"""(class, attribute) -> [threads inside, the class's own attribute], while any thread is inside a patch."""


@contextlib.contextmanager
def tensors_on_gpu(home: str) -> Iterator[None]:
    """Tensors on ``home`` ("meta" or "cpu": where the trace keeps them) say they are on CUDA device 0
    (``.device``, ``.is_cuda``, ``.get_device()``, ``.is_cpu`` False) and a GPU asked of torch
    (``torch.empty(n, device=x.device)``, ``x.to("cuda")``, ``x.to(0)``, ``x.cuda()``, ``device=0``) is ``home``;
    ``pin_memory`` is a no-op. ``x.cpu()`` and ``x.to("cpu")`` give a view that answers as a CPU tensor (vLLM-style
    host code checks its ``*_cpu`` metadata). ``torch.autocast("cuda", ...)`` is the CPU's autocast (attorch's linear
    backward multiplies fp16 by fp32 under it). Autograd backwards run under the thread's innermost block. Nests; the
    trace's ``meta_random_factories`` is entered outside it (this mode sees a call first, so that one sees
    ``device="meta"``)."""
    import torch

    homes = getattr(_LOCAL, "homes", None)
    if homes is None:
        homes = _LOCAL.homes = []
        _LOCAL.cpu = {}
    homes.append(home)
    # the autograd engine's entries into a Function's backward: apply, and apply_boxed for boxed_grads_call
    backward = torch.autograd.function.BackwardCFunction
    try:
        with patched_while_inside(backward, "apply", _under_innermost_home), \
                patched_while_inside(backward, "apply_boxed", _under_innermost_home), \
                patched_while_inside(torch.amp.autocast_mode.autocast, "__init__", _autocast_at_home), _mode(home)():
            yield
    finally:
        homes.pop()
        if not homes:
            _LOCAL.cpu = {}


@contextlib.contextmanager
def watching_torch_calls(watcher: Any) -> Iterator[None]:
    """Inside ``tensors_on_gpu`` on this thread (a Function's backward included), ``watcher(func, args, kwargs,
    result)`` sees every torch call host code makes after it returned (the trace's ``output_reads``)."""
    previous = getattr(_LOCAL, "watcher", None)
    _LOCAL.watcher = watcher
    try:
        yield
    finally:
        _LOCAL.watcher = previous


@contextlib.contextmanager
def patched_while_inside(owner: Any, name: str, wrapper: Any) -> Iterator[None]:
    """``owner.name`` (a class's or a module's) replaced by ``wrapper(the owner's own)`` while any thread is inside
    (installed by the first, removed by the last, under a lock), so overlapping threads leave it as it was; the
    wrapper decides from its thread's own state whether to act. Nothing where the owner has no such attribute of its
    own."""
    key = (owner, name)
    with _PATCH_LOCK:
        entry = _PATCHES.get(key)
        if entry is None:
            real = owner.__dict__.get(name)
            if real is not None:
                entry = _PATCHES[key] = [0, real]
                setattr(owner, name, wrapper(real))
        if entry is not None:
            entry[0] += 1
    try:
        yield
    finally:
        if entry is not None:
            with _PATCH_LOCK:
                entry[0] -= 1
                if entry[0] == 0:
                    setattr(owner, name, entry[1])
                    del _PATCHES[key]


def _autocast_at_home(real: Any) -> Any:
    def init(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        # the tensors are the CPU's (or meta, which no autocast casts): the CPU's autocast casts as CUDA's would
        at_home = bool(getattr(_LOCAL, "homes", None)) and device_type == "cuda"
        real(self, "cpu" if at_home else device_type, *args, **kwargs)

    return init


def _under_innermost_home(real: Any) -> Any:
    def entry(ctx: Any, *args: Any) -> Any:
        homes = getattr(_LOCAL, "homes", None)
        if not homes:  # another thread's backward, or none of this thread's blocks is active
            return real(ctx, *args)
        with _mode(homes[-1])():
            return real(ctx, *args)

    return entry


@contextlib.contextmanager
def cuda_registrations_serve_cpu() -> Iterator[None]:
    """While the build binds host modules and runs their examples (on CPU tensors answering as CUDA ones, on a
    machine with a GPU too): ``Library.impl(name, fn, "CUDA")`` (vLLM's ``direct_register_custom_op``) registers
    ``fn`` for CPU as well. Torch's dispatcher routes by where a tensor is, so host code calling its op by
    ``torch.ops.<ns>.<name>`` (as the library's callers do) would find no kernel. Nests; this thread only."""
    import torch

    depth = getattr(_LOCAL, "mirror", 0)
    _LOCAL.mirror = depth + 1
    try:
        with patched_while_inside(torch.library.Library, "impl", _cuda_impl_serves_cpu):
            yield
    finally:
        _LOCAL.mirror = depth


def _cuda_impl_serves_cpu(real: Any) -> Any:
    """``Library.impl`` inside ``cuda_registrations_serve_cpu``."""
    def impl(self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any, **kwargs: Any) -> Any:
        out = real(self, op_name, fn, dispatch_key, *args, **kwargs)
        if dispatch_key == "CUDA" and getattr(_LOCAL, "mirror", 0):
            with contextlib.suppress(RuntimeError):  # registered for CPU already: the library's own then
                real(self, op_name, recorded_through_globals(fn), "CPU", *args, **kwargs)
        return out

    return impl


def recorded_through_globals(fn: Any) -> Any:
    """``fn``, calling what its module's global of its name is at call time where that is the trace's recorder of
    ``fn`` (``Tracer.run_examples``): a call through torch's dispatcher then counts as an example's call of the op
    (what it writes goes into its schema), as a direct call does."""
    import inspect

    # the module of the function as written (vLLM's ops wear @torch.inference_mode(): a wrapper from torch)
    scope, name = getattr(inspect.unwrap(fn), "__globals__", None), getattr(fn, "__name__", None)
    if scope is None or name is None:
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        current = scope.get(name)
        return (current if getattr(current, "__forge_traced__", None) is fn else fn)(*args, **kwargs)

    return call


@functools.cache
def _mode(home: str) -> Any:
    """The torch-function mode class for ``home`` (made once per home: it keeps no state of its own)."""
    import torch
    from torch.overrides import TorchFunctionMode

    gpu = torch.device("cuda", 0)
    base = torch._C.TensorBase
    device_attr, is_cuda_attr, is_cpu_attr = base.device, base.is_cuda, base.is_cpu

    def made_cpu(t: Any) -> bool:
        ref = _LOCAL.cpu.get(id(t))
        return ref is not None and ref() is t

    def mine(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == home and not made_cpu(t)

    def placed(value: Any) -> Any:
        return home if isinstance(value, (str, torch.device, int)) and not isinstance(value, bool) \
            and _names_cuda(value) else value

    def as_cpu(t: Any) -> Any:  # a view of its own, so the tensor it came from keeps answering as a GPU one
        view = t.view_as(t)
        _LOCAL.cpu[id(view)] = weakref.ref(view)
        return view

    def names_cpu(value: Any) -> bool:
        return isinstance(value, (str, torch.device)) and str(value) == "cpu"

    class OnGpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            out = self.answer(func, args, kwargs or {})
            watcher = getattr(_LOCAL, "watcher", None)
            if watcher is not None:  # (in a Function's backward too: the engine's entry enters this mode again)
                watcher(func, args, kwargs or {}, out)
            return out

        def answer(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            owner = getattr(func, "__self__", None)
            if owner is device_attr:
                return gpu if mine(args[0]) else func(*args)
            if owner is is_cuda_attr:
                return mine(args[0]) or func(*args)
            if owner is is_cpu_attr:
                return not mine(args[0]) and func(*args)
            if func is torch.Tensor.get_device:
                return 0 if mine(args[0]) else func(*args, **kwargs)
            if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
                return args[0].to(home) if func is torch.Tensor.cuda else args[0]
            if func is torch.Tensor.cpu and mine(args[0]):
                return as_cpu(args[0] if home == "cpu" else func(*args, **kwargs))
            if "device" in kwargs:
                kwargs = {**kwargs, "device": placed(kwargs["device"])}
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
            if func is torch.Tensor.to:  # x.to("cuda"), x.to(x.device, dtype), x.to(0); x.to("cpu") as .cpu()
                to_cpu = mine(args[0]) and any(names_cpu(a) for a in (*args[1:], kwargs.get("device")))
                args = tuple(map(placed, args))
                out = func(*args, **kwargs)
                return as_cpu(out) if to_cpu and out.device.type == "cpu" else out
            body = _custom_op_body(func, args, kwargs)
            if body is not None:  # its body under this mode, as a direct call of the function runs
                with type(self)():
                    return body(*args, **kwargs)
            try:
                return func(*args, **kwargs)
            except NotImplementedError as exc:
                if home != "cpu" or "not implemented for '" not in str(exc):
                    raise
                return _in_a_dtype_the_cpu_has(func, args, kwargs, exc)

    return OnGpu


def _in_a_dtype_the_cpu_has(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exc: Exception) -> Any:
    """A torch op the GPU has for its tensors' dtype and the CPU does not (``torch.histc`` of int64 tensors:
    native-sparse-attention's ``transform_score``), run on the CPU in float64 (integers and bools) or float32 (half
    precision), its results cast back to the dtype of its first such tensor (a 0-dim tensor stays: it is often a
    size, ``bins=idx.max() + 1``). Not for an in-place op (its tensor would not change): that one raises as before."""
    import torch
    from torch.utils._pytree import tree_map

    name = getattr(func, "__name__", "")
    if name.endswith("_") and not name.startswith("_"):
        raise exc
    wider = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
    cast: list[Any] = []

    def widen(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.dim() and (v.dtype in wider or not (v.is_floating_point()
                                                                                 or v.is_complex())):
            cast.append(v.dtype)
            return v.to(wider.get(v.dtype, torch.float64))
        return v

    args, kwargs = tree_map(widen, args), tree_map(widen, kwargs)
    if not cast:
        raise exc
    out = func(*args, **kwargs)
    return tree_map(lambda v: v.to(cast[0]) if isinstance(v, torch.Tensor) and v.is_floating_point() else v, out)


def _custom_op_body(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The function of a ``@torch.library.custom_op`` that ``func`` (its OpOverload) would run, where a call may run
    it directly: the dispatcher runs it outside this torch-function mode (axolotl's LoRA MLP calls its
    ``swiglu_forward`` custom op, which allocates on ``"cuda"``: a CPU build machine's torch raised), so the body runs
    under the mode instead, unless the call needs the op's registered autograd (a tensor argument requiring grad
    with grad mode on). None for any other function."""
    if type(func).__name__ != "OpOverload" or not hasattr(func, "name"):
        return None
    from torch._library.custom_ops import OPDEFS

    from .runtime.host_driver import _needs_grad

    opdef = OPDEFS.get(func.name())
    body = getattr(opdef, "_init_fn", None)
    if body is None or getattr(body, "__module__", "torch").partition(".")[0] == "torch":  # (torch's own: prims)
        return None
    if getattr(opdef, "_backward_fn", None) is not None and _needs_grad(args, kwargs):
        return None
    return body


def _names_cuda(device: Any) -> bool:
    """Whether ``torch.cuda.device(device)`` would name a GPU: a CUDA ``torch.device`` or string, an index >= 0."""
    if isinstance(device, int):
        return device >= 0
    return str(device).startswith("cuda") if device is not None else False


def machine_has_gpu() -> bool:
    """The machine's own answer, also while the build's stand-ins answer for ``torch.cuda`` (see targets)."""
    import torch

    return bool(getattr(torch.cuda.is_available, "real", torch.cuda.is_available)())


__all__ = ["machine_has_gpu", "tensors_on_gpu"]
