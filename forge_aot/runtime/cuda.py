"""The NVIDIA driver API (``libcuda.so.1``): load cubins into torch's primary context. Through the C extension's
``Driver`` where it is loaded (``_CudaDriverC``: a first launch's calls), else through ctypes (``cuda_ctypes``, also
what the C driver hands the rarer calls to)."""

from __future__ import annotations

from typing import Any


def open_driver(name: str = "libcuda.so.1") -> Any:
    """The process's NVIDIA driver: through the C extension's ``Driver`` where it is loaded (no ctypes on a first
    launch; the one ``basics.c_driver`` opened, shared with the lean first calls), else through ctypes."""
    from .basics import c_driver

    opened = c_driver(name)
    if opened is not None:
        return _CudaDriverC(name, *opened)
    from .cuda_ctypes import _CudaDriver, _library

    return _CudaDriver(_library(name))


class _CudaQueries:
    """What both drivers answer alike from their own calls (``attribute``, ``device_name``, ``_function_attribute``,
    ``_retain``, ``_device``)."""

    backend = "cuda"
    _ctx: dict[int, int]

    def check(self, code: int, what: str) -> None:
        if code != 0:
            from .errors import DriverError  # (loaded where an error is raised: a first launch needs none)

            raise DriverError(f"{what} failed: {self._error_name(code) or 'unknown'} ({code})")

    def describe(self, index: int) -> dict[str, Any]:
        major, minor = self.attribute(index, 75), self.attribute(index, 76)
        return {"name": self.device_name(index), "capability": (major, minor), "arch": f"sm_{major}{minor}",
                "max_shared": self.attribute(index, 97)}  # 97: MAX_SHARED_MEMORY_PER_BLOCK_OPTIN

    def properties(self, index: int) -> dict[str, Any]:
        """What Triton's ``driver.active.utils.get_device_properties`` answers on NVIDIA, from the same attributes."""
        # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, MAX_REGISTERS_PER_BLOCK, MULTIPROCESSOR_COUNT, WARP_SIZE, CLOCK_RATE,
        # MEMORY_CLOCK_RATE, GLOBAL_MEMORY_BUS_WIDTH
        attrs = {"max_shared_mem": 97, "max_num_regs": 12, "multiprocessor_count": 16, "warpSize": 10,
                 "sm_clock_rate": 13, "mem_clock_rate": 36, "mem_bus_width": 37}
        return {key: self.attribute(index, attr) for key, attr in attrs.items()}

    def function_attributes(self, fn: int) -> tuple[int, int, int]:
        """A loaded function's (registers per thread, spilled registers per thread, most threads per block), as
        Triton's loader reads them (``CompiledKernel.n_regs``, ``n_spills``, ``n_max_threads``)."""
        out = [self._function_attribute(attr, fn) for attr in (4, 3, 0)]  # NUM_REGS, LOCAL_SIZE_BYTES, MAX_THREADS
        return out[0], out[1] // 4, out[2]

    def primary_context(self, index: int) -> int:
        ctx = self._ctx.get(index)
        if ctx is None:
            ctx = self._ctx[index] = self._retain(self._device(index))
        return ctx


class _CudaDriverC(_CudaQueries):
    """The driver through the C extension's ``Driver``: a first launch's calls (device queries, primary context,
    module load, the C launcher's entry points) without ctypes. Through ctypes a fresh process's first launch spent
    about 0.5 ms in them (prototypes 0.31, device queries 0.11, load 0.05, entry points 0.05; locally, with the test
    suite's fake driver); the rarer calls (the pure-Python launch, launch attributes, tensor maps) go to the ctypes
    driver (``cuda_ctypes``), made on first use on the same library."""

    def __init__(self, name: str, handle: int, c_driver: Any) -> None:
        self._library = (name, handle)
        self.c = c_driver
        self._ctx: dict[int, int] = {}
        self.check(c_driver.init(), "cuInit")

    def __getattr__(self, name: str) -> Any:
        # (only for what this class does not define: lib, launch, ctx_get_current, launch_ex, encode_tensor_map)
        if name.startswith("__") or name in ("_library", "c", "_ctx", "_with_ctypes"):
            raise AttributeError(name)
        with_ctypes = self.__dict__.get("_with_ctypes")
        if with_ctypes is None:
            import ctypes

            from .cuda_ctypes import _CudaDriver

            lib_name, handle = self._library
            with_ctypes = self.__dict__["_with_ctypes"] = _CudaDriver(ctypes.CDLL(lib_name, handle=handle))
        return getattr(with_ctypes, name)

    def _error_name(self, code: int) -> str | None:
        return self.c.error_name(code)

    def _value(self, result: tuple[int, Any], what: str) -> Any:
        self.check(result[0], what)
        return result[1]

    def device_count(self) -> int:
        return self._value(self.c.count(), "cuDeviceGetCount")

    def _device(self, index: int) -> int:
        return self._value(self.c.device(index), "cuDeviceGet")

    def attribute(self, index: int, attr: int) -> int:
        return self._value(self.c.attribute(attr, self._device(index)), "cuDeviceGetAttribute")

    def device_name(self, index: int) -> str:
        return self._value(self.c.name(self._device(index)), "cuDeviceGetName")

    def _function_attribute(self, attr: int, fn: int) -> int:
        return self._value(self.c.function_attribute(attr, fn), "cuFuncGetAttribute")

    def _retain(self, device: int) -> int:
        return self._value(self.c.primary_context(device), "cuDevicePrimaryCtxRetain")

    def load(self, index: int, image: bytes, name: str, shared: int, max_shared: int) -> int:
        code, failed, fn = self.c.load(self.primary_context(index), image, name, shared, max_shared)
        self.check(code, failed or "load")
        return fn

    def entry_points(self) -> dict[str, int]:
        return self.c.entry_points()

    def current_context(self) -> int:
        return self._value(self.c.current_context(), "cuCtxGetCurrent")

    def push(self, ctx: int) -> None:
        self.check(self.c.push(ctx), "cuCtxPushCurrent")

    def pop(self) -> None:
        self.check(self.c.pop(), "cuCtxPopCurrent")
