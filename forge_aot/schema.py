"""The torch.library schema of an exported op, so the package can register it as a custom op
(``torch.ops.<package>.<op>``, traceable by ``torch.compile(fullgraph=True)`` and kept by ``torch.export``).

From the op's type annotations where it has them (``torch.library.infer_schema``), else from the calls its
file's examples function made (argument and result types as observed). An argument whose memory the call's
kernels may write (``sourcesplit`` reads which parameters each kernel writes through; the tracer, which tensors
were passed there) is ``Tensor(a!)``, and such an op may return nothing (``-> ()``, vLLM's out-first ops). Ops
whose arguments or results do not fit a schema (other objects, an output that is an input) are left
unregistered, with the reason. An op whose result's structure follows one argument (mamba's and flash-attn's
``layer_norm_fn`` returns ``y``, or ``(y, residual)`` with ``prenorm=True``) returns their union, padded with
None (``(Tensor, Tensor?)``), and a rule (``ResultRule``) that the exported function uses to give each call the
structure the host code gives it. A default the
schema language cannot spell (``float("inf")``, alone or in a list) makes the argument optional with the
default None, which the registered implementations turn back into the host function's default
(``runtime.entry``).
"""

from __future__ import annotations

import inspect
import os
import re
import traceback
from collections.abc import Callable
from typing import Any

from .runtime.custom_ops import unspellable
from .runtime.exports import host_signature
from .runtime.torch_ops import fake_call, layout, storage_id


def _type_of(value: Any) -> str | None:
    import torch

    if isinstance(value, torch.Tensor):
        return "Tensor"
    if value is None:
        return "None"
    if isinstance(value, torch.dtype):  # an output format the caller picks (torch.float8_e4m3fn, say)
        return "ScalarType"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str) or type(value).__name__ == "JITFunction":
        return "str"  # a helper module's @triton.jit function: the wheel passes its stand-in, a str (KernelSide)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return "Tensor[]"  # vLLM's LoRA ops take the weights of each slice as a list
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "int[]"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                for v in value):
        return "float[]"  # Mamba's dt_limit=(0.0, float("inf"))
    return None


