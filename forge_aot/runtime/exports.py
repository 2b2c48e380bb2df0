"""The exported ops: what ``import <package>`` binds to each op's name (its host function, loaded on the first
call; its custom op while torch.compile or torch.export trace), ``torch.ops.<package>`` defining the custom ops on
first need, and how an exported op takes its host function's name, docstring and signature. Imports: stdlib, torch."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .lean import (  # noqa: F401  (defined there: import <package> loads lean alone; read from here by the rest)
    LazyCustomOps,
    _lazy_namespace,
    applied_function,
    define_lazily,
    dress_exported,
    host_name,
)


def export(function: Callable[[str], Callable[..., Any]], namespace: str, op: str,
           custom: bool, spec: tuple[Any, ...] = ()) -> Callable[..., Any]:
    """The exported op: its host function (``function(op)``, loaded on the first call), the fast path in eager
    code; for a custom op (``spec``: its op table entry), ``torch.ops.<namespace>.<op>`` while torch.compile or
    torch.export trace (padded results unpadded by its rule), except a call needing gradients through an op with
    no backward in the manifest (its results would not differentiate, silently): the host code runs there, eagerly."""
    loaded: list[Callable[..., Any]] = []

    def load() -> Callable[..., Any]:
        fn = function(op)
        if not loaded:
            dress_exported(exported, fn, op, custom)
            loaded.append(fn)
        return fn

    import torch  # (imported: the ops take its tensors)

    if custom:
        is_compiling, rule, differentiable = torch.compiler.is_compiling, rule_of(spec), len(spec) > 2 and spec[2]
        if rule is not None:
            from .torch_ops import unpad
        eagerly: list[Callable[..., Any]] = []  # traced calls the custom op cannot take run host code eagerly

        def exported(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                if without_grad(differentiable, args, kwargs, f"{namespace}.{op}"):
                    call = custom_call(spec, args, kwargs)
                    if call is not None:
                        out = getattr(getattr(torch.ops, namespace), op)(*call[0], **call[1])
                        return out if rule is None else unpad(rule, out, *call, f"{namespace}.{op}")
                if not eagerly:
                    eagerly.append(torch._disable_dynamo(lambda *a, **k: (loaded[0] if loaded else load())(*a, **k)))
                return eagerly[0](*args, **kwargs)
            return (loaded[0] if loaded else load())(*args, **kwargs)
    else:
        def load_now() -> bool:  # while Dynamo traces: run, not traced (it cannot trace file reads and imports)
            return bool(loaded or load())
        load_now._dynamo_marked_constant = True  # type: ignore[attr-defined]  # (assume_constant_result's mark)

        def exported(*args: Any, **kwargs: Any) -> Any:
            if loaded:  # (one test on the fast path; a first call inside torch.compile, scattermoe's, loads
                return loaded[0](*args, **kwargs)  # while Dynamo traces and reads the host function afresh)
            return (load_now() and function(op) if torch.compiler.is_compiling() else load())(*args, **kwargs)

    exported.__name__ = exported.__qualname__ = op
    exported.__module__ = namespace
    return exported


def exported(package: str, module: str, name: str) -> Any:
    """``package.NAME``, a class or function exported as it is (manifest ``[exports]``), on first access: its host
    module bound lean where it has a lean plan (``lean.LeanPackage``), else by the full runtime's ``Package``."""
    from . import lean

    state = lean.PACKAGES.get(package)
    bound = state is not None and state.handed is None and state.module(module)
    if bound:
        return getattr(bound, name)
    if state is not None:
        return getattr(state.full().module(module), name)
    from .entry import exported as full_exported  # (the package went to the full runtime at import)

    return full_exported(package, module, name)


def without_grad(differentiable: bool, args: tuple[Any, ...], kwargs: dict[str, Any], op: str) -> bool:
    """Whether a traced call may take the custom op: it has a backward, or nothing needs gradients. Where not, the
    graph breaks here saying why (``fullgraph=True`` raises that), and the host code runs eagerly with its autograd."""
    torch = sys.modules["torch"]  # imported: the package has custom ops
    flag = getattr(torch.compiler, "_is_exporting_flag", None)  # torch 2.11's Dynamo folds is_exporting() to True
    if differentiable or not torch.is_grad_enabled() or (flag if flag is not None else torch.compiler.is_exporting()) \
            or not any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values())):
        return True
    torch._dynamo.graph_break(msg=f"{op}: its inputs need gradients and the manifest gives it no backward "
                                  "([kernels.NAME.autograd]), so its custom op cannot take the call; it runs eagerly")
    return False


def rule_of(spec: tuple[Any, ...]) -> Any:
    """An op table entry's result rule, or None."""
    return spec[3] if len(spec) > 3 else None


def custom_call(spec: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
                ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """A traced call as the op's custom op takes it, or None where it runs as Python: it passes an argument the
    schema leaves out (left None, it is taken out), or more than it takes (``**kwargs`` the examples left empty)."""
    for name, position in reversed(spec[4] if len(spec) > 4 and spec[4] else ()):
        if 0 <= position < len(args):
            if args[position] is not None:
                return None
            args = (*args[:position], *args[position + 1:])
        elif kwargs.get(name) is not None:
            return None
        kwargs = {k: v for k, v in kwargs.items() if k != name}
    takes = spec[5] if len(spec) > 5 else None
    if takes is not None and (len(args) > takes[0] or any(k not in takes[1] for k in kwargs)):
        return None
    return args, kwargs


def host_signature(fn: Callable[..., Any]) -> Any:
    """The parameters callers pass to a host function: for an autograd Function's ``apply``, its ``forward``'s,
    less the ``ctx`` a forward without ``setup_context`` takes first (``apply`` itself says ``*args, **kwargs``)."""
    import inspect

    owner = applied_function(fn)
    if owner is None:
        return inspect.signature(fn)
    sig = inspect.signature(owner.forward)
    if owner.setup_context is sys.modules["torch"].autograd.Function.setup_context:  # forward(ctx, ...)
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return sig
