"""What the exported ops' torch custom ops run (``custom_ops.register_custom_ops`` defines them on first need): the Meta
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
"""``ROUTING.custom`` is set while a custom op's backward runs (see custom_ops.register_custom_ops): the exported ops it
calls go through their custom ops, as while torch.compile traces, because under AOTAutograd the backward sees
fake tensors, which only a custom op's fake implementation can take."""


def route_in_module(module: Any, namespace: str, ops: dict[str, bool],
                    table: dict[str, tuple[Any, ...]] | None = None) -> None:
    """Let host code that calls an op by name reach its custom op where the exported op would: while
    ``ROUTING.custom`` is set (a backward calling a backward op), and while torch.compile traces (a library's
    ``nn.Module`` calling its file's op, see ``exports.export``); an op without a custom op then raises a clear error
    instead of running host code on fake tensors. The module's global becomes a wrapper whose ``__forge_host__`` is
    the host function. Only packages with autograd or exported classes route: other packages' calls never pay for
    the check. ``table``: the op table (op → its entry: the result rule, whether it has a backward)."""
    import torch

    from .exports import custom_call, host_name, rule_of, without_grad

    is_compiling = torch.compiler.is_compiling
    # an op exported under another name ([ops.NAME] function) by its host module's global of that function; the
    # others by their name in any module (host code calling an op by name), after, so a function of the name of
    # another module's op is routed as its own module's op
    own = module.__name__.rpartition("._ops.")[2]
    names = sorted((host_name(op, spec), op) for op, spec in (table or {}).items() if op in ops and spec[0] == own
                   and host_name(op, spec) != op) + sorted((op, op) for op in ops)
    for name, op in names:
        if name not in vars(module):
            continue
        fn, spec = module.__dict__[name], (table or {}).get(op, ())
        if getattr(fn, "__forge_host__", None) is not None or not _is_host_of(fn, spec, own, namespace):
            continue
        rule, grad, eager = rule_of(spec), len(spec) > 2 and bool(spec[2]), torch._disable_dynamo(fn)

        def routed(*args: Any, _fn: Callable[..., Any] = fn, _op: str = op, _custom: bool = ops[op],
                   _rule: Any = rule, _grad: bool = grad, _spec: Any = spec, _eager: Callable[..., Any] = eager,
                   **kwargs: Any) -> Any:
            compiling = is_compiling()  # a traced call the custom op does not take: the host code runs eagerly
            if ROUTING.custom or (_custom and compiling and without_grad(_grad, args, kwargs, f"{namespace}.{_op}")):
                if not _custom:
                    raise ForgeRuntimeError(f"{namespace}.{_op} is called from a custom op's backward but is no "
                                            "custom op itself (it has no schema): give it type annotations")
                call = custom_call(_spec, args, kwargs)
                if call is not None:
                    out = getattr(getattr(torch.ops, namespace), _op)(*call[0], **call[1])
                    return out if _rule is None else unpad(_rule, out, *call, f"{namespace}.{_op}")
            return (_eager if compiling else _fn)(*args, **kwargs)  # (see exports.export)

        functools.update_wrapper(routed, fn)
        routed.__forge_host__ = fn  # type: ignore[attr-defined]
        module.__dict__[name] = routed


def _is_host_of(fn: Any, spec: tuple[Any, ...], own: str, namespace: str) -> bool:
    """Whether a module's global named as an op is that op's host function: any global of the op's own module,
    elsewhere only the function defined there (imported, or wrapped with ``functools.wraps``), not another file's
    function that shares the name (SageAttention defines ``forward`` in six files)."""
    if not spec or spec[0] == own:
        return True
    home = f"{namespace}._ops.{spec[0]}"
    for _ in range(8):  # a __wrapped__ chain, bounded
        if getattr(fn, "__module__", None) == home:
            return True
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return False
    return False


def unpad(rule: Any, out: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any], op: str) -> Any:
    """A custom op's padded results as the host code returns them for this call: one value or an n-tuple, as the
    rule's argument selects (schema.ResultRule: argument, position, default, (value, arity) pairs, width, fill)."""
    name, value, arity = _rule_arity(rule, args, kwargs)
    if arity is not None:
        return out[0] if arity == 0 else tuple(out[:arity])
    raise ForgeRuntimeError(f"{op}: the build saw results only for {name} in "
                            f"{[v for v, _ in rule[3]]}, not {value!r}")


def _rule_arity(rule: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any, int | None]:
    """The rule's argument, its value in this call and the arity the build saw for it (0: one value), or None."""
    name, position, default, arities = rule[:4]
    value = args[position] if 0 <= position < len(args) else kwargs.get(name, default)
    return name, value, next((arity for seen, arity in arities if seen == value), None)


