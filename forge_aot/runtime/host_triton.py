"""The ``triton`` name inside packaged host code: the host-side helpers only."""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator
from typing import Any


def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    if type(n) is not int:  # plain ints (every eager call) skip the thread-local read
        hinted = SIZE_HINTS.values
        hint = getattr(getattr(n, "node", None), "hint", None)  # a symbolic size (torch.SymInt) and its example
        if hinted is not None and type(hint) is int:
            value = next_power_of_2(hint * SIZE_HINTS.scale if SIZE_HINTS.scale else 1)
            hinted.add(value)
            return value
        n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class _SizeHints(threading.local):
    values: set[int] | None = None  # class defaults: reading them never raises
    scale = 1


SIZE_HINTS = _SizeHints()
"""While a custom op's fake implementation runs the host code on symbolic sizes (``hinted_sizes``), the values
``next_power_of_2`` computed from a size's example value instead of turning the size into a constant."""


@contextlib.contextmanager
def hinted_sizes(scale: int = 1) -> Iterator[set[int]]:
    """Host code's ``triton.next_power_of_2(n)`` of a symbolic size (torch.compile with dynamic shapes,
    torch.export with ``Dim``) gives the power of two of the size's example value (times ``scale``; 0: of the
    smallest size) and records it, instead of ``int(n)``, which would make torch specialize the size to that value
    (a recompile for every other size, an export error). Such a value picks a block size for a launch the fake
    implementation skips; ``torch_ops.fake_call`` checks that it reaches no output. Yields the values given."""
    previous = SIZE_HINTS.values, SIZE_HINTS.scale
    given: set[int] = set()
    SIZE_HINTS.values, SIZE_HINTS.scale = given, scale
    try:
        yield given
    finally:
        SIZE_HINTS.values, SIZE_HINTS.scale = previous


SCRATCH_ALLOCATOR: list[Any] = [None]
"""The allocator host code gave ``triton.set_allocator`` (one per process, as in Triton), or None: the runtime
then allocates kernels' global scratch (tensor descriptors built in the kernel) through torch itself."""


def set_allocator(allocator: Any) -> None:
    """``triton.set_allocator``: ``allocator(size, alignment, stream)`` returns a buffer (an object with
    ``data_ptr()``) for a launch's global scratch, as under Triton's JIT."""
    SCRATCH_ALLOCATOR[0] = allocator


