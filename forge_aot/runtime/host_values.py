"""The small ``triton`` of host code the lean and cold paths run (``SmallTriton``): ``cdiv`` and ``next_power_of_2``
here; ``triton.language``'s element types and module-level ``tl.constexpr(...)`` from ``host_language``,
``set_allocator`` from ``rules``, anything else from the full ``host_triton``, each loaded on first read. Imports:
``basics`` (``host_language``, ``rules``, ``host_triton`` where host code reads more of ``triton``)."""

from __future__ import annotations

import types
from typing import Any

from .basics import cdiv, next_power_of_2


class SmallTriton(types.ModuleType):
    """``triton`` in shipped code bound without the full ``host_triton``: ``cdiv`` and ``next_power_of_2`` here;
    ``triton.language`` and module-level ``tl.constexpr(...)`` (``_host_constexpr``) from ``host_language``,
    ``set_allocator`` from ``rules``, anything else ``host_triton``'s (``_other``), each read on first use (PEP 562:
    a missing attribute only) and kept. One per process (``small_triton``); ``host_triton``'s is a subclass."""

    def __init__(self) -> None:
        super().__init__("triton", "host-side helpers of Triton, provided by the forge-aot runtime")
        self.cdiv, self.next_power_of_2 = cdiv, next_power_of_2
        # A module's own ``__getattr__`` (PEP 562), read only where an attribute is missing: defined on the class, it
        # would put a Python hook in front of every read (``triton.cdiv`` in a grid function: 0.27 -> 0.10 us locally,
        # timing loop included).
        self.__getattr__ = self._missing

    def _missing(self, name: str) -> Any:
        if name == "language":  # module-level ``tl.float16`` (rare)
            from .host_language import host_language

            value: Any = host_language()
        elif name == "_host_constexpr":  # module-level ``NAME = tl.constexpr(...)`` (gsplat's, Liger's)
            from .host_language import host_constexpr as value
        elif name == "set_allocator":
            from .rules import set_allocator as value
        else:
            value = self._other(name)
        setattr(self, name, value)
        return value

    def _other(self, name: str) -> Any:
        from .host_triton import host_triton

        return getattr(host_triton, name)


_SMALL_TRITON: list[SmallTriton] = []


def small_triton() -> SmallTriton:
    """The process's ``SmallTriton``."""
    if not _SMALL_TRITON:
        _SMALL_TRITON.append(SmallTriton())
    return _SMALL_TRITON[0]
