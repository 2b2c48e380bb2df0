"""Host-side tensor descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``) in packaged host code, and the
kernel parameters a launch passes for one: a ``CUtensorMap`` encoded on the host (TMA, Hopper and later) or the
base pointer, shape and strides where the binary was compiled without TMA, as Triton 3.6's launcher does."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .packing import _INT_RANGES, DESC_PREFIX

if TYPE_CHECKING:
    from .kernel import Kernel


def desc_dtype(ty: str) -> str | None:
    """The element type (or type variable) of a ``tensordesc<T>`` parameter type; None for other types."""
    return ty[len(DESC_PREFIX):-1] if ty.startswith(DESC_PREFIX) and ty.endswith(">") else None


def desc_signature(dtype: str, block_shape: Any) -> str:
    """Triton's signature text of a descriptor argument (``tensordesc<fp16[128, 64]>``), as its JIT writes it."""
    return f"tensordesc<{dtype}[{', '.join(str(int(d)) for d in block_shape)}]>"


class TensorDescriptor:
    """Triton's host-side ``TensorDescriptor``: a tensor, its shape and strides (elements) and the block shape a
    kernel loads and stores through it. Same fields, checks and ``from_tensor`` as Triton 3.6's dataclass;
    autotune pre-hooks set ``block_shape`` per config, which picks the binary."""

    __slots__ = ("base", "block_shape", "padding", "shape", "strides")

    def __init__(self, base: Any, shape: Any, strides: Any, block_shape: Any, padding: str = "zero") -> None:
        self.base = base
        self.shape = shape
        self.strides = strides
        self.block_shape = block_shape
        self.padding = padding
        rank = len(shape)
        if len(strides) != rank or len(block_shape) != rank:
            raise ValueError(f"TensorDescriptor: rank mismatch (shape {list(shape)}, strides {list(strides)}, "
                             f"block_shape {list(block_shape)})")
        if not 0 < rank <= 5:
            raise ValueError(f"TensorDescriptor: rank must be 1 to 5, got {rank}")
        if type(base).__name__ not in ("FakeTensor", "FunctionalTensor") and getattr(base, "is_meta", False) is False \
                and base.data_ptr() % 16:
            raise ValueError("TensorDescriptor: base must be 16-byte aligned")
        _validate_block_shape(block_shape)
        elem_bytes = base.dtype.itemsize
        for stride in list(strides)[:-1]:
            if (stride * elem_bytes) % 16:
                raise ValueError("TensorDescriptor: strides must be 16-byte aligned")
        if any(d <= 0 for d in shape):
            raise ValueError("TensorDescriptor: shape must be positive")
        if strides[-1] != 1:
            raise ValueError("TensorDescriptor: the last dimension must be contiguous")
        if padding not in ("zero", "nan"):
            raise ValueError(f"TensorDescriptor: illegal padding {padding!r}")
        if padding == "nan" and not base.dtype.is_floating_point:
            raise ValueError("TensorDescriptor: padding 'nan' is only supported for floating point tensors")

    @property
    def dtype(self) -> Any:
        """The tensor's dtype (not in Triton's class): what selects a ``tensordesc<T>`` argument's build."""
        return self.base.dtype

    def get_device(self) -> int:
        """The tensor's device (not in Triton's class): checked like a tensor argument's."""
        return self.base.get_device()

    @staticmethod
    def from_tensor(tensor: Any, block_shape: Any, padding: str = "zero") -> TensorDescriptor:
        return TensorDescriptor(tensor, tensor.shape, tensor.stride(), block_shape, padding)

    def __repr__(self) -> str:
        return (f"TensorDescriptor(shape={list(self.shape)}, strides={list(self.strides)}, "
                f"block_shape={list(self.block_shape)}, padding={self.padding!r})")


def _validate_block_shape(shape: Any) -> None:
    # as triton._utils.validate_block_shape: powers of two, at most 2**20 elements
    numel = 1
    for i, d in enumerate(shape):
        if type(d) is not int:
            raise TypeError(f"TensorDescriptor: block_shape[{i}] must be an int, got {type(d).__name__}")
        if d <= 0 or d & (d - 1):
            raise ValueError(f"TensorDescriptor: block_shape[{i}] must be a power of two, got {d}")
        numel *= d
    if numel > 1 << 20:
        raise ValueError(f"TensorDescriptor: block of {numel} elements is more than 1048576")


