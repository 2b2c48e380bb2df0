"""What the exported ops' torch custom ops run (``entry.register_custom_ops`` defines them at import): the Meta
implementation, the manifest's autograd functions, the routing of a custom op's backward through custom ops, and the
padding of results whose structure follows an argument.

Loaded when torch.compile or torch.export first trace an op, and at import for a package whose ops have autograd
or such results: an eager call of another package never imports it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any

from .errors import ForgeRuntimeError


class _Routing(threading.local):
    custom = False  # a class default: reading it never raises


ROUTING = _Routing()
"""``ROUTING.custom`` is set while a custom op's backward runs (see entry.register_custom_ops): the exported ops it
calls go through their custom ops, as while torch.compile traces, because under AOTAutograd the backward sees
fake tensors, which only a custom op's fake implementation can take."""


def route_in_module(module: Any, namespace: str, ops: dict[str, bool], rules: dict[str, Any] | None = None) -> None:
    """Let host code that calls an op by name (a backward calling a backward op) reach its custom op while
    ``ROUTING.custom`` is set; an op without a custom op then raises a clear error instead of running host code
    on fake tensors. The module's global becomes a wrapper whose ``__forge_host__`` is the host function. Only
    packages with autograd route: other packages' calls never pay for the check. ``rules``: op → its result
    rule or None (the custom op's padded results are unpadded, see ``unpad``)."""
    rules = rules or {}
    for op in sorted(ops.keys() & vars(module).keys()):
        fn, rule = module.__dict__[op], rules.get(op)
        if getattr(fn, "__forge_host__", None) is not None:
            continue

        def routed(*args: Any, _fn: Callable[..., Any] = fn, _op: str = op, _custom: bool = ops[op],
                   _rule: Any = rule, **kwargs: Any) -> Any:
            if ROUTING.custom:
                if not _custom:
                    raise ForgeRuntimeError(f"{namespace}.{_op} is called from a custom op's backward but is no "
                                            "custom op itself (it has no schema): give it type annotations")
                import torch

                out = getattr(getattr(torch.ops, namespace), _op)(*args, **kwargs)
                return out if _rule is None else unpad(_rule, out, args, kwargs, f"{namespace}.{_op}")
            return _fn(*args, **kwargs)

        functools.update_wrapper(routed, fn)
        routed.__forge_host__ = fn  # type: ignore[attr-defined]
        module.__dict__[op] = routed


def unpad(rule: Any, out: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any], op: str) -> Any:
    """A custom op's padded results as the host code returns them for this call: one value or an n-tuple, as the
    rule's argument selects (schema.ResultRule: argument, position, default, (value, arity) pairs, width)."""
    name, position, default, arities, _ = rule
    value = args[position] if 0 <= position < len(args) else kwargs.get(name, default)
    for seen, arity in arities:
        if seen == value:
            return out[0] if arity == 0 else tuple(out[:arity])
    raise ForgeRuntimeError(f"{op}: the build saw results only for {name} in "
                            f"{[v for v, _ in arities]}, not {value!r}")


