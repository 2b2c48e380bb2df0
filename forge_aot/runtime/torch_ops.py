"""What the exported ops' torch custom ops run (``entry.register_custom_ops`` defines them at import): the Meta
implementation, the manifest's autograd functions, and the routing of a custom op's backward through custom ops.

Loaded when torch.compile or torch.export first trace an op, and at import for a package whose ops have autograd:
an eager call of a package without autograd never imports it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any


class _Routing(threading.local):
    custom = False  # a class default: reading it never raises


ROUTING = _Routing()
"""``ROUTING.custom`` is set while a custom op's backward runs (see entry.register_custom_ops): the exported ops it
calls go through their custom ops, as while torch.compile traces, because under AOTAutograd the backward sees
fake tensors, which only a custom op's fake implementation can take."""


def route_in_module(module: Any, namespace: str, ops: dict[str, bool]) -> None:
    """Let host code that calls an op by name (a backward calling a backward op) reach its custom op while
    ``ROUTING.custom`` is set; an op without a custom op then raises a clear error instead of running host code
    on fake tensors. The module's global becomes a wrapper whose ``__forge_host__`` is the host function. Only
    packages with autograd route: other packages' calls never pay for the check."""
    for op in sorted(ops.keys() & vars(module).keys()):
        fn = module.__dict__[op]
        if getattr(fn, "__forge_host__", None) is not None:
            continue

        def routed(*args: Any, _fn: Callable[..., Any] = fn, _op: str = op, _custom: bool = ops[op],
                   **kwargs: Any) -> Any:
            if ROUTING.custom:
                if not _custom:
                    from .errors import ForgeRuntimeError

                    raise ForgeRuntimeError(f"{namespace}.{_op} is called from a custom op's backward but is no "
                                            "custom op itself (it has no schema): give it type annotations")
                import torch

                return getattr(getattr(torch.ops, namespace), _op)(*args, **kwargs)
            return _fn(*args, **kwargs)

        functools.update_wrapper(routed, fn)
        routed.__forge_host__ = fn  # type: ignore[attr-defined]
        module.__dict__[op] = routed


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
_SWITCH_USERS = [0, None]


@contextlib.contextmanager
def _meta_switches_nothing() -> Any:
    """``with torch.cuda.device(x.device):`` around a launch (every FlagGems op) on the meta tensors a Meta
    implementation is given: no device to switch to, so nothing switches (torch refuses a meta device). While any
    thread runs one, ``torch.cuda.device`` is a subclass that does only that and is otherwise torch's own."""
    import torch

    with _SWITCH:
        if _SWITCH_USERS[0] == 0:
            real = _SWITCH_USERS[1] = torch.cuda.device
            if isinstance(real, type):
                class device(real):  # type: ignore[valid-type, misc]
                    def __init__(self, device: Any) -> None:
                        if getattr(device, "type", device) == "meta":
                            self.idx, self.prev_idx = -1, -1  # torch's "no device": enter and exit switch nothing
                        else:
                            super().__init__(device)
            else:  # already replaced by a function (the build's trace answers as a GPU it has not got)
                def device(device: Any) -> Any:
                    return contextlib.nullcontext() if getattr(device, "type", device) == "meta" else real(device)

            torch.cuda.device = device
        _SWITCH_USERS[0] += 1
    try:
        yield
    finally:
        with _SWITCH:
            _SWITCH_USERS[0] -= 1
            if _SWITCH_USERS[0] == 0:
                torch.cuda.device = _SWITCH_USERS[1]


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