def tools_module() -> types.ModuleType:
    """``triton.tools`` in host code: ``tensor_descriptor.TensorDescriptor`` only."""
    tools = types.ModuleType("triton.tools", "Triton's host tools, provided by the forge-aot runtime")
    inner = types.ModuleType("triton.tools.tensor_descriptor")
    inner.TensorDescriptor = TensorDescriptor  # type: ignore[attr-defined]
    tools.tensor_descriptor = inner  # type: ignore[attr-defined]
    return tools


def param_codes(rank: int, tma: bool) -> list[str]:
    """The kernel parameters one descriptor argument becomes, as struct codes in order (Triton 3.6's
    ``make_launcher``; ``M`` is the 128-byte, 64-byte aligned ``CUtensorMap``):
    with TMA a tensor map, the shape (i32) and the strides (i64); without, the base pointer, shape and strides
    (i64), the NaN-padding flag, then the shape (i32) and strides (i64) again."""
    if tma:
        return ["M", *"i" * rank, *"q" * rank]
    return ["Q", *"q" * (2 * rank), "b", *"i" * rank, *"q" * rank]


# Element-type codes of Triton's tensordesc metadata (device numbering) -> CUtensorMapDataType (host numbering).
_TMA_DTYPE_DEVICE_TO_HOST = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}


def _extent(desc: Any, attr: str, rank: int | None) -> list[int]:
    values = [int(d) for d in getattr(desc, attr)]
    if rank is not None and len(values) != rank:
        raise ValueError(f"TensorDescriptor: {attr} of rank {len(values)}, and the binary takes rank {rank}")
    return values


def _fits_i32(shape: list[int]) -> None:
    lo, hi = _INT_RANGES["i32"]
    for d in shape:
        if not lo <= d <= hi:
            raise OverflowError(f"TensorDescriptor: {d} does not fit i32")


def expand(desc: Any, meta: dict[str, Any] | None, encode: Any, rank: int | None = None) -> list[Any]:
    """The parameter values of one descriptor argument (see ``param_codes``). ``encode(address, dtype, rank,
    shape, strides_bytes, box, swizzle, nan_fill)`` returns the 128 bytes of a tensor map (the driver's
    ``cuTensorMapEncodeTiled``); ``meta`` is the binary's tensordesc metadata for this argument (None: no TMA);
    ``rank``, the binary's (a descriptor of another rank raises, as the C launcher does)."""
    shape = _extent(desc, "shape", rank)
    strides = _extent(desc, "strides", rank)
    nan = desc.padding == "nan"
    if meta is None:
        _fits_i32(shape)
        return [desc.base.data_ptr(), *shape, *strides, int(nan), *shape, *strides]
    if strides[-1] != 1:
        raise ValueError("TensorDescriptor: the last dimension must be contiguous")
    if meta.get("fp4_padded"):
        shape[-1] *= 2
    elem = int(meta["elem_size"])
    rank = len(shape)
    # The driver's order is innermost first; strides in bytes, without the innermost (contiguous) one.
    dims = shape[::-1]
    byte_strides = [s * elem for s in strides[:-1]][::-1]
    box = [int(b) for b in meta["block_size"]][::-1]
    tensor_map = encode(desc.base.data_ptr(), _TMA_DTYPE_DEVICE_TO_HOST[int(meta["elem_type"])], rank, dims,
                        byte_strides, box, int(meta["swizzle"]), nan)
    _fits_i32(shape)
    return [tensor_map, *shape, *strides]


def expander(meta: dict[str, Any] | None, encode: Any, rank: int | None = None, limit: int = 256) -> Any:
    """``expand`` for one descriptor argument of one binary, remembering the tensor maps it encoded: a map depends
    only on the tensor's address, shape, strides and padding (the binary fixes the rest), and calls that reuse
    their buffers (torch's caching allocator hands the same addresses back) skip the driver's encoding. At most
    ``limit`` maps are kept; the memory is cleared when full."""
    if meta is None:
        return lambda desc: expand(desc, None, encode, rank)
    maps: dict[tuple[Any, ...], list[Any]] = {}

    def run(desc: Any) -> list[Any]:
        key = (desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides), desc.padding)
        out = maps.get(key)
        if out is None:
            if len(maps) >= limit:
                maps.clear()
            out = maps[key] = expand(desc, meta, encode, rank)
        return out

    return run


