"""Run a kernel file's examples on the CPU with every kernel launch recorded instead of run.

The host code is the same text the wheel ships, bound to recording kernel handles: what each call passes
(dtypes, call-site constexprs and launch options, key values, each argument's specialization) tells the
build which binaries the ops really need. Kernels do not run, so outputs hold uninitialised memory; an
examples function must not depend on their values.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

from . import runtime as rt
from .errors import SourceError
from .plan import KernelPlan, TracedCall


class TraceKernel(rt.Kernel):
    """A kernel handle that binds a call like the packaged one and records it."""

    def __init__(self, name: str, spec: dict[str, Any], targets: dict[str, Any], backend: Any) -> None:
        super().__init__(name, spec, targets, backend)
        self.records: list[TracedCall] = []

    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        runtime, call = self._bind(args, kwargs)
        values = list(runtime)
        for i in self.ptr_pos:
            try:
                values[i] = runtime[i].data_ptr()
            except AttributeError:
                raise TypeError(f"{self.function}(): argument '{self.runtime_names[i]}' must be a tensor, got "
                                f"{type(runtime[i]).__name__}") from None
        key = tuple(int(runtime[src]) if is_rt else call[src] for is_rt, src in self.key_sources)
        named = {**dict(zip(self.runtime_names, runtime)), **call} if self.heuristics else None
        self.records.append(TracedCall(self.name, self.axis_values(runtime, call), key,
                                       rt.argument_spec(self.spec_slots, values), named))


def trace_examples(kernels: dict[str, KernelPlan], modules: dict[str, dict[str, Any]]) -> dict[str, list[TracedCall]]:
    """Run every host module (binding the kernels' heuristics) and its examples functions; returns the recorded
    launches per kernel entry name, and sets each module's ``schemas``: the torch.library schema of each op
    (see ``schema``), with ``schema_notes`` saying where it came from or why there is none."""
    from .schema import op_schema

    by_function = {kp.function: kp for kp in kernels.values()}
    out: dict[str, list[TracedCall]] = {}
    for mod_name, mod in sorted(modules.items()):
        plans = [by_function[f] for f in mod["kernels"]]
        index = {"targets": {}, "kernels": {kp.name: kp.spec_json() for kp in plans},
                 "modules": {mod_name: {"kernels": mod["kernels"], "ops": []}}}
        handles: dict[str, TraceKernel] = {}

        def factory(name: str, spec: dict[str, Any], targets: dict[str, Any], backend: Any,
                    handles: dict[str, TraceKernel] = handles) -> TraceKernel:
            handles[name] = TraceKernel(name, spec, targets, backend)
            return handles[name]

        source = mod["source"]
        try:
            module = rt.bind_module(f"_forge_trace_{mod_name}", index, mod_name, None, factory,
                                    (str(source.path), source.host_source))
        except Exception as exc:
            raise SourceError(f"{source.path}: running the host code failed:\n{_trace(exc)}") from None
        for kp in plans:
            kp.heuristics = list(handles[kp.name].heuristics)
            if [n for n, _ in kp.heuristics] != kp.heuristic_names:
                raise SourceError(f"{source.path}: the host copy of {kp.function}'s @triton.heuristics gives "
                                  f"{[n for n, _ in kp.heuristics]}, the decorator {kp.heuristic_names}")
        op_calls: dict[str, list[tuple[tuple[Any, ...], dict[str, Any], Any]]] = {op: [] for op in mod["ops"]}
        originals = {op: getattr(module, op) for op in mod["ops"]}
        depth = [0]

        def recorder(op: str, fn: Any, depth: list[int] = depth,
                     op_calls: dict[str, list[Any]] = op_calls) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                depth[0] += 1
                try:
                    result = fn(*args, **kwargs)
                finally:
                    depth[0] -= 1
                if depth[0] == 0:  # the op as the examples call it, not as another op calls it
                    op_calls[op].append((args, kwargs, result))
                return result
            return call

        for op, fn in originals.items():
            setattr(module, op, recorder(op, fn))
        try:
            for fn_name in sorted(mod["examples"]):
                try:
                    getattr(module, fn_name)("cpu")
                except Exception as exc:
                    raise SourceError(f"{source.path}: examples function {fn_name}('cpu') failed (kernels are "
                                      f"recorded, not run, on the CPU):\n{_trace(exc)}") from None
        finally:
            for op, fn in originals.items():
                setattr(module, op, fn)
        mod["schemas"], mod["schema_notes"] = {}, {}
        for op, fn in originals.items():
            mod["schemas"][op], mod["schema_notes"][op] = op_schema(fn, op_calls[op])
        for name, handle in handles.items():
            out[name] = handle.records
    return out


def _trace(exc: BaseException) -> str:
    frames: Sequence[traceback.FrameSummary] = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "forge_aot" not in f.filename]
    lines = [f"  {f.filename}:{f.lineno} in {f.name}: {f.line}" for f in mine[-4:]]
    return "\n".join([*lines, f"  {type(exc).__name__}: {exc}"])
