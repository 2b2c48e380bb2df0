"""Exported ops as torch custom ops (``torch.ops.<package>.<op>``): their registration with a Meta
implementation and the manifest's autograd, and the routing of a custom op's backward through custom ops.

Imported by the package entry point when the package has ops with a schema (registration at ``import <package>``);
the Meta implementation loads the rest of the runtime when torch.compile or torch.export first trace an op.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

LIBRARIES: list[Any] = []
"""torch.library.Library objects of the packages loaded in this process (they must stay alive)."""


class _Routing(threading.local):
    custom = False  # a class default: reading it never raises


ROUTING = _Routing()
"""``ROUTING.custom`` is set while a custom op's backward runs (see register_custom_ops): the exported ops it
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


def _implementations(function: Callable[[str], Callable[..., Any]], op: str,
                     ) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A custom op's real implementation (the host code) and its Meta one (the host code, launches skipped)."""

    def real(*args: Any, **kwargs: Any) -> Any:
        return function(op)(*args, **kwargs)

    def meta(*args: Any, **kwargs: Any) -> Any:
        from .host_triton import hinted_sizes  # the runtime loads on first use, not at import
        from .kernel import call_without_launches

        fn = function(op)
        with hinted_sizes() as hinted:
            out = call_without_launches(fn, *args, **kwargs)
        if hinted and hinted & _static_sizes(out):
            # A value computed from a symbolic size's example may be an output's size: run again letting torch
            # specialize the sizes the host code reads, as it must then.
            out = call_without_launches(fn, *args, **kwargs)
        return out

    return real, meta


def _static_sizes(out: Any) -> set[int]:
    """The plain-int sizes, strides and storage offsets of the tensors in a host function's result."""
    found: set[int] = set()
    todo = [out]
    while todo:
        item = todo.pop()
        if isinstance(item, (tuple, list)):
            todo.extend(item)
        elif hasattr(item, "stride") and hasattr(item, "shape"):
            found.update(v for v in (*item.shape, *item.stride(), item.storage_offset()) if type(v) is int)
    return found


def _autograd(host_attr: Callable[[str, str], Callable[..., Any]], op: str, setup_name: str, backward_name: str,
              ) -> tuple[Callable[..., None], Callable[..., Any]]:
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


def register_custom_ops(namespace: str, ops: dict[str, tuple[Any, ...]],
                        function: Callable[[str], Callable[..., Any]],
                        host_attr: Callable[[str, str], Callable[..., Any]]) -> set[str]:
    """Define ``torch.ops.<namespace>.<op>`` for every op that has a schema; returns the ops defined.

    ``ops``: op → (host module, schema or None[, (setup_context, backward)]); ``function(op)``: the op's host
    function; ``host_attr(op, name)``: another function of the op's host module. The real implementation is the
    host code; the Meta one the host code with kernel launches skipped (so output shapes, dtypes and strides
    are exactly those of a real call; FakeTensorMode runs it on meta tensors, and registering it costs a tenth
    of torch.library.register_fake, which reads the caller's source file). Where the build recorded the op's
    (setup_context, backward), they are its autograd (``torch.library.register_autograd``): the backward runs
    with ``ROUTING.custom`` set. Everything resolves on first use: registering loads no host code.
    """
    with_schema = {op: spec for op, spec in ops.items() if spec[1]}
    if not with_schema:
        return set()
    import torch

    lib = torch.library.Library(namespace, "FRAGMENT")
    LIBRARIES.append(lib)
    custom: set[str] = set()
    for op, (_, schema, *autograd) in sorted(with_schema.items()):
        try:
            lib.define(f"{op}{schema}")
        except RuntimeError:
            continue  # defined by an earlier import of this package in the process: keep that one
        real, meta = _implementations(function, op)
        lib.impl(op, real, "CompositeExplicitAutograd")
        lib.impl(op, meta, "Meta")
        if autograd and autograd[0]:
            setup_context, backward = _autograd(host_attr, op, *autograd[0])
            torch.library.register_autograd(f"{namespace}::{op}", backward, setup_context=setup_context, lib=lib)
        custom.add(op)
    return custom