def _default(value: Any) -> str:
    import torch

    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")  # the schema parser's dtype names: float8_e4m3fn
    if isinstance(value, bool):
        return repr(bool(value))
    for base in (int, float, str):  # an IntEnum's member (lmdeploy's ``quant_policy=QuantPolicy.NONE``) by its value
        if isinstance(value, base):
            return repr(base(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return repr(value)


def _merge(types: set[str]) -> str | None:
    optional = "None" in types
    rest = types - {"None"}
    if rest == {"int", "float"}:
        rest = {"float"}
    if rest == {"int[]", "float[]"}:
        rest = {"float[]"}
    if len(rest) != 1:
        return None
    (base,) = rest
    return f"{base}?" if optional else base


Call = tuple[Any, ...]
"""One traced call of an op: positional arguments, keyword arguments, result[, the tensors its kernel launches
may write (``Tracer._written``)]."""


ResultRule = dict[str, Any]
"""How an op's result structure follows one of its arguments (JSON, in the index): ``argument`` (its name),
``position`` (its index among the parameters, -1 when keyword-only), ``default``, ``arities`` (pairs of the
argument's value and the result's structure: 0 one value, n a tuple of n), ``width`` (the padded tuple's
length, the schema's) and, for an op that writes an input, ``fill`` (True: padded with empty tensors, the schema
all ``Tensor``: torch functionalizes a mutating custom op only if every result is a ``Tensor``).
``runtime.torch_ops`` pads and unpads with it."""


def op_schema(fn: Callable[..., Any], calls: list[Call]) -> tuple[str | None, str, ResultRule | None]:
    """(schema without the name, e.g. ``(Tensor x, float eps=1e-06) -> Tensor``, or None), a reason, and the
    rule giving each call its result structure where that follows an argument (else None). An output buffer the
    examples always leave None (mamba's ``_bmm_chunk_bwd(a, dout, residual=None, out=None)``: ``out =
    torch.empty_like(...) if out is None else out``) is left out of the schema (``schema_and_buffer`` says which; so
    are several): a caller's ``out`` would be written and returned, which no custom op may do, so calls passing one
    stay Python calls (``runtime.exports.custom_call``); a rule's positions are then the schema's."""
    return schema_and_buffer(fn, calls)[:3]


LeftOut = tuple[tuple[str, int], ...]
"""Arguments a schema leaves out (output buffers, and arguments every traced call passes None that nothing types),
each as (name, position among the host function's parameters, -1 for a keyword-only one), in parameter order."""


def schema_and_buffer(fn: Callable[..., Any], calls: list[Call],
                      ) -> tuple[str | None, str, ResultRule | None, LeftOut]:
    """``op_schema`` and the arguments its schema leaves out (``LeftOut``), in one pass (the build asks both)."""
    declared = getattr(getattr(fn, "_opoverload", None), "_schema", None)
    if declared is not None and hasattr(fn, "_init_fn"):  # a @torch.library.custom_op: its own schema
        return _declared_schema(declared, inspect.signature(fn._init_fn), calls)
    sig, varargs = _without_var_parameters(host_signature(fn), calls)
    if varargs is not None and sig is None:
        return None, varargs, None, ()
    schema, how, rule, left_out = _schema_and_buffer(fn, sig, calls)
    refused = _unparsed(schema)
    if refused is not None:  # (the wheel's definition would fail, and its custom op be missing, at run time)
        return None, refused, None, ()
    if varargs is None or schema is None:
        return schema, how, rule, left_out
    return schema, f"{how}; without its {varargs} (empty in every traced call: a call passing more runs as Python, " \
        "the others as the custom op)", rule, left_out


def _declared_schema(declared: Any, sig: inspect.Signature, calls: list[Call],
                     ) -> tuple[str, str, None, LeftOut]:
    """A ``@torch.library.custom_op``'s own schema, with the arguments its examples' launches write marked written
    where its ``mutates_args`` leaves them out (scattermoe's ``groupXtY_compileable`` names ``DW`` and its kernel
    writes ``Db`` too): torch would not know of the write, and the wheel's guard refused the call."""
    text = str(declared)
    schema = text[text.index("("):]
    marked = {a.name for a in declared.arguments if a.alias_info is not None and a.alias_info.is_write}
    unmarked = [n for n in _written_arguments(sig, calls) if n not in marked]
    if not unmarked:
        return schema, "from its @torch.library.custom_op", None, ()
    taken = [int(n) for n in re.findall(r"\(a(\d+)!?\)", schema)]
    for i, name in enumerate(unmarked, start=max(taken, default=-1) + 1):
        schema = re.sub(rf"\bTensor(\?\[\]|\?|\[\])? {name}(?=[,)=])", rf"Tensor(a{i}!)\g<1> {name}", schema, count=1)
    return schema, (f"from its @torch.library.custom_op, with {', '.join(unmarked)} marked written: the examples' "
                    "calls write there, and its mutates_args leaves that out"), None, ()


def _unparsed(schema: str | None) -> str | None:
    """Why torch's schema parser refuses ``schema``, or None where it takes it (or there is none)."""
    import torch

    if schema is None:
        return None
    try:
        torch._C.parse_schema(f"op{schema}")
    except Exception as exc:  # (RuntimeError; IndexError "stoll" for an integer beyond 64 bits)
        return f"its schema {schema} does not parse: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"
    return None


def _without_var_parameters(sig: inspect.Signature, calls: list[Call]) -> tuple[Any, str | None]:
    """The signature without ``*args``/``**kwargs`` that every traced call leaves empty (flash-linear-attention's
    public ops take ``**kwargs`` for deprecated keywords: ``chunk_simple_gla(q, k, v, ..., **kwargs)``) and what
    was left out (``**kwargs``); (None, why) where a call passes something through them; (sig, None) where the
    function has none."""
    var = [p for p in sig.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not var:
        return sig, None
    shown = " and ".join(("*" if p.kind == p.VAR_POSITIONAL else "**") + p.name for p in var)
    for args, kwargs, *_ in calls:
        bound = _bound(sig, args, kwargs)
        if bound is None or any(bound.get(p.name) for p in var):
            return None, f"it takes {shown} and a traced call passes something through them"
    return sig.replace(parameters=[p for p in sig.parameters.values() if p not in var]), shown


def passes_var_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call passes something through the host function's ``*args``/``**kwargs`` (or does not bind)."""
    return _without_var_parameters(host_signature(fn), [(args, kwargs)])[0] is None


def has_var_parameters(fn: Callable[..., Any]) -> bool:
    """Whether the host function takes ``*args`` or ``**kwargs`` (a schema leaves them out: ``schema_takes``)."""
    return _without_var_parameters(host_signature(fn), [])[1] is not None


def schema_takes(schema: str) -> list[Any]:
    """[how many arguments the schema takes by position, their names]: a traced call of an op whose host function
    takes ``**kwargs`` passing more runs as Python (``runtime.exports.custom_call``)."""
    import torch

    arguments = torch._C.parse_schema(f"op{schema}").arguments
    return [sum(1 for a in arguments if not a.kwarg_only), [a.name for a in arguments]]


def _schema_and_buffer(fn: Callable[..., Any], sig: inspect.Signature, calls: list[Call],
                       ) -> tuple[str | None, str, ResultRule | None, LeftOut]:
    buffers = _output_buffers(sig, calls)
    for buffer in buffers:
        if _without_buffers(sig, calls, [buffer]) is None:
            return None, (f"argument {buffer} is an output buffer the op writes or returns, and some traced call "
                          "passes one (a custom op's outputs may not alias its inputs)"), None, ()
    # Then, one by one, the arguments every traced call leaves None that nothing types (vLLM's
    # ``unified_attention`` takes ``q_descale`` only to assert it is None; flash-attn's ``process_group``).
    untyped: list[str] = []
    while True:
        reduced = _without_buffers(sig, calls, [*buffers, *untyped])  # (None: a call does not bind; _schema says so)
        schema, how, rule = _schema(fn, *(reduced or (sig, calls)))
        if reduced is None or schema is not None or not isinstance(how, _UntypedNone):
            break
        untyped.append(how.argument)
    if schema is None:
        return None, how, None, ()
    if buffers:  # (TransformerEngine's ``compute_grouped_dbias_dscales(..., dbias=None, dscales=None)``: both)
        how += (f"; without its output buffer{'s' if len(buffers) > 1 else ''} {' and '.join(buffers)} (None in every "
                "traced call: a call passing one runs as Python, the others as the custom op)")
    if untyped:
        how += (f"; without argument{'s' if len(untyped) > 1 else ''} {' and '.join(untyped)} (None in every traced "
                "call, its type unknown: a call passing one runs as Python, the others as the custom op)")
    left = {*buffers, *untyped}
    return schema, how, rule, tuple(_position(sig, name) for name in sig.parameters if name in left)


def _position(sig: inspect.Signature, name: str) -> tuple[str, int]:
    """(name, position among the parameters, -1 for a keyword-only one): how the runtime finds an argument."""
    params = list(sig.parameters.values())
    p = next(p for p in params if p.name == name)
    return name, -1 if p.kind == p.KEYWORD_ONLY else params.index(p)


class _UntypedNone(str):
    """Why an op has no schema, where that is an argument every traced call leaves None and nothing types
    (``argument``): the schema may leave it out."""

    argument: str

    @classmethod
    def of(cls, argument: str, why: str) -> _UntypedNone:
        reason = cls(why)
        reason.argument = argument
        return reason


def _without_buffers(sig: inspect.Signature, calls: list[Call], buffers: list[str],
                     ) -> tuple[inspect.Signature, list[Call]] | None:
    """The signature and the traced calls without the output buffers ``buffers``, or None where a call passes one
    (or a call does not bind)."""
    reduced = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in buffers])
    out = []
    for args, kwargs, *rest in calls:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return None
        if any(bound.arguments.pop(buffer, None) is not None for buffer in buffers):
            return None
        call = inspect.BoundArguments(reduced, bound.arguments)  # type: ignore[arg-type]
        if len(rest) > 2:
            rest = [rest[0], rest[1], {n: v for n, v in rest[2].items() if n not in buffers}, *rest[3:]]
        out.append((call.args, call.kwargs, *rest))
    return reduced, out


def _aliasing(arguments: Any, result: Any) -> str | None:
    """Why a traced call's results could not be a custom op's (which may alias neither its inputs nor each other:
    torch.compile would reuse their memory), or None: a result that is an input or a view of one (Liger's swiglu
    returns ``a.view(-1, n)``), two results over one storage (Liger's sparsemax returns ``out_flat`` and a view of
    it)."""
    import torch

    inputs = {storage_id(v) for v in arguments if isinstance(v, torch.Tensor)}
    flat = result if isinstance(result, tuple) else (result,)
    outputs = [storage_id(r) for r in flat if isinstance(r, torch.Tensor)]
    if any(o in inputs for o in outputs):
        return "it returns one of its inputs or a view of one (a custom op's outputs may not alias its inputs)"
    if len(set(outputs)) < len(outputs):
        return ("two of its results share memory, one a view of the other (a custom op's outputs may not alias each "
                "other)")
    return None


def _bound(sig: inspect.Signature, args: Any, kwargs: Any) -> dict[str, Any] | None:
    """A traced call's arguments by name (None where it does not bind)."""
    try:
        return dict(sig.bind(*args, **kwargs).arguments)
    except TypeError:
        return None


def _returns_as_annotated(schema: str, result: Any) -> bool:
    """Whether a traced call's result has the structure an annotated schema's returns say: as many results, a
    tensor where it says ``Tensor``, a tensor or None where ``Tensor?``, nothing where ``()``."""
    import torch

    returns = torch._C.parse_schema(f"op{schema}").returns
    if not returns:
        return result is None
    if len(returns) == 1 and str(returns[0].type).startswith(("Tuple", "List")):
        return True  # a list or tuple result as one return: not a structure this checks
    flat = result if isinstance(result, tuple) else (result,)
    if len(flat) != len(returns):
        return False
    for r, value in zip(returns, flat):
        kind = str(r.type)
        if (kind == "Tensor" and not isinstance(value, torch.Tensor)) or (
                kind == "Optional[Tensor]" and not (value is None or isinstance(value, torch.Tensor))):
            return False
    return True


def _infer_schema(fn: Callable[..., Any]) -> str:
    """``torch.library.infer_schema`` without the log line torch writes for each annotation that is no class
    (``Union[int, torch.Tensor, None]``, flash-attn's ``cache_seqlens``): the refusal that follows says why."""
    import logging

    import torch

    logger = logging.getLogger("torch._library.opaque_object")
    disabled, logger.disabled = logger.disabled, True
    try:
        return torch.library.infer_schema(fn, mutates_args=())
    finally:
        logger.disabled = disabled


def _schema(fn: Callable[..., Any], sig: inspect.Signature, calls: list[Call],
            ) -> tuple[str | None, str, ResultRule | None]:
    """``op_schema`` for the parameters of ``sig`` (the host function's, less an output buffer)."""
    written = _written_arguments(sig, calls)
    unannotated, disagrees = "no type annotations", ""
    if not written:
        try:
            schema = _infer_schema(_plain_tensor_annotations(fn, sig))
        except Exception as exc:  # annotations missing or not schema types: try the traced calls
            if sig.return_annotation is not inspect.Signature.empty or any(
                    p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()):
                why = str(exc).splitlines()[0].split(" Got func")[0].removeprefix("infer_schema(func): ")
                unannotated = f"annotations that make no schema ({why.rstrip('. ')})"
        else:
            passed_none: set[str] = set()
            for args, kwargs, result, *_ in calls:  # the annotations say nothing of what the results share
                bound = _bound(sig, args, kwargs)
                if bound is None:
                    continue
                why = _aliasing(bound.values(), result)
                if why is not None:
                    return None, why, None
                passed_none |= {name for name, value in bound.items() if value is None}
            # ``scale: float = None`` (flash-linear-attention writes it so) infers ``float scale=None``, which refuses
            # the None its own default is: optional, as the default says; so is a parameter annotated ``Tensor`` that
            # a traced call passes None (gemlite's ``scales_x: Tensor``), or torch.ops would refuse that call
            for name, p in sig.parameters.items():
                if p.default is None or name in passed_none:
                    schema = re.sub(rf"(?<![\w?\]])([\w\[\]]+) {name}(?=[,)=])", rf"\1? {name}", schema)
            if all(_returns_as_annotated(schema, result) for _, _, result, *_ in calls):
                return schema, "from the type annotations", None
            # (mlstm_kernels annotates ``-> tuple[Tensor, Tensor]`` over ``return a, b, c``: the custom op's result
            # would not be the host code's, and torch.ops crashed on it) the traced results decide
            disagrees = "its return annotation disagrees with what the traced calls return"
    if not calls:
        return None, (f"{unannotated}, and no traced call reaches it (from the examples or another op's code, "
                      "one that binds its parameters)"), None
    seen: dict[str, set[str]] = {name: set() for name in sig.parameters}
    in_place_of_none: dict[str, set[str]] = {name: set() for name in sig.parameters}
    # per traced call: ("()",) for nothing, ("", kind) for one result, the kinds of a tuple's items otherwise
    results: set[tuple[str, ...]] = set()
    keyed: list[tuple[dict[str, Any], tuple[str, ...]]] = []  # per call: its scalar arguments, its result kinds
    for args, kwargs, result, *rest in calls:
        for name, value in (rest[1] if len(rest) > 1 else {}).items():
            t = _type_of(value)
            if t is not None and name in in_place_of_none:
                in_place_of_none[name].add(t)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            return None, f"a traced call does not bind: {exc}", None
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            t = _type_of(value)
            if t is None:
                return None, f"argument {name} is a {type(value).__name__}, not a schema type", None
            seen[name].add(t)
        if result is None and written:  # vLLM's style: the caller's out tensors written, nothing returned
            results.add(("()",))
            keyed.append(({}, ("()",)))
            continue
        flat = result if isinstance(result, tuple) else (result,)
        why = _aliasing(bound.arguments.values(), result)
        if why is not None:
            return None, why, None
        kinds = tuple(_type_of(r) for r in flat)
        if any(k not in ("Tensor", "None") for k in kinds) or (result is None and not written):
            return None, f"it returns {type(result).__name__}, not tensors", None
        shape = kinds if isinstance(result, tuple) else ("", *kinds)
        results.add(shape)
        keyed.append(({n: v for n, v in bound.arguments.items() if v is None or isinstance(v, (bool, int, str))},
                      shape))
    params = []
    guessed = []
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return None, "it takes *args or **kwargs", None
        if p.kind == p.KEYWORD_ONLY and "*" not in params:  # torch passes them by name, as the host code takes them
            params.append("*")
        t = _merge(seen[name])
        if t is None and seen[name] == {"None"} and p.default is None:
            # None in every call: the type of what the op's own code puts in its place (``dtype = x.dtype``)
            replaced = _merge(in_place_of_none[name])
            if replaced is not None:
                t = f"{replaced.removesuffix('?')}?"
                guessed.append(f"{name} as the op's code fills it in")
        if t is None and seen[name] == {"None"}:
            t = _annotated_optional(fn, p)
            if t is not None:
                guessed.append(f"{name} as annotated")
        if t is not None and name in written:  # Tensor(a!): the op writes it (torch.compile functionalizes)
            t = t.replace("Tensor", f"Tensor({chr(ord('a') + written.index(name))}!)")
        if t is None and seen[name] == {"None"}:
            if p.annotation is not inspect.Parameter.empty:  # vLLM's ``custom_routing_function: Optional[Callable]``
                shown = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
                return None, _UntypedNone.of(name, f"argument {name} is None in every traced call and annotated "
                                             f"{shown}, which is no schema type (tensors, numbers, bools, strings, "
                                             "dtypes, lists of them)"), None
            return None, _UntypedNone.of(name, f"argument {name} is None in every traced call, so its type is unknown: "
                                         "annotate it, or pass a value in the examples"), None
        if t is None:
            return None, f"argument {name} takes several types: {sorted(seen[name])}", None
        if p.default is inspect.Parameter.empty:
            params.append(f"{t} {name}")
        elif p.default is None or unspellable(p.default):  # optional in the schema (``max_seqlen_q: int = None``,
            # lmdeploy's; or None meaning the host function's own default)
            params.append(f"{t.removesuffix('?')}? {name}=None")
        else:
            params.append(f"{t} {name}={_default(p.default)}")
    returns, rule = _returns(results), None
    if returns is None:
        returns, rule = _keyed_returns(sig, keyed)
        if returns is None:
            return None, f"it returns several kinds of results: {sorted(results)}", None
    if written and "Tensor?" in returns:
        # torch.compile functionalizes a mutating custom op only where every result is a Tensor: padding becomes
        # empty tensors (the exported function drops them by the rule); a result None in its own right cannot be
        if rule is None or any("None" in (kinds[1:] if kinds[0] == "" else kinds) for _, kinds in keyed):
            return None, ("it writes an input and returns a tensor or None (torch.compile cannot functionalize a "
                          "mutating custom op with an optional result)"), None
        returns, rule = "(" + ", ".join(["Tensor"] * rule["width"]) + ")", {**rule, "fill": True}
    how = "from the traced examples"
    if guessed or disagrees:
        how += f"; {', '.join([*guessed, *([disagrees] if disagrees else [])])}"
    if written:
        how += f"; writes {', '.join(written)}"
    if rule is not None:
        how += (f"; returns {rule['width']} results padded with {'empty tensors' if rule.get('fill') else 'None'}, "
                f"the exported function giving each call the structure {rule['argument']} selects")
    return f"({', '.join(params)}) -> {returns}", how, rule


def _keyed_returns(sig: inspect.Signature, keyed: list[tuple[dict[str, Any], tuple[str, ...]]],
                   ) -> tuple[str | None, ResultRule | None]:
    """Where calls return one value against a tuple, or tuples of different lengths, and one argument's value (a
    bool, int, str or None in every call; a bool first) tells which: the union of the results, padded with None,
    and the rule. (None, None) where no argument does, or some call returns nothing."""
    if any(kinds == ("()",) for _, kinds in keyed):
        return None, None
    arity = [0 if kinds[0] == "" else len(kinds) for _, kinds in keyed]
    names = [n for n in sig.parameters if all(n in scalars for scalars, _ in keyed)]
    names.sort(key=lambda n: not all(isinstance(scalars[n], bool) for scalars, _ in keyed))
    for name in names:
        arities: dict[Any, int] = {}
        if all(arities.setdefault(scalars[name], a) == a for (scalars, _), a in zip(keyed, arity)):
            break
    else:
        return None, None
    items = [kinds[1:] if kinds[0] == "" else kinds for _, kinds in keyed]
    width = max(len(k) for k in items)
    union = ["Tensor" if all(len(k) > i and k[i] == "Tensor" for k in items) else "Tensor?" for i in range(width)]
    params = list(sig.parameters.values())
    p = sig.parameters[name]
    default = None if p.default is inspect.Parameter.empty else p.default
    rule = {"argument": name, "position": -1 if p.kind == p.KEYWORD_ONLY else params.index(p),
            "default": default, "arities": sorted(([v, a] for v, a in arities.items()), key=repr), "width": width}
    return "(" + ", ".join(union) + ")", rule


def _returns(results: set[tuple[str, ...]]) -> str | None:
    """The schema's results from every traced call's: a result None in some calls is ``Tensor?`` (FLA's
    ``(o, final_state or None)``); calls returning different arities or one value against a tuple, None."""
    if len(results) == 1 and ("()",) in results:
        return "()"
    if len({len(r) for r in results}) != 1 or len({r[0] == "" for r in results}) != 1:
        return None
    single = next(iter(results))[0] == ""
    kinds = []
    for position in zip(*results):
        if single and position[0] == "":
            continue
        kinds.append("Tensor" if set(position) == {"Tensor"} else "Tensor?")
    return kinds[0] if single else "(" + ", ".join(kinds) + ")"


_LEGACY_TENSOR = re.compile(r"\btorch\.(?:cuda\.)?(?:Long|Int|Short|Char|Byte|Bool|Half|BFloat16|Float|Double)Tensor\b")
"""torch's legacy tensor type names (``torch.LongTensor``), which annotations use for a tensor of that dtype."""


def _annotated_optional(fn: Any, p: inspect.Parameter) -> str | None:
    """The schema type of a parameter that every traced call leaves None, from its own annotation where that is an
    optional schema type (flash-attn's ``precomputed_lse: Optional[torch.Tensor] = None`` in a function whose other
    annotations ``infer_schema`` does not take whole: no result annotation, an unannotated ``process_group``)."""
    if p.annotation is inspect.Parameter.empty:
        return None
    one = inspect.Signature([p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)],
                            return_annotation=None)
    try:
        schema = _infer_schema(_plain_tensor_annotations(fn, one))
    except Exception:  # not a schema type
        return None
    found = re.match(rf"\(([\w\[\]?]+) {p.name}=None\)", schema)
    # ``lse: torch.Tensor = None`` means optional, as its default says (see ``_schema``'s annotation path)
    return f"{found.group(1).removesuffix('?')}?" if found else None


