"""Run a kernel file's examples on the CPU with every kernel launch recorded instead of run.

The host code is the same text the wheel ships, bound to recording kernel handles: what each call passes
(dtypes, call-site constexprs and launch options, key values, each argument's specialization) tells the
build which binaries the ops really need. Kernels do not run, so outputs hold uninitialised memory; an
examples function must not depend on their values.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import math
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from . import runtime as rt
from .errors import SourceError
from .introspect import as_host_call, recording_library_registrations, undo_library_registrations
from .ongpu import (
    cuda_registrations_serve_cpu,
    machine_has_gpu,
    patched_while_inside,
    tensors_on_gpu,
    watching_torch_calls,
)
from .output_reads import OutputReads
from .plan import KernelPlan, TracedCall
from .runtime.exports import applied_function, host_signature
from .runtime.host_triton import KernelSide
from .runtime.kernel import LAUNCHES
from .sourcesplit import function_writes

TRACED_TARGET: list[str | None] = [None]
"""The target recorded with each traced call: the one whose GPU host code saw, where the build traces per target
(host code that asks about the device); None where it traces once."""


@contextlib.contextmanager
def recording_reads(into: set[str]) -> Iterator[None]:
    """Add to ``into`` the real path of every file host code opens for reading on this thread while this runs
    (vLLM's tuned-config JSON beside its kernel file): the plan ships those of the project with the host code.
    Other threads' reads (the tuner's, the build's) are not host code's."""
    import builtins
    import io
    import os
    import threading

    real = builtins.open
    tracing = threading.get_ident()

    def recording_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real(file, mode, *args, **kwargs)
        if threading.get_ident() == tracing and isinstance(file, (str, bytes, os.PathLike)) \
                and not any(c in mode for c in "wax+"):
            into.add(os.path.realpath(os.fsdecode(file)))
        return handle

    builtins.open = io.open = recording_open  # pathlib opens through io.open
    try:
        yield
    finally:
        builtins.open = io.open = real


@contextlib.contextmanager
def recording_imports(into: dict[str, str | None]) -> Iterator[None]:
    """Add to ``into`` the modules (name → file) host code imports by ``importlib.import_module`` on this thread
    while this runs (FLA's ``dispatch`` names its backends module at run time): the build cannot read such names, so
    the plan warns of the project's own among them that the wheel does not ship."""
    import importlib
    import threading

    real = importlib.import_module
    tracing = threading.get_ident()

    def recording_import(name: str, package: str | None = None) -> Any:
        module = real(name, package)
        if threading.get_ident() == tracing:
            into[module.__name__] = getattr(module, "__file__", None)
        return module

    importlib.import_module = recording_import
    try:
        yield
    finally:
        importlib.import_module = real


@contextlib.contextmanager
def as_target(target: str, tag: bool, model: str | None = None) -> Iterator[None]:
    """Host code runs as on a representative GPU of ``target`` (``triton.runtime.driver.active`` and ``torch.cuda``'s
    device queries answer with its properties; see targets.representative_device); ``tag``: record the target with
    each call; ``model``: the GPU of ``targets.GPU_MODELS`` it stands for (default: the target's)."""
    from .targets import TARGETS, representative_device, torch_answers_as

    info = TARGETS[target]
    previous = rt.DEVICE_PROFILE[0], TRACED_TARGET[0]
    rt.DEVICE_PROFILE[0] = (rt.GPUTarget(info.backend, info.arch, info.warp_size),
                            representative_device(target, model)[1])
    TRACED_TARGET[0] = target if tag else None
    # Project helper modules run with Triton itself at build time (the wheel gives them the runtime's shim): its
    # driver answers as the same GPU while host code runs.
    triton_driver = getattr(sys.modules.get("triton.runtime.driver"), "driver", None)
    active = getattr(triton_driver, "_active", None)
    try:
        if triton_driver is not None:
            from .introspect import _BuildTargetDriver

            triton_driver.set_active(_BuildTargetDriver(f"{info.backend}:{info.arch}:{info.warp_size}"))
        with torch_answers_as(target, model):
            yield
    finally:
        rt.DEVICE_PROFILE[0], TRACED_TARGET[0] = previous
        if triton_driver is not None:
            triton_driver._active = active


@contextlib.contextmanager
def fresh_modules(names: set[str]) -> Iterator[None]:
    """The project modules ``names`` (dotted) import afresh inside (what they ask the device at import, as
    ``is_hopper = ...``, is asked again for the target being traced); the modules imported before are back after."""
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n in names}
    try:
        yield
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


@contextlib.contextmanager
def bound_names(modules: dict[str, Any]) -> Iterator[None]:
    """While host code runs (examples, tuning inputs), a kernel file that project code imports by its project name
    (inside a function, or through a helper imported earlier) is its bound host module under that name, as in the
    wheel, whose import system binds on demand; the project's own modules are back afterwards."""
    missing = object()
    saved = {name: sys.modules.get(name, missing) for name in modules}
    attrs: list[tuple[Any, str, Any]] = []
    parents: list[str] = []  # packages imported here: they and what they imported are gone afterwards
    before = set(sys.modules)
    try:
        sys.modules.update(modules)
        for name, module in modules.items():
            parent, _, child = name.rpartition(".")
            if parent and parent not in sys.modules:  # its package first, as Python imports it (its __init__
                with contextlib.suppress(Exception):  # importing the file back gets the bound module)
                    importlib.import_module(parent)
                    parents.append(parent)
            if parent in sys.modules:  # ``import pkg.mod`` then ``pkg.mod.op``: the attribute on the package too
                attrs.append((sys.modules[parent], child, getattr(sys.modules[parent], child, missing)))
                setattr(sys.modules[parent], child, module)
        yield
    finally:
        for owner, child, value in reversed(attrs):
            if value is missing:
                with contextlib.suppress(AttributeError):
                    delattr(owner, child)
            else:
                setattr(owner, child, value)
        for name, module in saved.items():
            if module is missing:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        tops = {p.partition(".")[0] for p in parents}
        for name in [n for n in sys.modules if n not in before and n.partition(".")[0] in tops]:
            del sys.modules[name]


def function_constexpr(kernel: str, param: str, value: Any, known_functions: dict[str, tuple[str, str]]) -> str:
    """A constexpr value that is a function: a ``@triton.jit`` function of a host module (bound as the wheel binds it,
    a ``KernelSide``) or of a project helper module (Triton's ``JITFunction`` at build time), as the text the wheel's
    call will pass, recorded in ``known_functions`` (text -> file and name, for the compile step); anything else
    callable is refused (Triton cannot compile it either)."""
    if isinstance(value, KernelSide) and value.file is not None:
        module, name, file = value.module.removeprefix("_forge_trace_"), value.name, value.file
    elif type(value).__name__ == "JITFunction" and getattr(getattr(value, "fn", None), "__code__", None):
        module, name, file = value.__module__, value.__name__, value.fn.__code__.co_filename
    else:
        shown = getattr(value, "__name__", None) or type(value).__name__
        raise TypeError(f"{kernel}(): constexpr '{param}' is passed {shown}, a function that is not a @triton.jit "
                        "function of the project: a constexpr takes numbers, bools, strings, Triton types and "
                        "@triton.jit functions")
    text = str(KernelSide(name, module))
    known = known_functions.setdefault(text, (file, name))
    if known != (file, name):
        raise TypeError(f"{kernel}(): constexpr '{param}' is passed {name} of {file}, and another call {known[1]} of "
                        f"{known[0]}: the wheel tells functions apart by module and name ({text}); rename one")
    return text


class TraceKernel(rt.Kernel):
    """A kernel handle that binds a call like the packaged one and records it."""

    def __init__(self, name: str, spec: dict[str, Any], targets: dict[str, Any], backend: Any,
                 functions: dict[str, tuple[str, str]] | None = None) -> None:
        super().__init__(name, spec, targets, backend)
        self.records: list[TracedCall] = []
        self.on_record: Callable[[str, TracedCall], None] | None = None
        """Told of each record as it is made (the examples' ``output_reads``)."""
        self.constexpr_functions = {} if functions is None else functions
        """The tracer's ``@triton.jit`` functions passed as constexprs (see ``function_constexpr``); a handle made
        alone keeps its own."""

    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # A Triton element type from a project helper module (Liger's torch_to_triton_dtype: helpers run with
        # Triton itself at build time) is recorded as the runtime's stand-in, as the wheel's host code passes it.
        runtime, call = self._bind(*as_host_call(args, kwargs))
        if LAUNCHES.skip is True:  # the build's run of a Meta implementation (schema.meta_mismatch): no record
            return rt.PlaceholderCompiled(self, call)
        for name, value in call.items():
            if callable(value) and not isinstance(value, type):  # (a KernelSide is a callable str)
                call[name] = function_constexpr(self.function, name, value, self.constexpr_functions)
        values = list(runtime)
        for i in self.ptr_pos:
            try:
                values[i] = rt.pointer_value(runtime[i])
                if type(values[i]) is rt.PointerInt and i not in self.pointer_ints:
                    raise TypeError(f"{self.function}(): argument '{self.runtime_names[i]}' must be a tensor, got "
                                    f"int (one that takes either is typed like '*i32|i32' in the manifest's "
                                    "signature)")
            except AttributeError:
                raise TypeError(f"{self.function}(): argument '{self.runtime_names[i]}' must be a tensor, got "
                                f"{type(runtime[i]).__name__}") from None
        key = tuple(int(runtime[src]) if is_rt else call[src] for is_rt, src in self.key_sources)
        # Arguments by name, for heuristics and for tuning's pruning hooks (meta or CPU tensors, ints).
        named = {**dict(zip(self.runtime_names, runtime)), **call}
        self.records.append(TracedCall(self.name, self.axis_values(runtime, call), key,
                                       rt.argument_spec(self.spec_slots, values), named, TRACED_TARGET[0],
                                       tuple(kwargs)))
        if self.on_record is not None:
            self.on_record(self.name, self.records[-1])
        # what a launch returns (Triton's CompiledKernel: Unsloth's MoE GEMMs log its registers): no binary yet
        return rt.PlaceholderCompiled(self, call)

    @property
    def arg_names(self) -> list[str]:
        """As a ``JITFunction``'s: what Triton's ``heuristics`` decorator reads of the function it wraps."""
        return self.param_names

    def warmup(self, *args: Any, grid: Any = None, **kwargs: Any) -> Any:
        """``kernel.warmup(...)``: recorded as the launch it prepares; its figures are placeholders (no binary
        exists yet; see PlaceholderCompiled)."""
        self.run(grid, args, kwargs)
        return rt.PlaceholderCompiled(self, self._bind(args, kwargs)[1])


class Tracer:
    """The host modules of a build bound to recording kernel handles (once per module), for the examples
    functions and the tuning inputs."""

    def __init__(self, kernels: dict[str, KernelPlan], modules: dict[str, dict[str, Any]], target: str,
                 per_target: bool = False, model: str | None = None, root: str | None = None) -> None:
        """``target``, ``model``: the host code sees that GPU (``as_target``); ``per_target``: the build traces once
        per target (and GPU model), and each call records the target it was traced for. ``root``: the project's
        directory, which messages name files from."""
        self.functions: dict[str, tuple[str, str]] = {}
        """Each ``@triton.jit`` function host code passed as a constexpr, by its text (``runtime.KernelSide``'s):
        its file and name, for the compile step (SGLang's ``SCORE_MOD=score_mod``)."""
        self.target = target
        self.root = root
        self.model = model
        self.per_target = per_target
        self.files_read: set[str] = set()
        """Files host code opened for reading while binding and running examples (see ``recording_reads``)."""
        self.imported: dict[str, str | None] = {}
        """Modules host code imported by a name made at run time, with their files (see ``recording_imports``)."""
        self.output_reads = OutputReads(self._is_host_file)
        """Where the examples' host code read values a recorded launch wrote (see ``output_reads``)."""
        helpers = {name for kp in kernels.values() for name in kp.local_modules} if per_target else set()
        # Module-level code of the kernel files and their helpers runs here: allocations on "cuda" stay on the CPU
        # where the machine has no GPU (on one with a GPU they are real: helper modules stay imported for the
        # process, dev mode's and the benchmarks' kernels then get real GPU tensors from them).
        # What introspection (or an earlier trace) registered on project code's torch Libraries is registered
        # again as the host code binds: taken back first.
        undo_library_registrations()
        with as_target(target, per_target, model), fresh_modules(helpers), recording_reads(self.files_read), \
                recording_imports(self.imported), recording_library_registrations(), \
                (contextlib.nullcontext() if machine_has_gpu() else tensors_on_gpu("cpu")), no_triton_launches(), \
                cuda_registrations_serve_cpu():
            self._bind_all(kernels, modules)

    def _is_host_file(self, filename: str) -> bool:
        """Whether a code object's file is the project's host code (a kernel file, a helper module of the project)."""
        if filename in self.paths.values():
            return True
        root = os.path.abspath(self.root) + os.sep if self.root else None
        return root is not None and filename.startswith(root) and "site-packages" not in filename \
            and not filename.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep)

    def _listed(self) -> set[tuple[str, str]]:
        return {(str(kp.source), kp.function) for kp in self.kernels.values()}

    def _bind_all(self, kernels: dict[str, KernelPlan], modules: dict[str, dict[str, Any]]) -> None:
        self.kernels = kernels
        self.by_function = {(kp.module, kp.function): kp for kp in kernels.values()}
        self.modules: dict[str, Any] = {}
        self.handles: dict[str, TraceKernel] = {}
        self.paths: dict[str, str] = {}
        self.aliased: dict[str, Any] = {}
        """Project name -> bound host module, for kernel files other project code imports (``imported_as``): those
        names reach the bound modules while host code runs, as they do while binding (see ``bound_names``)."""
        entries = {mod_name: {"kernels": mod["kernels"], "ops": [],
                              **{k: mod[k] for k in ("package", "imported_as", "imports_host") if mod.get(k)}}
                   for mod_name, mod in modules.items()}
        with rt.project_names_bound(entries, lambda m, names: self._bind(m, modules[m], entries[m], names)) \
                as bound:
            for mod_name in rt.imports_first(entries):
                bound(mod_name)

    def _bind(self, mod_name: str, mod: dict[str, Any], entry: dict[str, Any], names: tuple[str, ...]) -> Any:
        plans = [self.by_function[(mod_name, f)] for f in mod["kernels"]]
        index = {"targets": {}, "kernels": {kp.name: kp.spec_json() for kp in plans}, "modules": {mod_name: entry}}

        def factory(name: str, spec: dict[str, Any], targets: dict[str, Any], backend: Any) -> TraceKernel:
            self.handles[name] = TraceKernel(name, spec, targets, backend, self.functions)
            return self.handles[name]

        source = mod["source"]
        self.paths[mod_name] = str(source.path)
        try:
            self.modules[mod_name] = rt.bind_module(f"_forge_trace_{mod_name}", index, mod_name, None, factory,
                                                    (str(source.path), source.host_source), aliases=names)
        except Exception as exc:
            raise SourceError(f"{source.path}: running the host code failed:\n{_trace(exc)}") from None
        self.aliased.update(dict.fromkeys(names, self.modules[mod_name]))
        for kp in plans:
            kp.pre_hooks = dict(self.handles[kp.name].pre_hooks)
            kp.heuristics = list(self.handles[kp.name].heuristics)
            if [n for n, _ in kp.heuristics] != kp.heuristic_names:
                raise SourceError(f"{source.path}: the host copy of {kp.function}'s @triton.heuristics gives "
                                  f"{[n for n, _ in kp.heuristics]}, the decorator {kp.heuristic_names}")
        return self.modules[mod_name]

    def run_examples(self, modules: dict[str, dict[str, Any]]) -> dict[str, list[TracedCall]]:
        """Run every module's examples functions; returns the recorded launches per kernel entry name and sets
        each module's ``schemas``: the torch.library schema of each op (see ``schema``), with
        ``schema_notes`` saying where it came from or why there is none."""
        with as_target(self.target, self.per_target, self.model), bound_names(self.aliased), \
                recording_reads(self.files_read), recording_imports(self.imported):
            return self._run_examples(modules)

    def _run_examples(self, modules: dict[str, dict[str, Any]]) -> dict[str, list[TracedCall]]:
        import torch

        from .schema import has_var_parameters, meta_mismatch, passes_var_arguments, schema_and_buffer, schema_takes

        calls: dict[str, dict[str, list[Any]]] = {m: {op: [] for op in mod["ops"]} for m, mod in modules.items()}
        originals = {m: {op: getattr(self.modules[m], op) for op in mod["ops"]} for m, mod in modules.items()}
        depth = [0]  # ops calling ops: the outermost call is the op as the examples call it (Nones replaced)

        def recorder(mod_name: str, op: str, op_fn: Any) -> Any:
            # A @torch.library.custom_op's own function, as the wheel's op runs it: through torch's dispatcher
            # it would run outside this trace's torch-function mode (torchao's ``assert x.is_cuda`` failed)
            fn = getattr(op_fn, "_init_fn", op_fn) if hasattr(op_fn, "_opoverload") else op_fn

            def call(*args: Any, **kwargs: Any) -> Any:
                before = {n: len(h.records) for n, h in self.handles.items()}
                # (inference tensors keep no version counter: what the host code does to them is not seen)
                versions = [(t, t._version) for t in _tensor_arguments(args, kwargs) if not t.is_inference()]
                depth[0] += 1
                try:
                    if depth[0] == 1:
                        result, replaced = _with_nones_replaced(fn, args, kwargs)
                    else:
                        result, replaced = fn(*args, **kwargs), {}
                finally:
                    depth[0] -= 1
                # every call, another op's too (Cut Cross-Entropy's training path calls cce_lse_forward_kernel
                # with return_logit_avg=True, which returns a tuple): under torch.compile such a call reaches the
                # custom op too (routing), whose schema must take it; not one passing more than the schema can
                # take (**kwargs), which runs as Python there (exports.custom_call). written: what its launches
                # write through, and what an in-place torch op changed
                if depth[0] == 0 or not passes_var_arguments(fn, args, kwargs):
                    written = [*(t for n, h in self.handles.items() for r in h.records[before.get(n, 0):]
                                 for t in writes.get(id(r), ())), *(t for t, v in versions if t._version != v)]
                    calls[mod_name][op].append((args, kwargs, result, written, replaced))
                return result
            call.__forge_traced__ = op_fn  # type: ignore[attr-defined]  # (ongpu.recorded_through_globals)
            return call

        # every op where a host module holds it: its own module's, and the ops of other files one took by name
        # (FLA's chunk.py examples call chunk_gated_delta_rule_fwd_h, imported from chunk_delta_h.py; Cut
        # Cross-Entropy's cce.py calls cce_lse_forward_kernel), recorded as that file's; its own module's also serves
        # examples that import it inside the function (lmdeploy's) or call it as ``module.op``
        by_object = {id(fn): (m, op) for m, ops in originals.items() for op, fn in ops.items()}
        patched = [(holder, name, value) for holder in self.modules.values() for name, value in vars(holder).items()
                   if (found := by_object.get(id(value))) is not None and value is originals[found[0]][found[1]]]
        for holder, name, value in patched:
            setattr(holder, name, recorder(*by_object[id(value)], value))
        reads = self.output_reads
        writes: dict[int, list[Any]] = {}  # id(record) -> what it writes: once per launch, for both uses

        def on_record(name: str, record: TracedCall) -> None:
            writes[id(record)] = self._record_writes(name, record, modules)
            reads.launched(self.kernels[name].function, writes[id(record)])

        for handle in self.handles.values():
            handle.on_record = on_record
        try:
            for mod_name, mod in sorted(modules.items()):
                module = self.modules[mod_name]
                for fn_name in sorted(mod["examples"]):
                    try:
                        with tensors_on_gpu("cpu"), no_triton_launches(), cuda_registrations_serve_cpu(), \
                                watching_torch_calls(reads):
                            getattr(module, fn_name)("cpu")
                    except TritonLaunch as exc:
                        raise SourceError(f"{self.paths[mod_name]}: examples function {fn_name}('cpu') reached "
                                          f"{exc.reached(self.paths.values(), self._listed(), self.root)}") from None
                    except Exception as exc:
                        raise SourceError(f"{self.paths[mod_name]}: examples function {fn_name}('cpu') failed "
                                          f"(kernels are recorded, not run, on the CPU):\n{_trace(exc)}") from None
        finally:
            for holder, name, value in patched:
                setattr(holder, name, value)
            for handle in self.handles.values():
                handle.on_record = None
        for mod_name, mod in sorted(modules.items()):
            mod["schemas"], mod["schema_notes"] = {}, {}
            for op, fn in originals[mod_name].items():
                op_calls = calls[mod_name][op]
                mod["schemas"][op], mod["schema_notes"][op], rule, left_out = schema_and_buffer(fn, op_calls)
                why_not = meta_mismatch(fn, op_calls) if mod["schemas"][op] else None
                if why_not is not None:
                    mod["schemas"][op], mod["schema_notes"][op], rule = None, why_not, None
                if rule is not None:
                    mod.setdefault("results", {})[op] = rule
                if left_out and mod["schemas"][op]:
                    mod.setdefault("buffers", {})[op] = [list(b) for b in left_out]
                if mod["schemas"][op] and has_var_parameters(fn):
                    mod.setdefault("takes", {})[op] = schema_takes(mod["schemas"][op])
                owner = getattr(fn, "__self__", None)
                applied = getattr(fn, "__name__", "") == "apply" and isinstance(owner, type) \
                    and issubclass(owner, torch.autograd.Function)  # (applied-ai's fused_softmax = Fn.apply)
                # or a function whose results the examples differentiate (scattermoe's parallel_linear, NSA's
                # topk_sparse_attention: each returns Fn.apply(...))
                with_grad = any(t.requires_grad for c in op_calls for t in _tensor_arguments((c[2],), {}))
                if mod["schemas"][op] and op not in mod.get("autograd", {}) and (applied or with_grad):
                    what = f"{owner.__name__}.apply, an autograd.Function" if applied else \
                        "its examples differentiate its results"
                    mod["schema_notes"][op] += (f"; {what}: its custom op has no backward ([kernels.NAME.autograd] "
                                                "or [ops.NAME.autograd] gives one), so a compiled call needing "
                                                "gradients breaks the graph and runs eagerly")
        out: dict[str, list[TracedCall]] = {}
        for name, handle in self.handles.items():
            out[name] = handle.records
            handle.records = []
        return out

    def _function_writes(self, value: Any) -> frozenset[int | str] | None:
        """The argument slots a function-valued constexpr's value (its text, see ``function_constexpr``) writes."""
        known = self.functions.get(value) if isinstance(value, str) else None
        return None if known is None else function_writes(*known)

    def _record_writes(self, name: str, record: TracedCall, modules: dict[str, dict[str, Any]]) -> list[Any]:
        """The tensors one recorded launch of entry ``name`` may write: those passed where the kernel stores
        (``KernelSource.writes``), a host-side descriptor's tensor included."""
        kp = self.kernels.get(name)
        source = modules.get(kp.module, {}).get("source") if kp is not None else None
        if source is None or kp.function not in source.kernels:
            return []
        out = []
        # (the branches its flags take; what it hands a function-valued constexpr, where that writes it)
        for param in source.kernels[kp.function].writes_for(record.named or {}, self._function_writes):
            value = (record.named or {}).get(param)
            value = getattr(value, "base", value) if isinstance(value, rt.TensorDescriptor) else value
            if hasattr(value, "untyped_storage"):
                out.append(value)
        return out

    def trace_inputs(self, kp: KernelPlan, assignment: dict[str, Any], key: tuple[int, ...],
                     resolve: Callable[[list[TracedCall]], list[TracedCall]]) -> list[TracedCall]:
        """The launches of ``kp`` that its tuning op makes on the tuning inputs of one row (``tune.inputs``),
        traced on the meta device (no memory; the CPU where the host code needs values). ``resolve`` gives a
        launch whose type variable has only None tensors the variant the runtime takes for it
        (``plan.resolve_unset_dtypes``). Raises SourceError when the inputs do not launch the kernel in that
        variant with that key."""
        with as_target(self.target, False, self.model), bound_names(self.aliased):
            return self._trace_inputs(kp, assignment, key, resolve)

    def _trace_inputs(self, kp: KernelPlan, assignment: dict[str, Any], key: tuple[int, ...],
                      resolve: Callable[[list[TracedCall]], list[TracedCall]]) -> list[TracedCall]:
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
                with meta_random_factories() if device == "meta" else contextlib.nullcontext(), \
                        tensors_on_gpu(device), no_triton_launches():
                    args = call_inputs(getattr(module, t.inputs), key_dict, variant, device)  # type: ignore[arg-type]
                    call_op(getattr(module, op_name), args)
            except TritonLaunch as exc:
                raise SourceError(f"{where}: {t.inputs}({key_dict}, {variant}) then {op_name}() reached "
                                  f"{exc.reached(self.paths.values(), self._listed(), self.root)}") from None
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
        # A type variable whose tensors are all None has no dtype in the record: such a launch is the variant's
        # own only where the runtime would take this variant for it (the first built with its other values).
        mine = [c for c in resolve(records) if c.key == key and c.values == values]
        if not mine:
            seen = sorted({f"{dict(zip(kp.axes, c.values))} key {dict(zip(kp.key, c.key))}" for c in records})
            raise SourceError(f"{where}: {t.inputs}({key_dict}, {variant}) then {op_name}() does not launch "
                              f"{kp.function} in variant {assignment} with key {key_dict}; it launched "
                              f"{'; '.join(seen) or 'nothing'}")
        return mine


