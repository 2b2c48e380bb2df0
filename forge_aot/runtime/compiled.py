"""What ``kernel.warmup(...)`` returns, and what a launch's result reads (``fastpath.Launched``): Triton's
``CompiledKernel`` for a packaged binary.

Host code written like the Triton tutorial "Fused Softmax" compiles the kernel for a call with ``warmup`` to read
the binary's register count and shared memory (``n_regs``, ``metadata.shared``), sizes its grid from them and
launches the compiled kernel (``compiled[grid](*args)``). Loaded only where host code calls ``warmup`` or reads
what a launch returned (Unsloth's MoE GEMMs log ``kernel[grid](...)``'s ``n_regs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import ForgeRuntimeError
from .kernel import LAUNCHES

if TYPE_CHECKING:
    from .kernel import Kernel, _VariantState
    from .launch import BinaryBackend, _BinaryLauncher
    from .tables import Config


class KernelMetadata:
    """``CompiledKernel.metadata``: the fields of Triton's metadata that the package records for a binary."""

    FIELDS = ("name", "shared", "num_warps", "num_stages", "num_ctas", "warp_size", "target", "global_scratch_size",
              "profile_scratch_size")
    __slots__ = FIELDS

    def __init__(self, **values: Any) -> None:
        for name in self.FIELDS:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("metadata is read-only")

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"packaged kernels record metadata.{', metadata.'.join(self.FIELDS)}, not "
                             f"metadata.{name}")

    def __repr__(self) -> str:
        return "KernelMetadata(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS) + ")"


class CompiledBase:
    """What ``kernel.warmup(...)`` returns, as Triton's ``CompiledKernel``: ``n_regs``, ``n_spills``,
    ``n_max_threads``, ``metadata``, ``_init_handles()`` and ``handle[grid](*args)``. A launch through it goes
    through the kernel's own call with the warmup's constexprs and launch options, so it takes the binary that
    fits its own arguments (for the warmup's arguments, the binary measured)."""

    kernel: Kernel
    call: dict[str, Any]

    def _init_handles(self) -> None:
        """Loaded already (warmup loads the binary)."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def runner(*args: Any, stream: Any = None) -> None:
            if stream is not None:
                raise ForgeRuntimeError(f"{self.kernel.function}: packaged kernels launch on torch's current "
                                        "stream; use torch.cuda.stream(...) instead of stream=")
            self.kernel.run(grid, self._runtime_args(args), dict(self.call))
        return runner

    def _runtime_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The launch's arguments: every parameter in order, constexprs included (what Triton's JIT passes a
        compiled kernel), or the runtime parameters only."""
        k = self.kernel
        if len(args) == k.n_runtime:
            return args
        if len(args) == len(k.param_names):
            wanted = set(k.runtime_names)
            return tuple(a for a, n in zip(args, k.param_names) if n in wanted)
        raise TypeError(f"{k.function}: a compiled kernel takes its {k.n_runtime} runtime arguments or all "
                        f"{len(k.param_names)} parameters, got {len(args)}")

    def __repr__(self) -> str:
        return f"<forge-aot compiled kernel {self.kernel.function} {self.metadata!r}>"  # type: ignore[attr-defined]


class PlaceholderCompiled(CompiledBase):
    """A compiled kernel where no binary is chosen: the build's tracing on the CPU and a custom op's Meta
    implementation, which launch nothing. Its figures are placeholders (32 registers, 1 KB of shared memory):
    host code that derives a grid from them runs, and one that derives a constexpr from them gets the
    placeholder's choice at build time (a call the wheel then refuses as not built, never a wrong binary)."""

    n_regs = 32
    n_spills = 0
    n_max_threads = 1024

    def __init__(self, kernel: Kernel, call: dict[str, Any]) -> None:
        self.kernel = kernel
        self.call = call
        self.function = 0
        self.name = kernel.function
        warps = call.get("num_warps", 4)
        self.metadata = KernelMetadata(name=kernel.function, shared=1024, num_warps=warps,
                                       num_stages=call.get("num_stages", 3), num_ctas=1, warp_size=32, target=None,
                                       global_scratch_size=0, profile_scratch_size=0)


