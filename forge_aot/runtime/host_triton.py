"""The ``triton`` name inside packaged host code: the host-side helpers only."""

from __future__ import annotations

import types
from typing import Any


def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


SCRATCH_ALLOCATOR: list[Any] = [None]
"""The allocator host code gave ``triton.set_allocator`` (one per process, as in Triton), or None: the runtime
then allocates kernels' global scratch (tensor descriptors built in the kernel) through torch itself."""


def set_allocator(allocator: Any) -> None:
    """``triton.set_allocator``: ``allocator(size, alignment, stream)`` returns a buffer (an object with
    ``data_ptr()``) for a launch's global scratch, as under Triton's JIT."""
    SCRATCH_ALLOCATOR[0] = allocator


class _HostTriton(types.ModuleType):
    """Bound to ``triton`` in packaged host code, so ``triton.cdiv`` works and nothing imports Triton."""

    HOST_HELPERS = ("cdiv", "next_power_of_2", "set_allocator")

    def __init__(self) -> None:
        super().__init__("triton", "host-side helpers of Triton, provided by the forge-aot runtime")
        self.cdiv = cdiv
        self.next_power_of_2 = next_power_of_2
        self.set_allocator = set_allocator

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"packaged host code may use {', '.join('triton.' + h for h in self.HOST_HELPERS)} "
                             f"only, not triton.{name}")


host_triton = _HostTriton()