def _tensor_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The tensors a call passes, those in lists and tuples included."""
    import torch

    values = [v for a in (*args, *kwargs.values()) for v in (a if isinstance(a, (list, tuple)) else (a,))]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _with_nones_replaced(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                         ) -> tuple[Any, dict[str, Any]]:
    """``fn(*args, **kwargs)`` and, for each parameter bound to None, the value code gave it in place of None:
    the op's own (FlagGems' ``if dtype is None: dtype = x.dtype``) when it returned, else that of a function it
    called with a parameter of the same name that came in None (flash-linear-attention's op passes ``scale`` on
    to ``fused_recurrent_fwd``, which sets ``scale = K ** -0.5``). What the schema reads as the argument's type
    where every call leaves it None."""
    import inspect

    target = inspect.unwrap(fn)
    owner = applied_function(target)  # ``op = Cls.apply``: the op's own frame is its forward's
    code = getattr(inspect.unwrap(owner.forward) if owner is not None else target, "__code__", None)
    try:
        bound = host_signature(target).bind(*args, **kwargs)
        bound.apply_defaults()
        nones = {name for name, value in bound.arguments.items() if value is None}
    except (TypeError, ValueError):
        nones = set()
    if code is None or not nones:
        return fn(*args, **kwargs), {}
    own: dict[str, Any] = {}
    passed_on: dict[str, Any] = {}
    came_in_none: dict[int, set[str]] = {}
    previous = sys.getprofile()
    copies = {local: name for local, name in _parameter_copies(code).items() if name in nones}

    def on_event(frame: Any, event: str, arg: Any) -> None:
        f_code = frame.f_code
        if event == "call":
            params = f_code.co_varnames[:f_code.co_argcount + f_code.co_kwonlyargcount]
            names = {n for n in nones.intersection(params) if frame.f_locals.get(n, 0) is None}
            if names:
                came_in_none[id(frame)] = names
        elif event == "return":
            names = came_in_none.pop(id(frame), ())
            values = {n: frame.f_locals.get(n) for n in names}
            if f_code is code:  # the outermost frame of the op returns last
                own.update(values)
                for local, name in copies.items():  # vLLM: ``x_q = out_q`` / ``if x_q is None: x_q = ...``
                    if name in names and own.get(name) is None:
                        own[name] = frame.f_locals.get(local)
            else:
                for n, v in values.items():
                    if v is not None:
                        passed_on.setdefault(n, v)

    sys.setprofile(on_event)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    replaced = {n: v for n, v in passed_on.items() if own.get(n) is None}
    replaced.update({n: v for n, v in own.items() if v is not None})
    return result, replaced


@functools.cache
def _parameter_copies(code: Any) -> dict[str, str]:
    """Locals of a function's code that a top-level ``local = param`` copies a parameter into (vLLM's
    ``per_token_group_quant_fp8``: ``x_q = out_q``, then ``if x_q is None: x_q = torch.empty(...)``): local -> param.
    Read from the function's source once (the examples call an op many times); none where it is not at hand."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    except (OSError, TypeError, SyntaxError):
        return {}
    fn = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    params = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    return {} if fn is None else {
        stmt.targets[0].id: stmt.value.id for stmt in fn.body
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        and isinstance(stmt.value, ast.Name) and stmt.value.id in params and stmt.targets[0].id not in params}


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


