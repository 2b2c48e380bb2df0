"""A custom op's real implementation held to its schema: what the op writes, and that its results are its own.

The build reads what an op writes from its examples (``schema.py``): the tensors its launches write through and those
an in-place torch op changes. A call with a layout the examples never ran can still write an argument the schema says
the op keeps. Liger's rope writes ``q = q.transpose(1, 2).contiguous()``, which for the layout Hugging Face models
pass is ``q``'s own memory; torch.compile and torch.export trust the schema, so the write would go unseen and later
reads of ``q`` would be wrong. While a custom op's real implementation runs, its ``Guard`` stands in
``kernel.LAUNCHES.skip``:

- a launch whose kernel writes through a pointer into the memory of an argument the schema does not mark written
  (``Tensor(a!)``) is refused before it runs (before its config's pre-hook too), on the C path and the Python path,
  naming the op, kernel and argument;
- a result that is an input, a view of one or another result is copied (a custom op's results may not alias).

Not guarded: an in-place torch operation on such an argument (the build counts those its examples make, from the
version counters; checking every call's would cost about 0.8 µs more), and an argument sharing its storage with a
written one (the whole storage is the written argument's). Plain calls of an exported op run the host code as
written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch  # loaded by a custom op's first real call: torch is there

from .errors import ForgeRuntimeError
from .kernel import LAUNCHES


class Guard(tuple):  # type: ignore[type-arg]
    """``(lo0, hi0, lo1, hi1, ...)``: the storages of the arguments the op keeps, as address ranges (what the C path
    reads, ``_fastlaunch.c`` ``guard_allows``); ``ops``: per range, the custom op that keeps it (guards of nested
    custom ops join); ``call``: per custom op, (op, its schema's positional names, args, kwargs), from which a
    refusal names the argument."""

    ops: tuple[str, ...]
    call: list[tuple[str, list[str], tuple[Any, ...], dict[str, Any]]]

    def check(self, kernel: Any, runtime: Any, call: Any = None) -> None:
        """Raise, before ``kernel`` launches with ``runtime`` (and the call-site values ``call``), where it would
        write into a kept argument."""
        for pos in _written_positions(kernel, call or {}):
            value, param = runtime[pos], kernel.runtime_names[pos]
            if value is None or type(value) is int:
                continue
            address = getattr(value, "base", value).data_ptr()  # a host-side TensorDescriptor writes its tensor
            for i in range(0, len(self), 2):
                if self[i] <= address < self[i + 1]:
                    op = self.ops[i // 2]
                    name, kept = next((n, t) for o, names, args, kwargs in self.call if o == op
                                      for n, v in (*zip(names, args), *kwargs.items()) for t in _tensors(v)
                                      if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == self[i])
                    raise ForgeRuntimeError(
                        f"{op}: kernel {kernel.function} would write argument {name} (through its parameter "
                        f"{param}), which the op's custom op says it does not write; nothing was launched. The build "
                        f"reads what an op writes from its examples, and none passed {name} as this call does "
                        f"(shape {tuple(kept.shape)}, strides {tuple(kept.stride())}), for which the host code "
                        "gives the kernel its memory. torch.compile and torch.export trust the schema, so the write "
                        "would go unseen: add an example call like this one to the examples function and rebuild")


def _written_positions(kernel: Any, call: dict[str, Any]) -> tuple[int, ...]:
    """The runtime arguments a launch may write through: those the flags it passes reach (the index's
    ``writes_when``: FlashInfer's rms_norm writes ``x`` only without ``HAS_OUTPUT``), else all it may ever write.
    (The C path refuses every guarded launch of such a kernel to this check: it knows no flags.)"""
    when = kernel.__dict__.get("_written_when")
    if when is None:  # the positions of each combination's names, once per kernel
        when = kernel._written_when = [(flags, tuple(i for i, n in enumerate(kernel.runtime_names) if n in names))
                                       for flags, names in kernel.spec.get("writes_when", ())]
    for flags, positions in when:
        if all(isinstance(call.get(n), bool) and call[n] is v for n, v in flags):
            return positions
    return kernel.written_pos


def _joined(outer: Any, inner: Guard) -> Guard:
    """A custom op called inside another's real implementation keeps what both keep."""
    if not isinstance(outer, Guard):
        return inner
    joined = Guard((*outer, *inner))
    joined.ops, joined.call = (*outer.ops, *inner.ops), [*outer.call, *inner.call]
    return joined


def arguments(qualified: str, schema: str) -> tuple[list[str], frozenset[str]]:
    """A schema's positional argument names in order, and the names it marks written (``Tensor(a!)``)."""
    parsed = torch._C.parse_schema(f"{qualified.replace('.', '::', 1)}{schema}")
    return ([a.name for a in parsed.arguments if not a.kwarg_only],
            frozenset(a.name for a in parsed.arguments if a.alias_info is not None and a.alias_info.is_write))


def _tensors(value: Any) -> Any:
    return value if isinstance(value, (list, tuple)) else (value,)


def guarded(qualified: str, names: list[str], written: frozenset[str], fn: Callable[..., Any],
            args: tuple[Any, ...], kwargs: dict[str, Any], call: tuple[tuple[Any, ...], dict[str, Any]],
            rule: Any = None) -> Any:
    """``fn(*call[0], **call[1])`` under the guard of the custom op ``qualified`` called with ``args, kwargs`` (its
    schema's ``names`` and ``written`` ones, see ``arguments``); its results padded by ``rule`` where the op has one
    (``torch_ops.pad``) and copied where they alias an argument or each other. What compiled graphs run for every
    call of the op: kept to a few storage reads per tensor argument (3.8 – 4.0 µs for two on the H100 host)."""
    tensor = torch.Tensor
    values: tuple[Any, ...] = (*args, *kwargs.values())
    inputs: set[int] = set()  # every tensor argument's storage; first those of the written ones, the op's to write
    if written:
        bound = [*zip(names, args), *kwargs.items()]
        inputs = {t.untyped_storage().data_ptr() for n, v in bound if n in written for t in _tensors(v)
                  if isinstance(t, tensor)}
        values = tuple(v for n, v in bound if n not in written)
    ranges: list[int] = []
    for value in values:
        for t in (value,) if type(value) is tensor else _tensors(value):
            if type(t) is tensor or isinstance(t, tensor):
                storage = t.untyped_storage()
                lo = storage.data_ptr()
                if lo not in inputs:
                    inputs.add(lo)
                    if lo:  # not an empty storage
                        ranges += (lo, lo + storage.nbytes())
    previous = LAUNCHES.skip
    if ranges and previous is not True:
        guard = Guard(ranges)
        guard.ops, guard.call = (qualified,) * (len(ranges) // 2), [(qualified, names, args, kwargs)]
        LAUNCHES.skip = _joined(previous, guard)
    try:
        out = fn(*call[0], **call[1])
    finally:
        LAUNCHES.skip = previous
    if rule is not None:
        from .torch_ops import pad

        out = pad(rule, out, args, kwargs)
    return _own(out, inputs)


def own(out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``out`` with every result tensor that is an argument, a view of one or of an earlier result copied; on any
    tensors, fake ones included (the Meta implementation's results: storages told apart by identity, not address)."""
    return _own(out, {t.untyped_storage()._cdata for v in (*args, *kwargs.values()) for t in _tensors(v)
                      if isinstance(t, torch.Tensor)}, "_cdata")


def _own(out: Any, seen: set[int], ident: str = "data_ptr") -> Any:
    """``out`` with each result tensor whose storage (its ``ident``: the address, or the storage's identity) is in
    ``seen`` (the arguments', then each earlier result's) copied."""
    def storage(t: Any) -> int:
        st = t.untyped_storage()
        return st.data_ptr() if ident == "data_ptr" else st._cdata

    tensor = torch.Tensor
    if type(out) is tensor:  # one result
        key = storage(out)
        return out.clone() if key and key in seen else out
    owned = []
    copied = False
    for r in out if isinstance(out, tuple) else (out,):
        if isinstance(r, tensor):
            key = storage(r)
            if key in seen and key:  # an empty storage's address (0) aliases nothing
                r, copied = r.clone(), True
                key = storage(r)
            seen.add(key)
        owned.append(r)
    if not copied:
        return out
    return tuple(owned) if isinstance(out, tuple) else owned[0]