def _plain_tensor_annotations(fn: Any, sig: inspect.Signature) -> Any:
    """``fn`` as ``infer_schema`` reads it: its annotations evaluated where it was written (a string from ``from
    __future__ import annotations`` included), legacy tensor types (flash-linear-attention's ``cu_seqlens:
    torch.LongTensor | None``) read as ``torch.Tensor``; ``fn`` itself where nothing changes."""
    import torch

    # (where it was written: a decorated op's, FLA's @torch.compiler.disable, not the decorator's module)
    scope = {"torch": torch, **getattr(inspect.unwrap(fn), "__globals__", {})}

    def plain(annotation: Any) -> Any:
        if annotation is inspect.Parameter.empty or annotation is inspect.Signature.empty:
            return annotation
        text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
        if not isinstance(annotation, str) and not _LEGACY_TENSOR.search(text):
            return annotation
        try:
            return eval(_LEGACY_TENSOR.sub("torch.Tensor", text), scope)
        except Exception:
            return annotation

    params = [p.replace(annotation=plain(p.annotation)) for p in sig.parameters.values()]
    returns = plain(sig.return_annotation)
    if returns is sig.return_annotation and sig == inspect.signature(fn) \
            and all(p.annotation is q.annotation for p, q in zip(params, sig.parameters.values())):
        return fn

    def prototype(*args: Any, **kwargs: Any) -> Any:  # never called: infer_schema reads its signature
        raise NotImplementedError

    prototype.__signature__ = sig.replace(parameters=params, return_annotation=returns)  # type: ignore[attr-defined]
    prototype.__name__ = getattr(fn, "__name__", "op")
    return prototype