@contextlib.contextmanager
def meta_random_factories() -> Iterator[None]:
    """Random, range and ``*_like`` factories, and plain arithmetic, that make meta tensors return empty ones
    instead: the shape, dtype, strides and ``requires_grad`` torch's own meta kernels give (arithmetic that autograd
    records is left to torch, which builds its graph).

    Their meta kernels are Python that calls ``torch._check``, which imports sympy (and Dynamo) on first use:
    0.25 s on the build machine and seconds on a busy GPU host, paid by every ``forge-aot tune`` whose tuning
    inputs call ``torch.randn(..., device=device)`` while it plans. Meta tensors hold no values, so nothing else
    differs. Only calls read exactly are answered here: plain contiguous strided tensors (the strides of size-1
    dimensions too), no ``out=``, generator, pinned memory or other layout, nothing torch would refuse; every other
    call goes to torch."""
    import torch
    from torch.overrides import TorchFunctionMode

    default_dtypes = {torch.randn: None, torch.rand: None, torch.randint: torch.int64}
    likes = {torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.randn_like,
             torch.rand_like, torch.randint_like}
    float_only = {torch.randn, torch.randn_like, torch.rand_like}
    same_layout = {None, torch.preserve_format, torch.contiguous_format}
    T = torch.Tensor
    # Element-wise arithmetic (``torch.randn(...) * 4`` in tuning inputs): torch.result_type's dtype, broadcast shape.
    arithmetic = {torch.add, torch.sub, torch.mul, T.add, T.sub, T.mul, T.__add__, T.__radd__, T.__sub__,
                  T.__rsub__, T.__mul__, T.__rmul__}
    division = {torch.div, T.div, T.__truediv__, T.__rtruediv__, T.div_, T.__itruediv__}
    reflected = {T.__rsub__, T.__rtruediv__}  # scalar - tensor, scalar / tensor
    unary = {torch.neg, torch.abs, T.neg, T.abs, T.__neg__, T.__abs__}
    negation = {torch.neg, T.neg, T.__neg__, T.neg_}
    subtraction = {torch.sub, T.sub, T.__sub__, T.__rsub__, T.sub_, T.__isub__}
    arithmetic_in_place = {T.add_, T.sub_, T.mul_, T.div_, T.__iadd__, T.__isub__, T.__imul__, T.__itruediv__,
                           T.neg_, T.abs_}
    random_in_place = {T.normal_, T.uniform_}

    def on_meta(device: Any) -> bool:
        return device is not None and torch.device(device).type == "meta"

    def plain(t: Any) -> bool:
        """A strided meta tensor whose strides are exactly the contiguous ones (size-1 dimensions included)."""
        if not (t.is_meta and t.layout == torch.strided):
            return False
        expect = 1
        for size, stride in zip(reversed(t.shape), reversed(t.stride())):
            if stride != expect:
                return False
            expect *= max(size, 1)
        return True

    def can_require_grad(dtype: Any, kwargs: dict[str, Any]) -> bool:
        return not kwargs.get("requires_grad") or dtype.is_floating_point or dtype.is_complex

    def shape_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if "size" in kwargs:
            return tuple(kwargs["size"])
        if func is torch.randint:  # randint(high, size) or randint(low, high, size)
            return tuple(args[-1])
        if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
            return tuple(args[0])
        return tuple(args)

    def randint_bounds_ok(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        bounds = [a for a in args if isinstance(a, int)] + [kwargs[k] for k in ("low", "high") if k in kwargs]
        low, high = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1]) if len(bounds) == 2 else (0, 0)
        return -(2 ** 63) <= low < high <= 2 ** 63

    def arange_length(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, bool] | None:
        bounds = [*args, *(kwargs[k] for k in ("start", "end", "step") if k in kwargs)]
        if not 1 <= len(bounds) <= 3 or not all(type(b) is int or (type(b) is float and math.isfinite(b))
                                                for b in bounds):
            return None
        start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds[:2], bounds[2] if len(bounds) == 3
                                                                          else 1)
        if step == 0 or (end - start) / step < 0:
            return None  # torch refuses these: its error, not a tensor
        return math.ceil((end - start) / step), all(type(b) is int for b in bounds)

    def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
        """NumPy broadcasting (``torch.broadcast_shapes`` imports sympy); None where the shapes do not broadcast."""
        out: list[int] = []
        for dims in itertools.zip_longest(*(reversed(s) for s in shapes), fillvalue=1):
            sizes = {d for d in dims if d != 1}
            if len(sizes) > 1:
                return None
            out.append(sizes.pop() if sizes else 1)
        return tuple(reversed(out))

    def elementwise(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) > 2 or set(kwargs) - {"alpha"} or (func in division and kwargs):
            return None
        if func in reflected and (len(args) != 2 or isinstance(args[1], torch.Tensor)):
            return None
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or not all(plain(t) for t in tensors) \
                or not all(type(a) in (bool, int, float) or isinstance(a, torch.Tensor) for a in args):
            return None
        shape = broadcast(*(tuple(t.shape) for t in tensors))
        if shape is None:
            return None
        if not any(tuple(t.shape) == shape for t in tensors):
            return None  # only broadcast operands: the output's strides are torch's rule
        dtype = torch.result_type(*args) if len(args) == 2 else args[0].dtype
        if dtype == torch.bool and (func in negation or func in subtraction):
            return None  # torch refuses negating or subtracting booleans: its error, not a tensor
        alpha = kwargs.get("alpha", 1)
        if type(alpha) not in (bool, int, float) or (
                type(alpha) is float and not (dtype.is_floating_point or dtype.is_complex)):
            return None  # torch refuses a float alpha for integers (and decides other kinds)
        if dtype.is_complex and (func in unary or func is T.abs_):
            return None  # abs of complex is real: torch's rule
        if func in division and not (dtype.is_floating_point or dtype.is_complex):
            dtype = torch.get_default_dtype()
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return None  # a result in autograd's graph (not a leaf): torch builds it
        if func in arithmetic_in_place:
            first = args[0]
            if not isinstance(first, torch.Tensor) or tuple(first.shape) != shape \
                    or not torch.can_cast(dtype, first.dtype):
                return None  # torch's refusal: torch decides
            return first
        return torch.empty(shape, dtype=dtype, device="meta")

    def random_in_place_ok(func: Any, first: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if not (plain(first) and first.dtype.is_floating_point) or (first.requires_grad and torch.is_grad_enabled()):
            return False
        if func is T.normal_:
            std = args[2] if len(args) > 2 else kwargs.get("std", 1.0)
            return type(std) in (int, float) and std >= 0
        low = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
        high = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
        return type(low) in (int, float) and type(high) in (int, float) and low <= high

    def empty_instead(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kwargs.get("pin_memory") or kwargs.get("layout") not in (None, torch.strided):
            return None
        if func in default_dtypes and on_meta(kwargs.get("device")):
            dtype = kwargs.get("dtype") or default_dtypes[func] or torch.get_default_dtype()
            if (func in float_only and not (dtype.is_floating_point or dtype.is_complex)) \
                    or not can_require_grad(dtype, kwargs) \
                    or (func is torch.randint and not randint_bounds_ok(args[:-1] if "size" not in kwargs else args,
                                                                      kwargs)):
                return None  # torch refuses it: its error, not a tensor
            return torch.empty(shape_of(func, args, kwargs), dtype=dtype, device="meta",
                               requires_grad=bool(kwargs.get("requires_grad")))
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (func in likes and first is not None and plain(first) and kwargs.get("memory_format") in same_layout
                and (on_meta(kwargs.get("device")) or kwargs.get("device") is None)):
            dtype = kwargs.get("dtype") or first.dtype
            if (func in float_only and not (dtype.is_floating_point or dtype.is_complex)) \
                    or not can_require_grad(dtype, kwargs):
                return None
            # A plain contiguous input gives a plain contiguous output under every memory format read here;
            # other strides are torch's rule to apply (its meta kernel decides).
            return torch.empty(first.shape, dtype=dtype, device="meta", requires_grad=bool(kwargs.get("requires_grad")))
        if func in random_in_place and first is not None:
            return first if random_in_place_ok(func, first, args, kwargs) else None
        if func in arithmetic or func in division or func in unary or func in arithmetic_in_place:
            return elementwise(func, args, kwargs)
        if func is torch.arange and on_meta(kwargs.get("device")):
            found = arange_length(args, kwargs)
            if found is None:
                return None
            length, ints = found
            dtype = kwargs.get("dtype") or (torch.int64 if ints else torch.get_default_dtype())
            if not ints and not dtype.is_floating_point:
                return None  # float bounds truncated to integers first: torch's rule
            if not can_require_grad(dtype, kwargs):
                return None
            return torch.empty(length, dtype=dtype, device="meta", requires_grad=bool(kwargs.get("requires_grad")))
        return None

    class MetaRandom(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            if kwargs.get("out") is None and kwargs.get("generator") is None:
                try:
                    made = empty_instead(func, args, kwargs)
                except (TypeError, ValueError, RuntimeError, IndexError, OverflowError):
                    made = None  # a call this reading does not understand: torch's own meta kernel decides
                if made is not None:
                    return made
            return func(*args, **kwargs)

    with MetaRandom():
        yield


class TritonLaunch(BaseException):
    """Host code the build runs launched a kernel through Triton itself (see ``no_triton_launches``). A
    BaseException, so host code's ``except Exception:`` fallback cannot hide it."""

    def __init__(self, site: str, kernel: str, kernel_file: str | None, kernel_line: int) -> None:
        super().__init__(f"{site}, which launches {kernel} through Triton itself: that module is not one the build "
                         "binds to its kernel handles (a kernel file, or an [ops.NAME] file with a function that "
                         "launches it); launch it from one of those, as the wheel runs only their host code")
        self.site, self.kernel, self.kernel_file, self.kernel_line = site, kernel, kernel_file, kernel_line

    def reached(self, host_files: Iterable[str], listed: Iterable[tuple[str, str]], root: str | None = None) -> str:
        """What the message after "reached" says: where a file the build binds launches a kernel with no entry
        (Liger's fused_linear_cross_entropy launching utils.py's element_mul_kernel), that the kernel needs one.
        ``listed``: the (file, function) of the manifest's kernels."""
        if self.site.rpartition(":")[0] not in set(host_files) or self.kernel_file is None \
                or (self.kernel_file, self.kernel) in set(listed):
            return str(self)
        file = os.path.relpath(self.kernel_file, root) if root else self.kernel_file
        return (f"{self.site}, which launches {self.kernel} ({file}:{self.kernel_line}), a kernel the manifest has no "
                f"entry for: add one ([kernels.NAME] source = \"{file}:{self.kernel}\")")


@contextlib.contextmanager
def no_triton_launches() -> Iterator[None]:
    """A launch through Triton itself while the build runs host code (``kernel[grid](...)``, ``.warmup``, ``.run``
    of a ``JITFunction``, an ``Autotuner``, ``Heuristics``) raises ``TritonLaunch`` naming the kernel and the line of
    host code: host code the build binds launches recording handles, so such a launch comes from a module it did
    not bind (attorch launches in its layer files, which import the kernel files), which the wheel would not launch
    either. Without this the launch ran Triton's autotuner on the build's stand-in driver and failed deep inside
    it. Nests (the build binds modules, whose import may trace); only the threads inside are refused."""
    try:
        from triton.runtime import autotuner
        from triton.runtime.autotuner import Autotuner, Heuristics
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: nothing to launch through
        yield
        return

    depth = getattr(_GUARD, "depth", 0)
    _GUARD.depth = depth + 1
    try:
        with patched_while_inside(JITFunction, "run", _refused_in_guarded_threads), \
                patched_while_inside(Autotuner, "run", _refused_in_guarded_threads), \
                patched_while_inside(Heuristics, "run", _refused_in_guarded_threads), \
                patched_while_inside(autotuner, "Heuristics", _heuristics_on_handles):
            yield
    finally:
        _GUARD.depth = depth


_GUARD = threading.local()
"""Per thread: ``depth``, how many ``no_triton_launches`` blocks it is inside (another thread launches as usual:
development mode plans in its caller's process)."""


def _refused_in_guarded_threads(run: Any) -> Any:
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(_GUARD, "depth", 0):
            return run(self, *args, **kwargs)
        frame = sys._getframe(1)
        while frame.f_back is not None and _library_frame(frame.f_code.co_filename):
            frame = frame.f_back  # Triton's own layers (an Autotuner's warmup calls its fn's), torch's wrap_triton
        fn = self
        while hasattr(fn, "fn"):  # an Autotuner over Heuristics over the JITFunction
            fn = fn.fn
        code = getattr(fn, "__code__", None)
        raise TritonLaunch(f"{frame.f_code.co_filename}:{frame.f_lineno}", str(getattr(fn, "__name__", fn)),
                           code and code.co_filename, code.co_firstlineno if code else 0)

    return guarded


def _heuristics_on_handles(heuristics: type) -> type:
    """Triton's ``Heuristics`` made over a recording handle (host code applying ``triton.heuristics`` a project
    helper module, imported with Triton, returned: Cut Cross-Entropy's ``K = cce_forward_autotune()(K)``): the
    values register on the handle, outermost, and the handle stands for the wrapper, as the wheel's
    ``triton.heuristics`` does (runtime/host_decorators.py). A subclass that ``triton.heuristics`` builds while it
    stands in the module (the decorator looks ``Heuristics`` up there): setting and deleting ``__new__`` on Triton's
    own class would leave it refusing its arguments ("object.__new__() takes exactly one argument") for the rest of
    the process, a CPython quirk of inherited ``__new__``."""

    class RecordingHeuristics(heuristics):  # type: ignore[misc, valid-type]
        def __new__(cls, fn: Any = None, *args: Any, **kwargs: Any) -> Any:  # (fn, arg_names, values)
            if isinstance(fn, TraceKernel) and getattr(_GUARD, "depth", 0):
                fn.add_heuristics(args[1] if len(args) > 1 else kwargs["values"], True)
                return fn
            return super().__new__(cls)

    RecordingHeuristics.__name__ = RecordingHeuristics.__qualname__ = heuristics.__name__
    return RecordingHeuristics


def _library_frame(filename: str) -> bool:
    """Whether a frame is Triton's or torch's own code (the installed packages' directories, not any path with a
    folder of that name: mlstm_kernels keeps its layers in ``mlstm_kernels/torch/``)."""
    return filename.startswith(_library_dirs())


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    import importlib.util

    out = []
    for name in ("triton", "torch"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            out.append(os.path.join(os.path.realpath(folder), ""))
            out.append(os.path.join(folder, ""))
    return tuple(out)


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
