"""``triton.language`` in packaged host code, made where host code first reads it (``host_values.SmallTriton`` and
``host_triton`` load this module then): its element types (``HostDtype``, bound as ``tl.float16``...) and
module-level ``tl.constexpr(...)`` values (``host_constexpr``, which sourcesplit writes as
``triton._host_constexpr(...)``). A plain kernel's first call never loads it. Imports: stdlib."""

from __future__ import annotations

import types
from typing import Any

HOST_DTYPES = {"int1": "int1", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
               "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "float16": "fp16",
               "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "float8e5": "fp8e5",
               "float8e5b16": "fp8e5b16", "float8e4nv": "fp8e4nv", "float8e4b8": "fp8e4b8", "float8e4b15": "fp8e4b15"}
"""``triton.language``'s element types (attribute name -> Triton's short name) that host code may pass to kernels."""


class HostDtype(str):
    """A Triton element type in packaged host code (``tl.bfloat16``), which host code passes to a kernel as a
    constexpr (vLLM's ``compute_type``). It is the text ``tl.<name>``: the spelling the index, variant ids and
    manifests use, so a build reads back as the same value; the compile step hands Triton its real type."""

    __slots__ = ()

    @property
    def name(self) -> str:
        """Triton's short name (``bf16``), as ``tl.bfloat16.name``."""
        return HOST_DTYPES[self[3:]]

    @property
    def primitive_bitwidth(self) -> int:
        digits = self[3:].lstrip("abflotuin")  # float8e4nv -> 8e4nv, bfloat16 -> 16, uint32 -> 32
        return int(digits.partition("e")[0])

    def is_floating(self) -> bool:
        return self.name.startswith(("fp", "bf"))

    def is_int(self) -> bool:
        return not self.is_floating()

    def is_fp8(self) -> bool:
        return self.name.startswith("fp8")

    def is_fp16(self) -> bool:
        return self.name == "fp16"

    def is_bf16(self) -> bool:
        return self.name == "bf16"

    def is_fp32(self) -> bool:
        return self.name == "fp32"

    def __repr__(self) -> str:
        return f"triton.language.{self[3:]}"


class _HostLanguage(types.ModuleType):
    """Bound to ``triton.language`` (``tl``) in packaged host code: its element types only."""

    dtype = HostDtype

    def __init__(self) -> None:
        super().__init__("triton.language", "Triton's element types, provided by the forge-aot runtime")
        for attr in HOST_DTYPES:
            setattr(self, attr, HostDtype(f"tl.{attr}"))
        self.__getattr__ = self._missing  # (PEP 562, as SmallTriton's: reads of tl.float16 stay plain)

    def _missing(self, name: str) -> Any:
        raise AttributeError(f"packaged host code may use Triton's element types (tl.float16, tl.bfloat16, ...) "
                             f"only, not tl.{name}")


class _ConstexprInt(int):
    """A module-level ``tl.constexpr(int)`` in host code: the value itself, with the ``.value`` Triton's object has
    (Liger-Kernel reads ``_REDUCTION_MODE_MEAN.value`` to map its reduction names)."""

    __slots__ = ()

    @property
    def value(self) -> int:
        return int(self)


class _ConstexprFloat(float):
    __slots__ = ()

    @property
    def value(self) -> float:
        return float(self)


class _ConstexprStr(str):
    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)


def host_constexpr(value: Any) -> Any:
    """What ``NAME = tl.constexpr(value)`` binds in packaged host code (sourcesplit rewrites it to this): the value,
    with ``.value`` where its type allows (a bool or None stays itself)."""
    kind = {int: _ConstexprInt, float: _ConstexprFloat, str: _ConstexprStr}.get(type(value))
    return kind(value) if kind is not None else value


_LANGUAGE: list[_HostLanguage] = []


def host_language() -> _HostLanguage:
    """The process's ``triton.language`` of host code (made on first read: rare)."""
    if not _LANGUAGE:
        _LANGUAGE.append(_HostLanguage())
    return _LANGUAGE[0]