def _output_buffers(sig: inspect.Signature, calls: list[Call]) -> list[str]:
    """The parameters, in order, some traced call left None where the op's code put a tensor it writes or returns
    (mamba's ``out = torch.empty_like(x) if out is None else out``): a caller's tensor there would be written and
    returned. Not where a call passing one shows the op leaving it alone (vLLM's lightning attention clones its
    ``kv_history``)."""
    import torch

    def outputs(result: Any, rest: list[Any]) -> set[Any]:
        return {storage_id(t) for t in (*(rest[0] if rest else ()), *(result if isinstance(result, tuple) else (
            result,))) if isinstance(t, torch.Tensor)}

    found: set[str] = set()
    for _, _, result, *rest in calls:
        for name, value in (rest[1] if len(rest) > 1 else {}).items():
            if name not in found and isinstance(value, torch.Tensor) and storage_id(value) in outputs(result, rest):
                passed = [(b[name], r, rst) for args, kwargs, r, *rst in calls
                          if (b := _bound(sig, args, kwargs)) is not None and isinstance(b.get(name), torch.Tensor)]
                if passed and all(storage_id(v) not in outputs(r, rst) for v, r, rst in passed):
                    continue  # each tensor passed there is neither written nor returned: an input
                found.add(name)
    return [name for name in sig.parameters if name in found]


