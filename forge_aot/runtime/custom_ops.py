"""The packages' torch custom ops: defined on first need, not at import (this module loads then).

``import <package>`` puts ``torch.ops.<package>`` in place (``exports.define_lazily``): an ``_OpNamespace`` that
defines the package's custom ops (``Library.define``, the real and Meta implementations, the autograd the manifest
names) the first time an op is looked up in it: by torch.compile or torch.export tracing an exported op (Dynamo
looks torch's namespaces up with a real ``getattr``), by code naming ``torch.ops.<package>.<op>``, by
``torch.export.load`` (which does the same), or by ``preload()``. Plain calls never need them. Defining them all at
import cost 0.45 ms for forge_kernels' three ops and 5.7 of the 7.8 ms of ``import forge_realworld`` (44 ops;
locally): the cost grows with the package, and a process that only calls its ops paid it all. Where
``torch.ops.<package>`` was looked up before the import (or this torch has no ``_OpNamespace``), they are defined
at import, as before. A C++ look-up by name alone (an AOTInductor package's proxy executor, TorchScript) does not
pass through Python: call ``preload()`` (or look one op up) first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

LIBRARIES: list[Any] = []
"""torch.library.Library objects of the packages loaded in this process (they must stay alive)."""


def unspellable(default: Any) -> bool:
    """A default a torch schema cannot spell: a non-finite float, alone or in a list (the parser takes no ``inf``).
    The build makes such an argument optional with the default None in the schema; ``_host_defaults`` undoes it."""
    import math

    values = default if isinstance(default, (list, tuple)) else (default,)
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


@functools.cache
def _unspelled(fn: Callable[..., Any]) -> tuple[tuple[int, str, Any], ...]:
    """(position, name, default) of the host function's parameters whose default no schema spells; read once."""
    from .exports import host_signature
    return tuple((i, p.name, p.default) for i, p in enumerate(host_signature(fn).parameters.values())
                 if unspellable(p.default))


def _host_defaults(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call with None put back to the host function's default where the schema could not spell it."""
    for i, name, default in _unspelled(fn):
        if i < len(args) and args[i] is None:
            args = (*args[:i], default, *args[i + 1:])
        elif kwargs.get(name, 0) is None:
            kwargs = {**kwargs, name: default}
    return args, kwargs


def _with_left_out(left_out: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The schema's arguments as the host function takes them: None back in the place of each argument the schema
    leaves out (output buffers, and those every traced call left None: ``exports.custom_call``; ``left_out``: their
    (name, position) in parameter order), which the host function may require (vLLM's ``q_descale``)."""
    for name, position in left_out or ():
        if position < 0:
            kwargs = kwargs if name in kwargs else {**kwargs, name: None}
        elif position <= len(args):  # (else the call passes what follows by name: the host's default stands)
            args = (*args[:position], None, *args[position:])
    return args, kwargs


def _implementations(function: Callable[[str], Callable[..., Any]], op: str, qualified: str, schema: str,
                     rule: Any = None, left_out: Any = None) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A custom op's real implementation (the host code, held to the schema ``qualified`` has: ``guard.guarded``) and
    its Meta one (``torch_ops.fake_call``); with a result rule, both pad the host code's results to the schema's."""
    guard: list[Any] = []  # guard.guarded and the schema's arguments, from the first call (what compiled graphs call)

    def real(*args: Any, **kwargs: Any) -> Any:
        if not guard:
            from .guard import arguments, guarded
            guard.extend((guarded, *arguments(qualified, schema)))
        fn = function(op)
        host_args, host_kwargs = _with_left_out(left_out, args, kwargs)
        call = _host_defaults(fn, host_args, host_kwargs) if _unspelled(fn) else (host_args, host_kwargs)
        return guard[0](qualified, guard[1], guard[2], fn, args, kwargs, call, rule)

    def meta(*args: Any, **kwargs: Any) -> Any:
        from .guard import own
        from .torch_ops import fake_call, pad  # the runtime loads on first use, not at import

        fn = function(op)
        # a @torch.library.custom_op (or @triton_op): the fake its author registered where there is one (axolotl's
        # geglu allocates on "cuda" and registers empty_like), else its own function
        fn = getattr(fn, "_abstract_fn", None) or getattr(fn, "_init_fn", fn)
        out = fake_call(fn, *_host_defaults(fn, *_with_left_out(left_out, args, kwargs)))
        return own(out if rule is None else pad(rule, out, args, kwargs), args, kwargs)

    return real, meta


def register_custom_ops(namespace: str, ops: dict[str, tuple[Any, ...]],
                        function: Callable[[str], Callable[..., Any]],
                        host_attr: Callable[[str, str], Callable[..., Any]]) -> set[str]:
    """Define ``torch.ops.<namespace>.<op>`` for every op of ``ops`` (host_modules.op_table) that has a schema; returns
    the ops defined. ``function(op)``: the op's host function; ``host_attr(op, name)``: another function of its
    host module. The real implementation is the host code; the Meta one the host code with launches skipped (the
    shapes, dtypes and strides of a real call; a tenth of torch.library.register_fake's cost, which reads the
    caller's source). A recorded (setup_context, backward) is its autograd (``register_autograd``), the backward
    run with ``torch_ops.ROUTING.custom`` set. Everything resolves on first use: registering loads no host code."""
    with_schema = {op: spec for op, spec in ops.items() if spec[1]}
    if not with_schema:
        return set()
    import torch

    from .exports import rule_of

    lib = torch.library.Library(namespace, "FRAGMENT")
    LIBRARIES.append(lib)
    custom: set[str] = set()
    for op, spec in sorted(with_schema.items()):
        _, schema, *autograd = spec
        rule, left_out = rule_of(spec), spec[4] if len(spec) > 4 else None  # ((name, position or -1), ...)
        try:
            lib.define(f"{op}{schema}")
        except RuntimeError:
            continue  # defined by an earlier import of this package in the process: keep that one
        real, meta = _implementations(function, op, f"{namespace}.{op}", schema, rule, left_out)
        lib.impl(op, real, "CompositeExplicitAutograd")
        lib.impl(op, meta, "Meta")
        if autograd and autograd[0]:
            from .torch_ops import autograd_functions

            setup_context, backward = autograd_functions(host_attr, op, *autograd[0])
            torch.library.register_autograd(f"{namespace}::{op}", backward, setup_context=setup_context, lib=lib)
        custom.add(op)
    return custom
