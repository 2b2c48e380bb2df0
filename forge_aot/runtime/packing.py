"""Kernel-argument packing: scalar encodings, C types and the dtype names Triton uses."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

from .basics import _DTYPE_CACHE, _KNOWN, _TORCH_DTYPE_NAMES, dtype_name  # noqa: F401  (basics: shared)


def _pack_fp16(x: float) -> int:
    return struct.unpack("<H", struct.pack("<e", x))[0]


def _pack_bf16(x: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even


_STRUCT_CODES = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u8": "B", "u16": "H", "u32": "I",
                 "u64": "Q", "fp16": "e", "bf16": "H", "fp32": "f", "fp64": "d"}
_CTYPES: dict[str, Any] = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
    "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64, "fp16": ctypes.c_uint16, "bf16": ctypes.c_uint16, "fp32": ctypes.c_float,
    "fp64": ctypes.c_double,
}
_INT_RANGES = {"i8": (-(2**7), 2**7 - 1), "i16": (-(2**15), 2**15 - 1), "i32": (-(2**31), 2**31 - 1),
               "i64": (-(2**63), 2**63 - 1), "u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1),
               "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}


def out_of_range(function: str, int_checks: list[tuple[int, str, str, int, int]], values: list[Any],
                 runtime: Sequence[tuple[str, str]] = (), pointer_ints: dict[int, str] | None = None) -> None:
    """Raise TypeError naming a scalar argument of a failed packing passed as None (no binary takes None there),
    or OverflowError naming the integer argument that its type cannot hold (``pointer_ints``: pointer parameters
    that also take an integer, by position, checked where the call passed one)."""
    as_int = {i for i in (pointer_ints or {}) if type(values[i]).__name__ == "PointerInt"}
    int_checks = [*int_checks, *((i, runtime[i][0], ty, *_INT_RANGES[ty]) for i, ty in (pointer_ints or {}).items()
                                 if i in as_int)]
    for (name, ty), value in zip(runtime, values):
        if value is None and not ty.startswith("*"):
            raise TypeError(f"{function}(): {name}=None, and this build has no binary taking None there (Triton "
                            "compiles None as a constant: pass None there in the examples to build it)") from None
    for i, name, ty, lo, hi in int_checks:
        if isinstance(values[i], float):  # vLLM's softcap: 0 where it has none, a float where it has one
            raise TypeError(f"{function}(): {name}={values[i]!r} is a float, and this build took {name} as {ty} (the "
                            f"values the build saw were integers; Triton's JIT would compile the call anew): declare "
                            f"{name} = \"fp32\" in the manifest's signature to build for floats") from None
        if not lo <= values[i] <= hi:
            wider = {"i32": "i64", "u32": "u64", "i8": "i32", "i16": "i32"}.get(ty, "")
            wider = f"{runtime[i][1]}|{wider}" if i in as_int else wider
            hint = f" (Triton's JIT would compile the call anew; declare {name} = \"{wider}\" in the manifest's " \
                   "signature to build for such values)" if wider else ""
            raise OverflowError(f"{function}(): {name}={values[i]} does not fit {ty}{hint}") from None


DESC_PREFIX = "tensordesc<"
"""A host-side tensor descriptor's parameter type (``tensordesc<T>``; see descriptors)."""
TENSOR_MAP_SIZE, TENSOR_MAP_ALIGN = 128, 64
"""A ``CUtensorMap`` kernel parameter (struct code ``M``: a host-side tensor descriptor on TMA hardware)."""


def block_layout(codes: list[str]) -> tuple[list[int], int]:
    """A kernel-parameter block's C layout from its struct codes: each parameter's offset (scalars aligned to their
    size, as a C compiler and ctypes lay them out; tensor maps to 64 bytes) and the block's size."""
    offsets, pos = [], 0
    for code in codes:
        size, align = (TENSOR_MAP_SIZE, TENSOR_MAP_ALIGN) if code == "M" else (struct.calcsize("<" + code),) * 2
        pos = (pos + align - 1) // align * align
        offsets.append(pos)
        pos += size
    return offsets, (pos + 7) // 8 * 8


def block_struct(offsets: list[int], codes: list[str]) -> struct.Struct:
    """One ``struct`` that packs the whole block: explicit padding reproduces the layout."""
    fmt, pos = "<", 0
    for off, code in zip(offsets, codes):
        code = f"{TENSOR_MAP_SIZE}s" if code == "M" else code
        fmt += "x" * (off - pos) + code
        pos = off + struct.calcsize("<" + code)
    return struct.Struct(fmt)


def check_dtypes(function: str, params: Sequence[tuple[str, str]], dtypes: Sequence[Any],
                 assignment: dict[str, Any]) -> None:
    """Raise UnsupportedDtypeError for a tensor (or descriptor) argument whose dtype is not its parameter's in the
    build variant ``assignment`` (``*fp32``, or ``*T`` with T from the variable's first tensor). Triton's JIT
    compiles every pointer's element type into the binary: a packaged one given another dtype would read its
    memory as the wrong type. ``dtypes``: each argument's dtype, None where it is None."""
    for (name, ty), dtype in zip(params, dtypes):
        declared = ty[1:] if ty.startswith("*") else ty[len(DESC_PREFIX):-1]
        expected = assignment.get(declared, declared)
        if dtype is not None and expected in _KNOWN and dtype_name(dtype) != expected:
            from .errors import UnsupportedDtypeError  # (loaded where raised: a first call needs none)

            raise UnsupportedDtypeError(f"{function}(): argument '{name}' is {dtype_name(dtype)}, and its binaries "
                                        f"take {expected} there ({name}: {ty} in the manifest; Triton's JIT would "
                                        "compile the call anew)")