def pad(rule: Any, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The host code's result padded with None to the custom op's ``width`` results; a result that is a view of
    an input (mamba's ``prenorm`` returns ``x`` itself as the residual where it adds none) copied, as a custom
    op's outputs may not alias its inputs."""
    import torch

    out = out if isinstance(out, tuple) else (out,)
    inputs = {storage_id(a) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
    out = tuple(o.clone() if isinstance(o, torch.Tensor) and storage_id(o) in inputs else o for o in out)
    return (*out, *(None,) * (rule[4] - len(out)))


def storage_id(t: Any) -> int:
    """The identity of a tensor's storage (its views share it), on any device, meta and fake included (the build's
    write analysis uses it too, ``schema._written_arguments``)."""
    st = t.untyped_storage()
    return int(getattr(st, "_cdata", 0) or st.data_ptr())


def call_without_launches(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run host code with every kernel launch bound and skipped: a custom op's Meta implementation (on meta or
    fake tensors), so output shapes, dtypes and strides are exactly those a real call allocates."""
    from .kernel import LAUNCHES

    previous = LAUNCHES.skip
    LAUNCHES.skip = True
    try:
        with _meta_switches_nothing():
            return fn(*args, **kwargs)
    finally:
        LAUNCHES.skip = previous


_SWITCH = threading.Lock()
_SWITCH_USERS: list[Any] = [0, None, None]  # threads inside, torch's own cuda.device and get_device_properties


@contextlib.contextmanager
def _meta_switches_nothing() -> Any:
    """``with torch.cuda.device(x.device):`` around a launch (every FlagGems op) on the meta tensors a Meta
    implementation is given: no device to switch to, so nothing switches (torch refuses a meta device; mamba's
    ``x.device.index`` is None there). ``torch.cuda.get_device_properties(x.device)`` there answers for the current
    GPU (mamba's backward sizes its scratch by the SM count; no output depends on it). While any thread runs one,
    both are wrappers that do only that and are otherwise torch's own."""
    import torch

    with _SWITCH:
        if _SWITCH_USERS[0] == 0:
            real = _SWITCH_USERS[1] = torch.cuda.device
            props = _SWITCH_USERS[2] = torch.cuda.get_device_properties
            if isinstance(real, type):
                class device(real):  # type: ignore[valid-type, misc]
                    def __init__(self, device: Any) -> None:
                        if device is None or getattr(device, "type", device) == "meta":
                            self.idx, self.prev_idx = -1, -1  # torch's "no device": enter and exit switch nothing
                        else:
                            super().__init__(device)
            else:  # already replaced by a function (the build's trace answers as a GPU it has not got)
                def device(device: Any) -> Any:
                    meta = device is None or getattr(device, "type", device) == "meta"
                    return contextlib.nullcontext() if meta else real(device)

            def get_device_properties(device: Any = None) -> Any:
                return props(None if getattr(device, "type", device) == "meta" else device)

            torch.cuda.device, torch.cuda.get_device_properties = device, get_device_properties
        _SWITCH_USERS[0] += 1
    try:
        yield
    finally:
        with _SWITCH:
            _SWITCH_USERS[0] -= 1
            if _SWITCH_USERS[0] == 0:
                torch.cuda.device, torch.cuda.get_device_properties = _SWITCH_USERS[1], _SWITCH_USERS[2]


def fake_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A custom op's Meta implementation: the host function ``fn`` run with its launches skipped, so output shapes,
    dtypes and strides are those of a real call. On symbolic sizes, host code's block size from a size
    (``triton.next_power_of_2(n)``) takes the size's example value without specializing it (``hinted_sizes``),
    provided such values reach no output: the host code runs again with other values (twice the example, the
    smallest size), and where the outputs' structure, dtypes, sizes, strides or offsets change, or the host code
    raises, it runs once more letting torch specialize the sizes it reads, as it then must."""
    from .host_triton import hinted_sizes

    with hinted_sizes() as hinted:
        out = call_without_launches(fn, *args, **kwargs)
    if hinted and not _hints_reach_no_output(fn, args, kwargs, _layout(out)):
        out = call_without_launches(fn, *args, **kwargs)
    return out


def _hints_reach_no_output(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                           layout: Any) -> bool:
    from .host_triton import hinted_sizes

    # What the host code compares in these runs is not what the op does: torch records no guard from them.
    shape_env = next((d.node.shape_env for a in (*args, *kwargs.values()) if hasattr(a, "shape")
                      for d in a.shape if hasattr(d, "node")), None)
    for scale in (2, 0):
        try:
            with hinted_sizes(scale), (shape_env.suppress_guards() if shape_env is not None
                                       else contextlib.nullcontext()):
                other = call_without_launches(fn, *args, **kwargs)
        except Exception:
            return False
        if _layout(other) != layout:
            return False
    return True


def _layout(out: Any) -> Any:
    """What the caller sees of a host function's result, comparable across runs: its structure, and per tensor
    its dtype, device, sizes, strides and storage offset (symbolic ones as their expressions)."""
    if isinstance(out, (tuple, list)):
        return type(out).__name__, tuple(_layout(item) for item in out)
    if hasattr(out, "stride") and hasattr(out, "shape"):
        return ("tensor", str(out.dtype), str(out.device), tuple(map(str, out.shape)), tuple(map(str, out.stride())),
                str(out.storage_offset()))
    return "value", repr(out)


def autograd_functions(host_attr: Callable[[str, str], Callable[..., Any]], op: str, setup_name: str,
                       backward_name: str) -> tuple[Callable[..., None], Callable[..., Any]]:
    """``register_autograd``'s setup_context and backward for an op: the host module's functions, the backward
    run with ``ROUTING.custom`` set."""

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        host_attr(op, setup_name)(ctx, inputs, output)

    def backward(ctx: Any, *grads: Any) -> Any:
        previous = ROUTING.custom
        ROUTING.custom = True
        try:
            return host_attr(op, backward_name)(ctx, *grads)
        finally:
            ROUTING.custom = previous

    return setup_context, backward