class GPUTarget:
    """``triton.runtime.driver.active.get_current_target()``: Triton's GPUTarget (backend, arch, warp_size), read
    only. ``arch`` is the compute capability as an int (90) on NVIDIA, the gfx name on AMD, as in Triton."""

    __slots__ = ("arch", "backend", "warp_size")

    def __init__(self, backend: str, arch: int | str, warp_size: int) -> None:
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "arch", arch)
        object.__setattr__(self, "warp_size", warp_size)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("GPUTarget is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GPUTarget) and (self.backend, self.arch, self.warp_size) == \
            (other.backend, other.arch, other.warp_size)

    def __hash__(self) -> int:
        return hash((self.backend, self.arch, self.warp_size))

    def __repr__(self) -> str:
        return f"GPUTarget(backend={self.backend!r}, arch={self.arch!r}, warp_size={self.warp_size})"


DEVICE_PROFILE: list[Any] = [None]
"""While the build traces host code, the GPU it stands for: (GPUTarget, properties dict), so
``driver.active`` answers as a representative GPU of the target being traced. None: the real device."""


class _DriverUtils:
    def get_device_properties(self, device: Any = None) -> dict[str, Any]:
        """Triton's ``driver.active.utils.get_device_properties(device)``: the same keys (``max_shared_mem``,
        ``max_num_regs``, ``multiprocessor_count``, ``warpSize``, ``sm_clock_rate``, ``mem_clock_rate``,
        ``mem_bus_width``; on AMD also ``arch`` and ``max_threads_per_sm``), read from the driver."""
        profile = DEVICE_PROFILE[0]
        if profile is not None:
            return dict(profile[1])
        index = _device_index(device)
        props = _PROPERTIES.get(index)
        if props is None:
            from .drivers import driver

            props = _PROPERTIES[index] = driver().properties(index)
        return dict(props)  # a copy: host code may change its own


_TARGETS: dict[int, GPUTarget] = {}
"""Each device's target, read once (host code like the tutorial's ``is_hip()`` asks on every call)."""
_PROPERTIES: dict[int, dict[str, Any]] = {}
"""Each device's properties, read once: the driver takes about 0.13 ms per attribute on the H100 host (0.9 ms for
the seven), and host code in FLA's style asks on every call (Triton reads them again each time)."""


def _device_index(device: Any) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


class _ActiveDriver:
    """``triton.runtime.driver.active`` in host code: what host code reads from it (the device, its stream, its
    target and properties), answered from torch and the GPU driver, never Triton."""

    def __init__(self) -> None:
        self.utils = _DriverUtils()

    @property
    def active(self) -> _ActiveDriver:  # ``triton.runtime.driver.active``: the driver is its own active one
        return self

    def get_current_device(self) -> int:
        import torch

        return 0 if DEVICE_PROFILE[0] is not None else torch.cuda.current_device()

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cuda", self.get_current_device())

    def get_device_interface(self) -> Any:
        import torch

        return torch.cuda

    def get_current_stream(self, device: Any = None) -> int:
        import torch

        if DEVICE_PROFILE[0] is not None:
            return 0
        return torch.cuda.current_stream(_device_index(device)).cuda_stream

    def get_current_target(self) -> GPUTarget:
        profile = DEVICE_PROFILE[0]
        if profile is not None:
            return profile[0]
        index = self.get_current_device()
        target = _TARGETS.get(index)
        if target is None:
            from .drivers import driver

            drv = driver()
            info = drv.describe(index)
            if drv.backend == "cuda":
                major, minor = info["capability"]
                target = GPUTarget("cuda", major * 10 + minor, 32)
            else:
                target = GPUTarget("hip", info["arch"], drv.properties(index)["warpSize"])
            _TARGETS[index] = target
        return target

    def is_active(self) -> bool:
        return True


class _HostRuntime(types.ModuleType):
    """``triton.runtime`` in host code: its ``driver`` only."""

    def __init__(self) -> None:
        super().__init__("triton.runtime", "triton.runtime.driver, provided by the forge-aot runtime")
        self.driver = _ActiveDriver()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"packaged host code may use triton.runtime.driver only, not triton.runtime.{name}")


def _wrap_triton(kernel: Any) -> Any:
    """``torch.library.wrap_triton(kernel)`` (and ``capture_triton``) in host code: a packaged kernel handle as it
    is; anything else goes to torch's own."""
    from .kernel import Kernel

    if isinstance(kernel, Kernel):
        return kernel
    import torch

    return torch.library.wrap_triton(kernel)


def _triton_op(name: str, fn: Any = None, /, *, mutates_args: Any, schema: Any = None) -> Any:
    """``@torch.library.triton_op(name, mutates_args=...)`` in host code: the function as it is. The package
    registers its ops itself, as ``torch.ops.<package>.<op>`` with a Meta implementation from the host code (so
    ``torch.compile`` sees one opaque op); the name given here is not registered."""
    return fn if fn is not None else (lambda f: f)


class _HostTriton(types.ModuleType):
    """Bound to ``triton`` in packaged host code, so ``triton.cdiv`` works and nothing imports Triton."""

    HOST_HELPERS = ("cdiv", "next_power_of_2", "runtime", "set_allocator")

    def __init__(self) -> None:
        super().__init__("triton", "host-side helpers of Triton, provided by the forge-aot runtime")
        self.cdiv = cdiv
        self.next_power_of_2 = next_power_of_2
        self.set_allocator = set_allocator
        self.runtime = _HostRuntime()
        self._wrap_triton = _wrap_triton  # torch.library's Triton entry points (see sourcesplit.TORCH_TRITON)
        self._triton_op = _triton_op

    def __getattr__(self, name: str) -> Any:
        helpers = ", ".join("triton." + h for h in self.HOST_HELPERS if h != "runtime")
        raise AttributeError(f"packaged host code may use {helpers} only (and triton.runtime.driver), not "
                             f"triton.{name}")


host_triton = _HostTriton()
