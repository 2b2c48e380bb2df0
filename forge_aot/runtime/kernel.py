"""Kernel handles: what host code calls as ``kernel[grid](*args, **kwargs)``."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

from . import fastpath, tables
from .errors import ForgeRuntimeError, NotBuiltError, UnsupportedDeviceError, UnsupportedDtypeError, listing
from .fastpath import LAUNCHES, _LaunchState  # noqa: F401  (read from here by the modules that set it)
from .packing import check_dtypes, dtype_name
from .rules import named_args, read_params, run_heuristics
from .tables import LAUNCH_DEFAULTS, LAUNCH_FLAGS, LAUNCH_OPTIONS, TRITON_DEFAULTS, Config, ConfigTable

_NO_CONSTEXPRS: dict[str, Any] = {}


class _Launch:
    __slots__ = ("grid", "kernel")

    def __init__(self, kernel: Kernel, grid: Any) -> None:
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel.run(self.grid, args, kwargs)


class _PyKernelBase:
    """``kernel[grid]`` in Python (the C extension's ``KernelBase`` does the same in C when it is present)."""

    __slots__ = ()
    _fast: Any = None

    def __getitem__(self, grid: Any) -> _Launch:
        return _Launch(self, grid)


KernelBase: Any = fastpath.c.KernelBase if fastpath.c is not None else _PyKernelBase


class _VariantState:
    """Everything one (variant, device) needs at launch time, resolved once."""

    __slots__ = ("assignment", "device", "launchers", "lock", "table", "target", "variant")

    def __init__(self, variant: str, assignment: dict[str, Any], device: int, target: str,
                 table: ConfigTable) -> None:
        self.variant, self.assignment, self.device, self.target, self.table = variant, assignment, device, target, table
        self.launchers: dict[tuple[Any, ...], Any] = {}
        """(config id, heuristic values, specialization, descriptors' block shapes) → launcher of its binary."""
        self.lock = threading.Lock()


class Kernel(KernelBase):
    """One packaged kernel, called from host code exactly like a Triton JIT function: ``kernel[grid](*args,
    **kwargs)`` binds the arguments like Triton does (call-site constexprs and launch options such as ``num_warps``
    included), picks the build variant from the dtypes and the call-site values, the config from the table,
    evaluates the kernel's ``@triton.heuristics`` on the host, picks the binary from each argument's
    specialization (pointer alignment, integers divisible by 16 or equal to 1, as Triton's JIT) and launches on
    torch's current stream."""

    _c_launch = True
    """Whether launches may go through the C launcher (fastpath.use_c_launch turns it off per handle)."""
    best_config = property(fastpath.best_config)

    def __init__(self, name: str, spec: dict[str, Any], targets: dict[str, dict[str, Any]],
                 backend: Any, pre_hooks: dict[str, Any] | None = None) -> None:
        self.name = name
        self.function = spec["function"]
        self.spec = spec
        self.targets = targets
        self.backend = backend
        read_params(self, spec)
        self.constraints = tables.Constraints(spec.get("constraints", []))
        self.variants = spec["variants"]
        self.heuristics: list[tuple[str, Callable[[dict[str, Any]], Any]]] = []
        """(name, function) in Triton's order of evaluation, registered by the host module's decorators."""
        self.pre_hooks: dict[str, Callable[[dict[str, Any]], Any]] = dict(pre_hooks or {})
        """Config pre-hooks by name, bound from the host module (``triton.Config(pre_hook=...)``)."""
        # The common call: runtime parameters first, passed positionally, nothing chosen at the call site.
        self._plain = self._runtime_first and not self.call_names
        positions = [src for is_rt, src in self.key_sources if is_rt]
        self._runtime_key: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None
        if len(positions) == len(self.key_sources):  # itemgetter of one position gives a value, not a tuple
            self._runtime_key = (operator.itemgetter(*positions) if len(positions) > 1 else
                                 (lambda runtime, i=positions[0]: (runtime[i],)) if positions else (lambda runtime: ()))
        self._states: dict[tuple[Any, ...], _VariantState] = {}
        self._lock = threading.Lock()
        register = getattr(backend, "register", None)
        if register is not None:
            register(self)

    def __repr__(self) -> str:
        return f"<forge-aot kernel {self.name} ({self.function}), builds: {list(self.variants)}>"

    def add_heuristics(self, values: dict[str, Callable[[dict[str, Any]], Any]], outermost: bool = False) -> None:
        """Register one ``@triton.heuristics`` decorator's values: after those before (decorators register outer
        first), or, ``outermost`` (applied by rebinding the kernel, after them), before them."""
        for name in values:  # all checked before any is added: a failed call changes nothing
            if name not in self.heuristic_names:
                raise ForgeRuntimeError(f"{self.function}: heuristic '{name}' is not a constexpr parameter the "
                                        f"package knows as heuristic ({self.heuristic_names})")
        self.heuristics = [*values.items(), *self.heuristics] if outermost else [*self.heuristics, *values.items()]
        if self._fast is not None:
            fastpath.use_c_launch(self, True)  # the C path calls the heuristics too: re-read with them

    # -- binding ------------------------------------------------------------------------------------------
    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Sequence[Any], dict[str, Any]]:
        if self._runtime_first and len(args) == self.n_runtime and all(k not in self.runtime_names
                                                                          for k in kwargs):
            runtime: Sequence[Any] = args
            given = dict(kwargs)
        else:
            if len(args) > len(self.param_names):
                raise TypeError(f"{self.function}() takes {len(self.param_names)} arguments, got {len(args)}")
            given = dict(zip(self.param_names, args))
            for k, v in kwargs.items():
                if k in given:
                    raise TypeError(f"{self.function}() got multiple values for argument '{k}'")
                given[k] = v
            missing = [n for n in self.runtime_names if n not in given]
            if missing:
                raise TypeError(f"{self.function}() is missing arguments {missing}")
            runtime = [given.pop(n) for n in self.runtime_names]
        call: dict[str, Any] = {}
        for k, v in given.items():
            if k in self.call_names:
                call[k] = v
            elif k in self.meta_names:
                raise TypeError(f"{self.function}(): {k} is tuned by forge-aot and comes from the config table; "
                                "do not pass it (or declare it a call-site constexpr in the manifest)")
            elif k in self.heuristic_names:
                call[k] = v  # as with Triton, the heuristics see it and compute the value (theirs wins)
            elif k in LAUNCH_OPTIONS:
                if v != LAUNCH_DEFAULTS.get(k, object()):
                    raise NotBuiltError(f"{self.function}(): the call passes {k}={v!r}, but {k} was not built as a "
                                        "call-site option; list it under constexprs or derive in the manifest")
            elif k in LAUNCH_FLAGS:
                call[k] = v  # how the binary is launched (tables.launch_attrs), never which binary
            elif k not in self.param_names:
                raise TypeError(f"{self.function}() got an unexpected keyword argument '{k}'")
        for n in self.call_constexprs:
            if n not in call:
                if n in self.constexpr_defaults:
                    call[n] = self.constexpr_defaults[n]
                else:
                    raise TypeError(f"{self.function}() is missing the constexpr argument '{n}'")
        for n in self.launch_axes:
            if n not in call:
                call[n] = LAUNCH_DEFAULTS.get(n, TRITON_DEFAULTS.get(n))
        for n in self.launch_flags:
            call.setdefault(n, False)
        return runtime, call

    # -- resolution ---------------------------------------------------------------------------------------
    def _device(self, runtime: Sequence[Any]) -> int:
        device = -2
        for i in self.device_pos:
            arg = runtime[i]
            if arg is None or (type(arg) is int and i in self.pointer_ints):  # None: compiled in as the constant
                continue
            try:
                d = arg.get_device()
            except AttributeError:
                raise TypeError(f"{self.function}(): argument '{self.runtime_names[i]}' must be a tensor, got "
                                f"{type(arg).__name__}") from None
            if d < 0:
                raise UnsupportedDeviceError(
                    f"{self.function}(): argument '{self.runtime_names[i]}' is a {str(arg.device.type).upper()} "
                    "tensor; packaged kernels run on the GPU (move it with .cuda())")
            if device == -2:
                device = d
            elif d != device:
                raise UnsupportedDeviceError(f"{self.function}(): tensors on cuda:{device} and cuda:{d}")
        return device

    def axis_values(self, runtime: Sequence[Any], call: dict[str, Any]) -> tuple[Any, ...]:
        """The call's value of every variant axis, in canonical order (dtype names for type variables)."""
        try:
            return tuple(dtype_name(runtime[src].dtype) if is_rt else call[src] for is_rt, src in self.axis_sources)
        except AttributeError:  # a type variable's first tensor passed as None: another of its tensors tells
            return tuple(self._dtype_of(runtime, src) if is_rt else call[src] for is_rt, src in self.axis_sources)

    def _dtype_of(self, runtime: Sequence[Any], src: int) -> str | None:  # None: all None (see find_variant)
        ty = self.runtime[src][1]
        return next((dtype_name(a.dtype) for a, (_, t) in zip(runtime, self.runtime)
                     if t == ty and a is not None and type(a) is not int), None)

    def _state(self, runtime: Sequence[Any], call: dict[str, Any]) -> _VariantState:
        device = self._device(runtime)  # key: every tensor's dtype (which gives the type variables), call values
        state_key = (device, tuple(None if (a := runtime[i]) is None or type(a) is int else a.dtype
                                   for i in self.device_pos),
                     *[call[src] for is_rt, src in self.axis_sources if not is_rt])
        state = self._states.get(state_key)
        if state is None:
            state = self._make_state(self.axis_values(runtime, call), device, state_key)
        return state

    def find_variant(self, values: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
        """The built variant for the axis values of a call, or a clear error naming what was built."""
        if not self.variants:
            raise UnsupportedDeviceError(
                f"{self.function}(): this package has no binaries of this kernel: it was built for "
                f"{', '.join(self.targets) or 'no target'} and kernels.{self.name}.targets lists "
                f"{', '.join(self.spec.get('only_targets', [])) or 'none of them'}")
        assignment: dict[str, Any] = {}
        type_vars = dict(self.type_vars)
        if None in values and len(fixed := {a: v for a, v in zip(self.axes, values)
                                            if v is not None or a not in type_vars}) < len(values):
            # type variables whose tensors are all None change no code (mamba's norm without a residual): the first
            # built variant (sorted) with the call's other values, as the build traced such calls
            for vid in sorted(v for v, b in self.variants.items() if all(b["assign"][a] == fixed[a] for a in fixed)):
                return vid, dict(self.variants[vid]["assign"])
            unset = ", ".join(a for a in type_vars if a not in fixed)
            raise NotBuiltError(f"{self.function}(): no build for {fixed} with {unset} of any dtype (their tensors "
                                f"are all None); built: {list(self.variants)}")
        for axis, value in zip(self.axes, values):
            built = [v["assign"][axis] for v in self.variants.values()]
            if axis in type_vars:
                if value not in built:
                    raise UnsupportedDtypeError(f"{self.function}(): no build for {axis}={value}; this package "
                                                f"has {', '.join(sorted(set(built)))}")
            elif value not in built:
                kind = "launch option" if axis in LAUNCH_OPTIONS else "constexpr"
                raise NotBuiltError(f"{self.function}(): {kind} {axis}={value!r} was not built; built values: "
                                    f"{listing(built)}")
            else:
                value = next(b for b in built if b == value)
            assignment[axis] = value
        vid = tables.variant_id(assignment, self.axes)
        if vid not in self.variants:  # each dtype built with these values, never together: a dtype error
            fixed = [a for a in self.axes if a not in dict(self.type_vars)]
            same = [v["assign"] for v in self.variants.values() if all(v["assign"][a] == assignment[a] for a in fixed)]
            apart = bool(self.type_vars) and all(any(b[tv] == assignment[tv] for b in same) for tv, _ in self.type_vars)
            raise (UnsupportedDtypeError if apart else NotBuiltError)(
                f"{self.function}(): the combination {vid} was not built; built: {list(self.variants)}")
        return vid, assignment

    def _make_state(self, values: tuple[Any, ...], device: int, state_key: tuple[Any, ...]) -> _VariantState:
        vid, assignment = self.find_variant(values)
        check_dtypes(self.function, [self.runtime[i] for i in self.device_pos], state_key[1], assignment)
        target, table = self.backend.resolve(self, self.variants[vid], assignment, device)
        state = _VariantState(vid, assignment, device, target, table)
        with self._lock:
            self._states.setdefault(state_key, state)
        return self._states[state_key]

    def named_args(self, runtime: Sequence[Any], call: dict[str, Any], config: Config) -> dict[str, Any]:
        """What Triton's heuristics, pre-hooks and grid functions see: every argument by name, the call-site
        values and the config's keyword arguments."""
        return named_args(self.runtime_names, runtime, call, config)

    def heuristic_values(self, runtime: Sequence[Any], call: dict[str, Any],
                         config: Config) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The ``@triton.heuristics`` values of a call (in ``heuristic_names`` order) and the arguments by name
        they were computed over, theirs included (what pre-hooks and grid functions see)."""
        nargs = self.named_args(runtime, call, config)
        return run_heuristics(self.heuristics, self.heuristic_names, nargs), nargs

    def warmup(self, *args: Any, grid: Any = None, **kwargs: Any) -> Any:
        """``kernel.warmup(*args, grid=..., **kwargs)``: the binary the call would take, loaded (compiled.warmup)."""
        from .compiled import warmup

        return warmup(self, args, kwargs)

    # -- the call -----------------------------------------------------------------------------------------
    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kwargs or not self._plain or len(args) != self.n_runtime:
            runtime, call = self._bind(args, kwargs)
        else:
            runtime, call = args, _NO_CONSTEXPRS
        guard = LAUNCHES.skip
        if guard is True:
            return fastpath.not_launched(self, call)
        if guard:  # a custom op's real implementation runs (guard.py): checked before a pre-hook may write
            guard.check(self, runtime, call)
        state = self._state(runtime, call)
        key = self._runtime_key(runtime) if self._runtime_key is not None else \
            tuple(runtime[src] if is_rt else call[src] for is_rt, src in self.key_sources)
        config = state.table.lookup(key)
        heur: tuple[Any, ...] = ()
        if self.heuristics or config.pre_hook or (self.grid_args and callable(grid)):
            heur, nargs = self.heuristic_values(runtime, call, config)
            if config.pre_hook:
                self.pre_hooks[config.pre_hook](nargs)
            if callable(grid) and self.grid_args:  # Triton launches the arguments the grid function leaves there
                grid, runtime = grid(nargs), [nargs[n] for n in self.runtime_names]
            elif callable(grid):
                try:
                    grid = grid({**config.launch_meta, **dict(zip(self.heuristic_names, heur))})
                except KeyError:
                    grid = grid(nargs)
        elif callable(grid):
            try:
                grid = grid(config.launch_meta)
            except KeyError:  # the grid function reads an argument by name, as Triton allows
                grid = grid(self.named_args(runtime, call, config))
        return self.backend.launch(self, state, config, grid, runtime, call, heur)