def pad(rule: Any, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The host code's result padded with None to the custom op's ``width`` results; a result that is a view of
    an input (mamba's ``prenorm`` returns ``x`` itself as the residual where it adds none) copied, as a custom
    op's outputs may not alias its inputs."""
    import torch

    got = len(out) if isinstance(out, tuple) else 0
    name, value, expected = _rule_arity(rule, args, kwargs)
    # (FlagAttention: ``True in (return_lse, return_total, return_seed)`` picks the structure, not one of them)
    if expected is not None and got != expected:
        raise ForgeRuntimeError(f"the op returned {got or 'one'} results where the build saw {expected or 'one'} for "
                                f"{name}={value!r}: what it returns follows more than {name}; give the examples "
                                "calls that vary the other arguments too, and rebuild")
    out = out if isinstance(out, tuple) else (out,)
    inputs = {storage_id(a) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
    out = tuple(o.clone() if isinstance(o, torch.Tensor) and storage_id(o) in inputs else o for o in out)
    # an op that writes an input pads with empty tensors (its schema's results are all Tensor, see schema.py)
    filler = out[0].new_empty(0) if len(rule) > 5 and rule[5] else None
    return (*out, *(filler,) * (rule[4] - len(out)))


def storage_id(t: Any) -> int:
    """The identity of a tensor's storage (its views share it), on any device, meta and fake included (the build's
    write analysis uses it too, ``schema._written_arguments``)."""
    st = t.untyped_storage()
    return int(getattr(st, "_cdata", 0) or st.data_ptr())


def call_without_launches(fn: Callable[..., Any], *args: Any, values: Any = None, **kwargs: Any) -> Any:
    """Run host code with every kernel launch bound and skipped: a custom op's Meta implementation (on meta or
    fake tensors), so output shapes, dtypes and strides are exactly those a real call allocates. Values the host
    code reads from such tensors come from ``values`` (a ``stand_ins`` mode; a fresh one where None)."""
    from .kernel import LAUNCHES

    previous = LAUNCHES.skip
    LAUNCHES.skip = True
    try:
        from .fake_env import meta_switches_nothing  # loaded by the first Meta implementation that runs

        with meta_switches_nothing(), (values if values is not None else stand_ins()):
            return fn(*args, **kwargs)
    finally:
        LAUNCHES.skip = previous


_VALUE_READS = {"item": "item", "tolist": "list", "__bool__": "bool", "__int__": "int", "__float__": "float",
                "__index__": "index", "equal": "bool", "data_ptr": "address"}


def stand_ins(scale: int = 1) -> Any:
    """The mode that answers value reads on meta and fake tensors while a Meta implementation runs: a
    ``torch.overrides.TorchFunctionMode`` (see ``_stand_in_class``)."""
    return _stand_in_class()(scale)


@functools.cache
def _stand_in_class() -> Any:
    import sys

    import torch
    from torch.overrides import TorchFunctionMode

    reads = frozenset((torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
                       torch.Tensor.__float__, torch.Tensor.__index__, torch.equal, torch.Tensor.data_ptr))
    factories = frozenset((torch.arange, torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor,
                           torch.as_tensor, torch.rand, torch.randn, torch.randint, torch.linspace, torch.eye))
    sized_factories = factories - {torch.tensor, torch.as_tensor}  # (those two take a 0-dim tensor as data)

    def without_data(a: Any) -> bool:
        fake = sys.modules.get("torch._subclasses.fake_tensor")
        return isinstance(a, torch.Tensor) and (a.is_meta or (fake is not None and fake.is_fake(a)))

    class StandIns(TorchFunctionMode):
        """Host code that reads a tensor's values (Liger's ``n = (target != ignore).sum().item()``, FLA's
        ``cu_seqlens.tolist()``, ``torch.equal(grad, one)``, ``if mask.any():``) or its address (``data_ptr()``)
        on meta or fake tensors, which have none: each read answers a stand-in of the tensor's kind (``scale`` 1:
        integers 1, floats 1.0, lists 0, 1, 2...; another scale multiplies them), every truth value True (asserts
        on data pass). ``used`` says whether a value was read: ``fake_call`` then runs the host code again with
        other values and refuses an op whose outputs follow them."""

        def __init__(self, scale: int) -> None:
            super().__init__()
            self.scale, self.used = scale, False

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = _VALUE_READS.get(getattr(func, "__name__", ""))
            if name is not None and func in reads and args and all(
                    without_data(a) for a in args if isinstance(a, torch.Tensor)):
                if name == "address":  # lmdeploy's ``k_caches.data_ptr() == v_caches.data_ptr()``: views of one
                    # storage compare as they would on the GPU (aligned as an allocation); no data value was read
                    t = args[0]
                    return storage_id(t) * 512 % (1 << 62) + t.storage_offset() * t.element_size()
                self.used = True
                return self.value(name, args[0])
            if func in sized_factories:  # a 0-dim tensor as a size
                sized = [self.size(a) for a in args]  # (NSA's torch.zeros(h, cu_seqblocks[-1]): read as an index)
                args = tuple(tuple(map(self.size, a)) if isinstance(a, (tuple, list)) else a for a in sized)
            if func in factories and torch._C._meta_in_tls_dispatch_include() and (kwargs or {}).get(
                    "device") is None and not any(isinstance(a, torch.Tensor) for a in args):
                # FakeTensorMode runs a Meta kernel with Meta in the thread's dispatch keys, where a factory with
                # no device (FLA's torch.arange per sequence, then .to(x.device)) recurses through torch's
                # references: made on the CPU, as eagerly
                torch._C._set_meta_in_tls_dispatch_include(False)
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    torch._C._set_meta_in_tls_dispatch_include(True)
            return func(*args, **(kwargs or {}))

        def size(self, a: Any) -> Any:
            if isinstance(a, torch.Tensor) and a.dim() == 0 and without_data(a) and not a.dtype.is_floating_point:
                self.used = True
                return self.value("index", a)
            return a

        def value(self, name: str, t: Any) -> Any:
            if name == "bool" or t.dtype == torch.bool:
                return True if name != "list" else _nested([True] * t.numel(), t.shape)
            integral = not (t.dtype.is_floating_point or t.dtype.is_complex)
            if name == "list":
                return _nested([i * self.scale if integral else float(self.scale) for i in range(t.numel())],
                               t.shape)
            if name == "float" or not (integral or name in ("int", "index")):
                return float(self.scale)
            return self.scale

    return StandIns


def _nested(flat: list[Any], shape: Any) -> Any:
    """``flat`` as ``tolist`` nests it for a tensor of ``shape`` (a 0-d tensor's list is its one value)."""
    if len(shape) == 0:
        return flat[0]
    items = iter(flat)

    def build(dims: list[int]) -> list[Any]:
        return [next(items) for _ in range(dims[0])] if len(dims) == 1 else [build(dims[1:]) for _ in range(dims[0])]

    return build([int(d) for d in shape])


def fake_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A custom op's Meta implementation: the host function ``fn`` run with its launches skipped, so output shapes,
    dtypes and strides are those of a real call. On symbolic sizes, host code's block size from a size
    (``triton.next_power_of_2(n)``) takes the size's example value without specializing it (``hinted_sizes``),
    provided such values reach no output: the host code runs again with other values (twice the example, the
    smallest size), and where the outputs' structure, dtypes, sizes, strides or offsets change, or the host code
    raises, it runs once more letting torch specialize the sizes it reads, as it then must. Tensor values the host
    code reads are stand-ins (``stand_ins``); where it reads any, it runs again with others, and an op whose
    results follow them is refused (``ForgeRuntimeError``). Called by torch's FakeTensorMode with fake GPU tensors,
    all of it runs as a fake implementation (``fake_env.as_fake_implementation``)."""
    emulated = False
    try:
        from .fake_env import as_fake_implementation

        with as_fake_implementation(args, kwargs) as emulated:
            return _meta_call(fn, args, kwargs)
    except Exception:
        import torch

        if not emulated or torch.cuda.is_available():  # the host code's own error, as a real call would raise it
            raise
        # torch without the fake tensors' GPU (a CPU-only build) cannot run every op on them: as a Meta kernel
        # (run here, so that where it fails too the first error shows as well: often the cause, as a device query)
        return _meta_call(fn, args, kwargs)


def _meta_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from .host_triton import hinted_sizes

    reads = stand_ins()
    with hinted_sizes() as hinted:
        out = call_without_launches(fn, *args, values=reads, **kwargs)
    if hinted and not _hints_reach_no_output(fn, args, kwargs, layout(out)):
        out = call_without_launches(fn, *args, **kwargs)
    if reads.used:
        _values_reach_no_output(fn, args, kwargs, layout(out))
    return out


def _values_reach_no_output(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                            expected: Any) -> None:
    """Host code read tensor values (stand-ins, see ``stand_ins``): its outputs must not follow them, or no Meta
    implementation can give a real call's shapes."""
    other = call_without_launches(fn, *args, values=stand_ins(3), **kwargs)
    if layout(other) != expected:
        raise ForgeRuntimeError(f"{getattr(fn, '__qualname__', fn)}: the shapes of its results follow tensor values "
                                "its host code reads (.item(), .tolist()...), which torch.compile and torch.export "
                                "do not have while they trace: call it outside the compiled region")


def _hints_reach_no_output(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                           expected: Any) -> bool:
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
        if layout(other) != expected:
            return False
    return True


def layout(out: Any) -> Any:
    """What the caller sees of a host function's result, comparable across runs: its structure, and per tensor
    its dtype, device, sizes, strides and storage offset (symbolic ones as their expressions)."""
    if isinstance(out, (tuple, list)):
        return type(out).__name__, tuple(layout(item) for item in out)
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
