"""Development mode: the same host ops, run from the source tree through Triton's JIT.

The host code is taken from the kernel files exactly as the wheel packages it, the kernel names are bound to
handles with the wheel's selection rules (dtype build, table lookup, constraints), and the launch goes to
``jit_fn[grid](..., **config)`` so Triton compiles on demand. Needs triton and a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import runtime as rt
from .index import build_index
from .introspect import as_host_call, base_jit_function, host_dtype, load_kernel_module
from .manifest import load_manifest
from .pipeline import triton_version
from .plan import make_plan
from .runtime.host_triton import SCRATCH_ALLOCATOR
from .tune.apply import apply_tuning, load_database


class JitBackend:
    """Resolves tables like the packaged runtime; launches through Triton's JIT."""

    def __init__(self, functions: dict[str, Any]) -> None:
        self.functions = functions

    def resolve(self, kernel: rt.Kernel, variant: dict[str, Any], assignment: dict[str, Any],
                device: int) -> tuple[str, rt.ConfigTable]:
        import torch

        props = torch.cuda.get_device_properties(device)
        hip = bool(getattr(torch.version, "hip", None))
        info = {"name": props.name, "capability": (props.major, props.minor),
                "arch": str(getattr(props, "gcnArchName", "")).split(":")[0] if hip
                else f"sm_{props.major}{props.minor}",
                # The JIT compiles on demand: every config is usable.
                "max_shared": 1 << 30}
        return rt.resolve_table(kernel, variant, assignment, "hip" if hip else "cuda", info)

    def _arguments(self, kernel: rt.Kernel, config: rt.Config, runtime: Sequence[Any], call: dict[str, Any],
                   heur: tuple[Any, ...]) -> dict[str, Any]:
        kwargs = dict(zip(kernel.runtime_names, runtime))
        for name, d in kwargs.items():  # the runtime's host-side tensor descriptors: Triton's JIT takes its own
            if isinstance(d, rt.TensorDescriptor):
                from triton.tools.tensor_descriptor import TensorDescriptor

                kwargs[name] = TensorDescriptor(d.base, d.shape, d.strides, list(d.block_shape), d.padding)
        # (a Triton element type host code passed, ``tl.bfloat16``, is the runtime's stand-in: Triton takes its own)
        constexprs = {k: host_dtype(v) for k, v in call.items()
                      if k not in rt.LAUNCH_OPTIONS or k in kernel.param_names}
        options = {"maxnreg": config.maxnreg} if config.maxnreg else {}
        options.update({k: call[k] for k in rt.COMPILE_OPTIONS if k in call})  # enable_fp_fusion=False
        if SCRATCH_ALLOCATOR[0] is not None:
            # host code's triton.set_allocator reached the runtime's shim; Triton's JIT needs it too (it keeps
            # it per thread, so set it on every launch)
            import triton

            triton.set_allocator(SCRATCH_ALLOCATOR[0])
        # num_warps / num_stages are the config's (a constexpr parameter of that name, set at the call, is both)
        meta = {k: host_dtype(v) for k, v in config.meta.items()}
        heuristics = {k: host_dtype(v) for k, v in zip(kernel.heuristic_names, heur)}
        # a launch option the kernel's heuristics compute wins over the config's, as in Triton
        launch = {"num_warps": config.num_warps, "num_stages": config.num_stages, **options}
        launch.update({k: heuristics.pop(k) for k in kernel.spec.get("launch_heuristics", []) if k in heuristics})
        return {**kwargs, **meta, **constexprs, **heuristics, **launch}

    def launch(self, kernel: rt.Kernel, state: Any, config: rt.Config, grid: Sequence[int],
               runtime: Sequence[Any], call: dict[str, Any], heur: tuple[Any, ...]) -> Any:
        kernel._last_config = config  # (kernel.best_config, as the wheel's)
        return self.functions[kernel.name][tuple(grid)](**self._arguments(kernel, config, runtime, call, heur))

    def compiled(self, kernel: rt.Kernel, state: Any, config: rt.Config, heur: tuple[Any, ...],
                 runtime: Sequence[Any], call: dict[str, Any], generic: bool = False) -> Any:
        """``kernel.warmup(...)``: Triton's own compiled kernel for the call, its figures read from it (fake tensors,
        which Triton cannot specialize on: a placeholder)."""
        if generic:
            return rt.PlaceholderCompiled(kernel, call)
        compiled = self.functions[kernel.name].warmup(**self._arguments(kernel, config, runtime, call, heur),
                                                          grid=(1,))
        compiled._init_handles()
        return _JitCompiled(kernel, call, compiled)


class _JitCompiled(rt.CompiledBase):
    """``kernel.warmup(...)`` in development mode: Triton's CompiledKernel's figures; launches go through the
    kernel's call, as in the wheel."""

    def __init__(self, kernel: rt.Kernel, call: dict[str, Any], compiled: Any) -> None:
        self.kernel = kernel
        self.call = call
        self.compiled = compiled
        self.metadata = compiled.metadata
        self.n_regs, self.n_spills, self.n_max_threads = compiled.n_regs, compiled.n_spills, compiled.n_max_threads
        self.function = compiled.function


class _DevKernel(rt.Kernel):
    """A kernel handle of development mode. The project's helper modules run with Triton itself here, so a call may
    pass one of ``triton.language``'s element types; the index, as the wheel's host code, has the runtime's."""

    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return super().run(grid, *as_host_call(args, kwargs))

    def warmup(self, *args: Any, grid: Any = None, **kwargs: Any) -> Any:
        args, kwargs = as_host_call(args, kwargs)
        return super().warmup(*args, grid=grid, **kwargs)


def load_dev_ops(manifest_path: str | Path, targets: list[str] | None = None) -> dict[str, Callable[..., Any]]:
    """The manifest's ops (and ``[exports]``) bound to Triton JIT kernels (for development and for benchmarks
    against JIT)."""
    loaded = load_manifest(manifest_path)
    plan = make_plan(loaded, targets)
    apply_tuning(plan, load_database(loaded), triton_version())
    index = build_index(plan, None, "jit", {m: str(spec["path"]) for m, spec in plan.modules.items()})
    # The bare JIT functions: the wheel's rules pick config, heuristics and call-site values.
    functions = {name: base_jit_function(getattr(load_kernel_module(str(kp.source)), kp.function))
                 for name, kp in plan.kernels.items()}
    sources = {m: (spec["path"], spec["host_source"]) for m, spec in plan.modules.items()}
    return rt.bind_ops(f"_forge_dev_{loaded.manifest.project.name}", index, JitBackend(functions), sources,
                       _DevKernel)