def c_layouts(params: list[tuple[str, str]], binary: dict[str, Any]) -> tuple[Any, ...]:
    """What the C launcher (fastpath.py) needs of each parameter of a binary to lay a descriptor out as ``expand``
    does: None for other parameters; for a descriptor ``(tma, rank, elem_size, elem_type, box, swizzle,
    fp4_padded)``, the element type in the driver's numbering and the box innermost first (unused without TMA)."""
    metas = binary.get("tensordesc_meta", {})
    out: list[Any] = []
    for name, ty in params:
        meta = metas.get(name)
        if not ty.startswith(DESC_PREFIX):
            out.append(None)
        elif meta is None:
            out.append((0, len(binary["descs"][name]), 0, 0, (), 0, 0))
        else:
            box = tuple(int(b) for b in meta["block_size"])[::-1]
            out.append((1, len(binary["descs"][name]), int(meta["elem_size"]),
                        _TMA_DTYPE_DEVICE_TO_HOST[int(meta["elem_type"])], box, int(meta["swizzle"]),
                        int(bool(meta.get("fp4_padded")))))
    return tuple(out)


def launch_layout(params: list[tuple[str, str]], binary: dict[str, Any], struct_codes: dict[str, str],
                  encode: Any) -> tuple[list[str], Any]:
    """For a launcher of a binary whose parameters include tensor descriptors: the struct codes of its parameter
    block (``param_codes`` per descriptor, as the binary's TMA metadata says) and the function that turns a call's
    values into the block's values (each descriptor expanded, through ``expander``)."""
    metas = binary.get("tensordesc_meta", {})
    codes: list[str] = []
    slots = []
    for j, (name, ty) in enumerate(params):
        if ty.startswith(DESC_PREFIX):
            codes += param_codes(len(binary["descs"][name]), metas.get(name) is not None)
            slots.append((j, expander(metas.get(name), encode, len(binary["descs"][name]))))
        else:
            codes.append("Q" if ty.startswith("*") else struct_codes[ty])

    def expand_values(values: list[Any]) -> list[Any]:
        out: list[Any] = []
        start = 0
        for j, run in slots:
            out += values[start:j]
            out += run(values[j])
            start = j + 1
        out += values[start:]
        return out

    return codes, expand_values


def not_built(kernel: Any, binaries: dict[str, dict[str, Any]],
              descs: tuple[tuple[str, tuple[int, ...]], ...]) -> Exception:
    """The error of a call whose descriptors' block shapes no binary of its config was built for."""
    from .errors import NotBuiltError

    built = sorted({binary_blocks(b) for b in binaries.values() if b.get("descs")})
    return NotBuiltError(f"{kernel.function}(): tensor descriptors with block shapes "
                         f"{ {n: list(s) for n, s in descs} } were not built for this config; built: "
                         f"{[{n: list(s) for n, s in d} for d in built] or 'none (it takes pointers there)'}")


def block_shapes(kernel: Kernel, runtime: Sequence[Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, block shape) of each tensor descriptor argument of a call, by name (the order of the index's JSON), as
    the call (or the config's pre-hook) set it: ``tensordesc<T>`` parameters and pointer parameters passed a
    descriptor. With the heuristics' values and the specialization, what selects the binary of a config."""
    for i in kernel.desc_pos:
        if not (hasattr(runtime[i], "base") and hasattr(runtime[i], "block_shape")):
            raise TypeError(f"{kernel.function}(): argument '{kernel.runtime_names[i]}' must be a TensorDescriptor "
                            f"(triton.tools.tensor_descriptor), got {type(runtime[i]).__name__}")
    positions = {*kernel.desc_pos, *(i for i in kernel.ptr_pos if hasattr(runtime[i], "block_shape"))}
    return tuple(sorted((kernel.runtime_names[i], tuple(int(d) for d in runtime[i].block_shape)) for i in positions))


def binary_blocks(binary: dict[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """What ``block_shapes`` gives for the calls a binary serves."""
    return tuple(sorted((n, tuple(shape)) for n, shape in binary.get("descs", {}).items()))