class CompiledKernel(CompiledBase):
    """``kernel.warmup(...)`` in a wheel: one loaded binary with Triton's CompiledKernel fields (see CompiledBase).
    ``n_regs``, ``n_spills`` and ``n_max_threads`` come from the driver, as Triton's loader reads them."""

    def __init__(self, kernel: Kernel, launcher: _BinaryLauncher, config: Config, call: dict[str, Any],
                 target_info: dict[str, Any]) -> None:
        from .host_driver import GPUTarget

        target = GPUTarget(target_info["backend"], target_info["arch"], target_info["warp_size"])
        self.kernel = kernel
        self.call = call
        self.launcher = launcher
        self.function = launcher.function
        self.name = launcher.symbol
        self.metadata = KernelMetadata(name=launcher.symbol, shared=launcher.shared,
                                       num_warps=launcher.block // target.warp_size, num_stages=config.num_stages,
                                       num_ctas=1, warp_size=target.warp_size, target=target,
                                       global_scratch_size=launcher.global_scratch,
                                       profile_scratch_size=launcher.profile_scratch)

        self._attributes: tuple[int, int, int] | None = None

    def _function_attributes(self) -> tuple[int, int, int]:
        """(registers per thread, spilled registers per thread, most threads per block), read once."""
        if self._attributes is None:
            launcher = self.launcher
            if launcher.cuda:
                launcher.drv.push(launcher.ctx)  # the function's own context, whatever this thread's is
            try:
                self._attributes = launcher.drv.function_attributes(launcher.function)
            finally:
                if launcher.cuda:
                    launcher.drv.pop()
        return self._attributes

    @property
    def n_regs(self) -> int:
        return self._function_attributes()[0]

    @property
    def n_spills(self) -> int:
        return self._function_attributes()[1]

    @property
    def n_max_threads(self) -> int:
        return self._function_attributes()[2]


def warmup(kernel: Kernel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CompiledBase:
    """``kernel.warmup(*args, **kwargs)``: binds and chooses exactly as a launch does (variant, table row, config,
    heuristics, specialization) and returns the chosen binary, loaded. In a custom op's Meta implementation
    (``LAUNCHES.skip``: fake tensors, no addresses) it is the binary of the generic specialization on the tensors'
    device, so host code that caches what it derives from the figures caches real ones; off the GPU (meta
    tensors, the build's tracing) a placeholder."""
    runtime, call = kernel._bind(args, kwargs)
    generic = LAUNCHES.skip is True
    if generic:
        try:
            on_gpu = getattr(kernel.backend, "compiled", None) is not None and kernel._device(runtime) >= 0
        except (TypeError, ForgeRuntimeError):  # meta or CPU tensors
            on_gpu = False
        if not on_gpu:
            return PlaceholderCompiled(kernel, call)
    state = kernel._state(runtime, call)
    config = state.table.lookup(tuple(runtime[src] if is_rt else call[src] for is_rt, src in kernel.key_sources))
    heur = kernel.heuristic_values(runtime, call, config)[0] if kernel.heuristics else ()
    return kernel.backend.compiled(kernel, state, config, heur, runtime, call, generic)


def packaged(backend: BinaryBackend, kernel: Kernel, state: _VariantState, config: Config, heur: tuple[Any, ...],
             runtime: Sequence[Any], call: dict[str, Any], generic: bool) -> CompiledKernel:
    """The packaged backend's ``compiled``: the binary a launch with these arguments takes, loaded; ``generic``: the
    one that assumes nothing of the arguments (they have no addresses)."""
    from .tables import SPEC_NONE, argument_spec, pointer_value

    if generic:
        spec = SPEC_NONE * len(kernel.spec_slots)
    else:
        spec = argument_spec(kernel.spec_slots, [pointer_value(v) if i in kernel.ptr_pos else v
                                                 for i, v in enumerate(runtime)])
    launcher = backend.launcher_for(kernel, state, config, heur, spec, runtime)
    return CompiledKernel(kernel, launcher, config, call, kernel.targets[state.target])
