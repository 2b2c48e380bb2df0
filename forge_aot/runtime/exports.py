"""The exported ops: what ``import <package>`` binds to each op's name (its host function, loaded on the first
call; its custom op while torch.compile or torch.export trace), ``torch.ops.<package>`` defining the custom ops on
first need, and how an exported op takes its host function's name, docstring and signature. Imports: stdlib, torch."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any


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


def host_name(op: str, spec: tuple[Any, ...]) -> str:
    """The host function of an op (its op table entry's last item where the package exports it under another
    name, ``[ops.NAME] function``; see ``host_modules.op_table``)."""
    return spec[6] if len(spec) > 6 and spec[6] else op


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


class LazyCustomOps:
    """A package's custom ops, defined once by ``define()``, from any thread (others wait; a look-up the defining
    thread makes meanwhile, as ``Library.define`` makes one, sees what is defined so far)."""

    def __init__(self, namespace: str, ops: dict[str, tuple[Any, ...]],
                 function: Callable[[str], Callable[..., Any]],
                 host_attr: Callable[[str, str], Callable[..., Any]]) -> None:
        self.args = (namespace, ops, function, host_attr)
        self.lock = threading.RLock()
        self.done = self.running = False

    def define(self) -> None:
        if self.done:
            return
        with self.lock:
            if self.done or self.running:
                return
            self.running = True
            try:
                from .custom_ops import register_custom_ops

                register_custom_ops(*self.args)
                self.done = True
            finally:
                self.running = False


@functools.cache
def _lazy_namespace() -> type:
    import torch._ops

    class LazyNamespace(torch._ops._OpNamespace):  # type: ignore[misc,name-defined]
        """``torch.ops.<package>``: the package's custom ops are defined on the first look-up of an op in it."""

        def __init__(self, name: str, pending: LazyCustomOps) -> None:
            super().__init__(name)
            self._forge_pending = pending

        def __getattr__(self, op_name: str) -> Any:
            if op_name.startswith("__"):  # introspection (copy, pickle, inspect) defines nothing
                return super().__getattr__(op_name)
            pending = self._forge_pending
            pending.define()
            with pending.lock:  # one OpOverloadPacket per op, also where threads look it up at once
                cached = vars(self).get(op_name)
                return cached if cached is not None else super().__getattr__(op_name)

    # _OpNamespace names its ops' module after its own (torch.export writes ``torch.ops.<package>.<op>`` from it)
    LazyNamespace.__module__ = torch._ops._OpNamespace.__module__
    LazyNamespace.__qualname__ = "LazyNamespace"
    return LazyNamespace


def define_lazily(namespace: str, ops: dict[str, tuple[Any, ...]], function: Callable[[str], Callable[..., Any]],
                  host_attr: Callable[[str, str], Callable[..., Any]]) -> tuple[set[str], Callable[[], None]]:
    """The ops of ``ops`` (host_modules.op_table) that are custom ops (those with a schema), and what defines them now:
    ``torch.ops.<namespace>`` defines them on first need (see ``custom_ops``) where it can be put in place, else
    they are defined here. ``function`` and ``host_attr``: see custom_ops.register_custom_ops."""
    with_schema = {op for op, spec in ops.items() if spec[1]}
    if not with_schema:
        return set(), lambda: None
    import torch

    pending = LazyCustomOps(namespace, ops, function, host_attr)
    try:
        placed = namespace not in vars(torch.ops)
        if placed:
            setattr(torch.ops, namespace, _lazy_namespace()(namespace, pending))
            torch.ops._dir.append(namespace)  # as _Ops.__getattr__ records a namespace it makes
    except Exception:  # a torch whose torch.ops differs: define them now
        placed = False
    if not placed:
        pending.define()
    return with_schema, pending.define


def applied_function(fn: Any) -> type | None:
    """The ``torch.autograd.Function`` whose ``apply`` ``fn`` is (Triton's tutorial 05 exports ``layer_norm =
    LayerNorm.apply``), else None."""
    owner = getattr(fn, "__self__", None)
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(owner, type) or getattr(fn, "__name__", None) != "apply":
        return None
    return owner if issubclass(owner, torch.autograd.Function) else None


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


def dress_exported(exported: Callable[..., Any], fn: Callable[..., Any], op: str, custom: bool = False) -> None:
    """An exported op takes its host function's name, docstring and signature (through ``__wrapped__``); for
    ``op = Cls.apply``, the op's name, the Function's module and docstring and its forward's parameters. A custom
    op's leaves out Dynamo's marks (FLA's ops are ``@torch.compiler.disable``d: torch.compile then stopped at the
    exported op, which would have traced it as its custom op)."""
    import functools

    functools.update_wrapper(exported, fn)
    for mark in [k for k in vars(exported) if custom and k.startswith("_torchdynamo")]:
        delattr(exported, mark)
    owner = applied_function(fn)
    if owner is not None:
        exported.__name__ = exported.__qualname__ = op
        exported.__module__, exported.__doc__ = owner.__module__, owner.__doc__
        exported.__signature__ = host_signature(fn)  # type: ignore[attr-defined]
