"""``triton.heuristics``, ``triton.Config`` and ``triton.autotune`` in host code (loaded where first read).

Libraries apply a kernel's decorators in host code as well as on its def: Cut Cross-Entropy's
``K = cce_forward_autotune()(K)``, in a helper module, returns ``triton.heuristics`` built from a ``triton.Config``'s
``all_kwargs()``. Applied to a kernel handle, the heuristics register on it, before those registered so far: a
decorator applied after the def wraps every decorator above it, and Triton runs the outermost first. The build reads
the same decorators from the kernel Triton itself builds and checks that the host code registers them in that order.
A ``triton.autotune`` host code applies was tuned by the build, or refused: calling it here raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class HostConfig:
    """``triton.Config`` as host code builds one: its fields and ``all_kwargs()``, as Triton 3.6 has them (the
    package's binaries were compiled from the build's configs; one made here selects nothing)."""

    def __init__(self, kwargs: dict[str, Any], num_warps: int = 4, num_stages: int = 3, num_ctas: int = 1,
                 maxnreg: int | None = None, pre_hook: Callable[..., Any] | None = None,
                 ir_override: str | None = None) -> None:
        self.kwargs = kwargs
        self.num_warps, self.num_stages, self.num_ctas = num_warps, num_stages, num_ctas
        self.maxnreg, self.pre_hook, self.ir_override = maxnreg, pre_hook, ir_override

    def all_kwargs(self) -> dict[str, Any]:
        extra = (("num_warps", self.num_warps), ("num_ctas", self.num_ctas), ("num_stages", self.num_stages),
                 ("maxnreg", self.maxnreg), ("ir_override", self.ir_override))
        return {**self.kwargs, **{k: v for k, v in extra if v is not None}}

    def __repr__(self) -> str:
        return f"Config({self.all_kwargs()})"


def heuristics(values: dict[str, Callable[[dict[str, Any]], Any]]) -> Callable[[Any], Any]:
    """``triton.heuristics(values)``: a decorator that registers ``values`` on the kernel handle it is applied to,
    outermost, and gives the handle back."""

    def decorator(kernel: Any) -> Any:
        from .host_triton import KernelSide

        add = getattr(kernel, "add_heuristics", None)
        if add is not None:
            add(values, True)
        elif not isinstance(kernel, KernelSide):  # a kernel the package has no binary of: launching it raises
            from .errors import ForgeRuntimeError

            raise ForgeRuntimeError(f"triton.heuristics applied to {kernel!r}: packaged host code may apply it to "
                                    "the package's kernels only")
        return kernel

    return decorator


def autotune(*args: Any, **kwargs: Any) -> Any:
    """``triton.autotune(...)`` called by packaged host code: the build tuned the decorators the kernel had when
    it imported the project, and this call was not among them (a helper that returns an autotuner where an
    environment variable asks for one, such as Cut Cross-Entropy's ``CCE_AUTOTUNE``, set now but not at build)."""
    from .errors import ForgeRuntimeError

    raise ForgeRuntimeError("packaged host code called triton.autotune: the package's kernels were tuned when it "
                            "was built, with the decorators they had then (unset the variable that asks for it, "
                            "or rebuild the package with it set where the build supports it)")
