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
        # Arguments by name, for heuristics and for tuning's pruning hooks (meta or CPU tensors, ints).
        named = {**dict(zip(self.runtime_names, runtime)), **call}
        self.records.append(TracedCall(self.name, self.axis_values(runtime, call), key,
                                       rt.argument_spec(self.spec_slots, values), named))


class Tracer:
    """The host modules of a build bound to recording kernel handles (once per module), for the examples
    functions and the tuning inputs."""

    def __init__(self, kernels: dict[str, KernelPlan], modules: dict[str, dict[str, Any]]) -> None:
        self.kernels = kernels
        self.by_function = {kp.function: kp for kp in kernels.values()}
        self.modules: dict[str, Any] = {}
        self.handles: dict[str, TraceKernel] = {}
        self.paths: dict[str, str] = {}
        for mod_name, mod in sorted(modules.items()):
            plans = [self.by_function[f] for f in mod["kernels"]]
            index = {"targets": {}, "kernels": {kp.name: kp.spec_json() for kp in plans},
                     "modules": {mod_name: {"kernels": mod["kernels"], "ops": [],
                                            **({"package": mod["package"]} if mod.get("package") else {})}}}

            def factory(name: str, spec: dict[str, Any], targets: dict[str, Any], backend: Any) -> TraceKernel:
                self.handles[name] = TraceKernel(name, spec, targets, backend)
                return self.handles[name]

            source = mod["source"]
            self.paths[mod_name] = str(source.path)
            try:
                self.modules[mod_name] = rt.bind_module(f"_forge_trace_{mod_name}", index, mod_name, None, factory,
                                                        (str(source.path), source.host_source))
            except Exception as exc:
                raise SourceError(f"{source.path}: running the host code failed:\n{_trace(exc)}") from None
            for kp in plans:
                kp.heuristics = list(self.handles[kp.name].heuristics)
                if [n for n, _ in kp.heuristics] != kp.heuristic_names:
                    raise SourceError(f"{source.path}: the host copy of {kp.function}'s @triton.heuristics gives "
                                      f"{[n for n, _ in kp.heuristics]}, the decorator {kp.heuristic_names}")

    def run_examples(self, modules: dict[str, dict[str, Any]]) -> dict[str, list[TracedCall]]:
        """Run every module's examples functions; returns the recorded launches per kernel entry name and sets
        each module's ``schemas``: the torch.library schema of each op (see ``schema``), with
        ``schema_notes`` saying where it came from or why there is none."""
        from .schema import op_schema

        for mod_name, mod in sorted(modules.items()):
            module = self.modules[mod_name]
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
                        raise SourceError(f"{self.paths[mod_name]}: examples function {fn_name}('cpu') failed "
                                          f"(kernels are recorded, not run, on the CPU):\n{_trace(exc)}") from None
            finally:
                for op, fn in originals.items():
                    setattr(module, op, fn)
            mod["schemas"], mod["schema_notes"] = {}, {}
            for op, fn in originals.items():
                mod["schemas"][op], mod["schema_notes"][op] = op_schema(fn, op_calls[op])
        out: dict[str, list[TracedCall]] = {}
        for name, handle in self.handles.items():
            out[name] = handle.records
            handle.records = []
        return out

    def trace_inputs(self, kp: KernelPlan, assignment: dict[str, Any], key: tuple[int, ...]) -> list[TracedCall]:
        """The launches of ``kp`` that its tuning op makes on the tuning inputs of one row (``tune.inputs``),
        traced on the meta device (no memory; the CPU where the host code needs values). Raises SourceError
        when the inputs do not launch the kernel in that variant with that key."""
        t = kp.entry.tune
        module = self.modules[kp.module]
        where = self.paths[kp.module]
        handle = self.handles[kp.name]
        variant = tuning_variant(kp, assignment)
        key_dict = dict(zip(kp.key, key))
        op_name = t.op or kp.entry.ops[0]
        last: Exception | None = None
        for device in ("meta", "cpu"):
            handle.records = []
            try:
                args = call_inputs(getattr(module, t.inputs), key_dict, variant, device)  # type: ignore[arg-type]
                call_op(getattr(module, op_name), args)
            except Exception as exc:
                last = exc
                continue
            break
        else:
            assert last is not None
            raise SourceError(f"{where}: {t.inputs}({key_dict}, {variant}) then {op_name}() failed (kernels are "
                              f"recorded, not run):\n{_trace(last)}")
        records, handle.records = handle.records, []
        values = tuple(assignment[a] for a in kp.axes)
        mine = [c for c in records if c.values == values and c.key == key]
        if not mine:
            seen = sorted({f"{dict(zip(kp.axes, c.values))} key {dict(zip(kp.key, c.key))}" for c in records})
            raise SourceError(f"{where}: {t.inputs}({key_dict}, {variant}) then {op_name}() does not launch "
                              f"{kp.function} in variant {assignment} with key {key_dict}; it launched "
                              f"{'; '.join(seen) or 'nothing'}")
        return mine


def tuning_variant(kp: KernelPlan, assignment: dict[str, Any]) -> dict[str, Any]:
    """What a ``tune.inputs`` function gets as ``variant``: type variables as torch dtypes, other axes as is."""
    import torch

    out: dict[str, Any] = {}
    for axis, value in assignment.items():
        out[axis] = getattr(torch, TORCH_DTYPES[value]) if axis in kp.entry.dtypes else value
    return out


TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64", "i8": "int8",
                "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
                "u64": "uint64", "i1": "bool", "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2"}


def call_inputs(fn: Any, key: dict[str, int], variant: dict[str, Any], device: str) -> Any:
    return fn(dict(key), dict(variant), device)


def call_op(op: Any, args: Any) -> Any:
    """Call an op with what a ``tune.inputs`` function returned: a tuple (positional) or a dict (keywords)."""
    if isinstance(args, dict):
        return op(**args)
    if isinstance(args, (tuple, list)):
        return op(*args)
    return op(args)


def _trace(exc: BaseException) -> str:
    frames: Sequence[traceback.FrameSummary] = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "forge_aot" not in f.filename]
    lines = [f"  {f.filename}:{f.lineno} in {f.name}: {f.line}" for f in mine[-4:]]
    return "\n".join([*lines, f"  {type(exc).__name__}: {exc}"])
