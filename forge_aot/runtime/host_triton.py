"""The ``triton`` name inside packaged host code: the host-side helpers only."""

from __future__ import annotations

import types
from typing import Any


def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class _HostTriton(types.ModuleType):
    """Bound to ``triton`` in packaged host code, so ``triton.cdiv`` works and nothing imports Triton."""

    HOST_HELPERS = ("cdiv", "next_power_of_2")

    def __init__(self) -> None:
        super().__init__("triton", "host-side helpers of Triton, provided by the forge-aot runtime")
        self.cdiv = cdiv
        self.next_power_of_2 = next_power_of_2

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"packaged host code may use triton.cdiv and triton.next_power_of_2 only, "
                             f"not triton.{name}")


host_triton = _HostTriton()