def _written_arguments(sig: inspect.Signature, calls: list[Call]) -> list[str]:
    """The tensor arguments, in parameter order, whose memory a traced call's kernels may write."""
    names: set[str] = set()
    for args, kwargs, _, *rest in calls:
        writes = {storage_id(t) for t in (rest[0] if rest else [])}
        if not writes:
            continue
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            continue
        names |= {n for n, v in bound.arguments.items() if hasattr(v, "untyped_storage") and storage_id(v) in writes}
    return [n for n in sig.parameters if n in names]


def meta_mismatch(fn: Callable[..., Any], calls: list[Call]) -> str | None:
    """Why the op's Meta implementation (``torch_ops.fake_call``: the host code on meta tensors, launches skipped,
    tensor values it reads stood in) does not give some traced call's results as the real call gave them (structure,
    dtypes, sizes, strides), or None where it gives every one. Run by the build, so an op torch.compile could not
    trace gets no custom op rather than an error while a user's model compiles."""
    import torch

    def meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if isinstance(value, (list, tuple)):
            return type(value)(meta(v) for v in value)
        return value

    def seen(out: Any) -> Any:  # the layout without the device (the examples ran on the CPU)
        found = layout(out)
        if found[0] == "tensor":
            return found[:2] + found[3:]
        if found[0] in ("tuple", "list"):
            return found[0], tuple(seen(o) for o in out)
        return found

    from .ongpu import tensors_on_gpu

    fn = getattr(fn, "_init_fn", fn)  # a @torch.library.custom_op's own function, as the runtime's Meta runs it
    for args, kwargs, result, *_ in calls:
        try:
            # torch.compile's fake tensors say they are on the GPU (``assert x.is_cuda`` holds): so do these
            with tensors_on_gpu("meta"):
                out = fake_call(fn, meta(args), {k: meta(v) for k, v in kwargs.items()})
        except Exception as exc:
            # where in the host code (a 0-dim tensor used as a size, ``torch.zeros(h, counts[-1])``, reads it)
            host = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == fn.__code__.co_filename] \
                if hasattr(fn, "__code__") else []
            at = f" at {os.path.basename(host[-1].filename)}:{host[-1].lineno} ({(host[-1].line or '').strip()})" \
                if host else ""
            return f"its Meta implementation (the host code on meta tensors) fails{at}: {type(exc).__name__}: {exc}"
        if seen(out) != seen(result):
            grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values()))
            return (f"its Meta implementation (the host code on meta tensors) gives other results than the call: "
                    f"{_difference(seen(out), seen(result))}" + (
                        "; the call's inputs required grad, which a custom op's inputs do not (host code that "
                        "branches on requires_grad, as Liger's fused linear cross-entropy does, returns other "
                        "results inside one)" if grad else ""))
    return None


def _difference(meta: Any, real: Any, where: str = "the result") -> str:
    """Where two ``layout``s (less the device) first differ, said as "result 5: None, not a tensor of ..."."""
    def said(found: Any) -> str:
        if found[0] == "tensor":
            return f"a {found[1].removeprefix('torch.')} tensor of size ({', '.join(found[2])})"
        return f"a {found[0]} of {len(found[1])}" if found[0] in ("tuple", "list") else found[1]

    if meta[0] == real[0] and meta[0] in ("tuple", "list") and len(meta[1]) == len(real[1]):
        i = next(i for i, (m, r) in enumerate(zip(meta[1], real[1])) if m != r)
        return _difference(meta[1][i], real[1][i], f"{'result' if where == 'the result' else where + ' item'} {i}")
    return f"{where} is {said(meta)} there, {said(real)} in the call"
