"""The NVIDIA driver through ctypes: every call prototyped. The driver of a runtime without the C extension, and
what the C driver (``cuda._CudaDriverC``) hands the rarer calls (the pure-Python launch, launch attributes, tensor
maps)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from .cuda import _CudaQueries
from .errors import DriverError
from .tables import LAUNCH_ATTR_COOPERATIVE, LAUNCH_ATTR_PDL


def _prototyped(lib: Any) -> Any:
    """``lib`` (a ctypes CDLL of the driver) with the prototypes of every function the ctypes path calls."""
    vp, i, u, p = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER
    sigs: dict[str, list[Any]] = {
        "cuInit": [u],
        "cuGetErrorName": [i, p(ctypes.c_char_p)],
        "cuDeviceGet": [p(i), i],
        "cuDeviceGetCount": [p(i)],
        "cuDeviceGetAttribute": [p(i), i, i],
        "cuDeviceGetName": [ctypes.c_char_p, i, i],
        "cuDevicePrimaryCtxRetain": [p(vp), i],
        "cuCtxGetCurrent": [p(vp)],
        "cuCtxPushCurrent_v2": [vp],
        "cuCtxPopCurrent_v2": [p(vp)],
        "cuModuleLoadData": [p(vp), ctypes.c_char_p],
        "cuModuleGetFunction": [p(vp), vp, ctypes.c_char_p],
        "cuFuncGetAttribute": [p(i), i, vp],
        "cuFuncSetAttribute": [vp, i, i],
        "cuLaunchKernel": [vp, u, u, u, u, u, u, u, vp, vp, vp],
    }
    for name, argtypes in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def _library(name: str = "libcuda.so.1") -> Any:
    try:
        return ctypes.CDLL(name)
    except OSError as exc:
        raise DriverError(f"cannot load the NVIDIA driver library {name}: {exc}") from None


class _CudaDriver(_CudaQueries):
    """The driver through ctypes: every call prototyped (``_prototyped``)."""

    def __init__(self, lib: Any = None) -> None:
        self.lib = _prototyped(lib if lib is not None else _library())
        self.launch = self.lib.cuLaunchKernel
        self.ctx_get_current = self.lib.cuCtxGetCurrent
        self._ctx: dict[int, int] = {}
        self._late: dict[str, Any] = {}
        """Driver functions CUDA 12 added (``_cuda12``), set up on first use."""
        self._ex_types: Any = None
        self.check(self.lib.cuInit(0), "cuInit")

    def _error_name(self, code: int) -> str | None:
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        return name.value.decode() if name.value else None

    def device_count(self) -> int:
        count = ctypes.c_int()
        self.check(self.lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        return count.value

    def _device(self, index: int) -> int:
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        return dev.value

    def attribute(self, index: int, attr: int) -> int:
        out = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(out), attr, self._device(index)),
                   "cuDeviceGetAttribute")
        return out.value

    def device_name(self, index: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self.check(self.lib.cuDeviceGetName(buf, 256, self._device(index)), "cuDeviceGetName")
        return buf.value.decode()

    def _function_attribute(self, attr: int, fn: int) -> int:
        value = ctypes.c_int()
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(value), attr, fn), "cuFuncGetAttribute")
        return value.value

    def _retain(self, device: int) -> int:
        handle = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(handle), device), "cuDevicePrimaryCtxRetain")
        return int(handle.value or 0)

    def load(self, index: int, image: bytes, name: str, shared: int, max_shared: int) -> int:
        """Load a cubin into the device's primary context (the one torch uses) and return the function."""
        ctx = self.primary_context(index)
        self.check(self.lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            module = ctypes.c_void_p()
            self.check(self.lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
            fn = ctypes.c_void_p()
            self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                       "cuModuleGetFunction")
            if shared > 49152:
                # Above 48 KB dynamic shared memory must be opted into, as Triton's own loader does.
                static = ctypes.c_int()
                self.check(self.lib.cuFuncGetAttribute(ctypes.byref(static), 1, fn), "cuFuncGetAttribute")
                self.check(self.lib.cuFuncSetAttribute(fn, 8, max_shared - static.value), "cuFuncSetAttribute")
            return int(fn.value or 0)
        finally:
            self.check(self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p())), "cuCtxPopCurrent")

    def entry_points(self) -> dict[str, int]:
        """Addresses of the functions the C launch path calls (fastpath.py): from this same library."""
        def address(fn: Any) -> int:
            return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)

        lib = self.lib
        ex = getattr(lib, "cuLaunchKernelEx", None)  # CUDA 12: launches with attributes
        tma = getattr(lib, "cuTensorMapEncodeTiled", None)  # CUDA 12: host-side tensor descriptors
        return {"launch": address(self.launch), "ctx_get": address(lib.cuCtxGetCurrent),
                "ctx_push": address(lib.cuCtxPushCurrent_v2), "ctx_pop": address(lib.cuCtxPopCurrent_v2),
                "launch_ex": address(ex) if ex is not None else 0, "tensor_map": address(tma) if tma is not None else 0}

    def _cuda12(self, name: str, argtypes: Callable[[], list[Any]], needed_by: str) -> Any:
        """A driver function CUDA 12 added, set up on first use (``argtypes()`` then), or a DriverError naming what
        needs it."""
        fn = self._late.get(name)
        if fn is None:
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise DriverError(f"this NVIDIA driver has no {name} ({needed_by} need CUDA 12 or later)") from None
            fn.argtypes, fn.restype = argtypes(), ctypes.c_int
            self._late[name] = fn
        return fn

    def launch_ex(self, fn: int, gx: int, gy: int, gz: int, block: int, shared: int, stream: int, params: Any,
                  attrs: int) -> int:
        """``cuLaunchKernelEx`` with the launch attributes Triton 3.6's launcher sets for ``launch_pdl`` and
        ``launch_cooperative_grid`` (``attrs``: tables.LAUNCH_ATTR_* bits); returns the driver's code."""
        if self._ex_types is None:
            class Attribute(ctypes.Structure):  # CUlaunchAttribute: id, padding, a 64-byte value union
                _fields_ = [("id", ctypes.c_int), ("value", ctypes.c_uint64 * 8)]

            class Config(ctypes.Structure):  # CUlaunchConfig
                _fields_ = [("dims", ctypes.c_uint * 6), ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                            ("attrs", ctypes.POINTER(Attribute)), ("n_attrs", ctypes.c_uint)]

            self._ex_types = (Attribute, Config)
        attribute, config = self._ex_types
        ex = self._cuda12("cuLaunchKernelEx", lambda: [ctypes.POINTER(config), ctypes.c_void_p, ctypes.c_void_p,
                                                       ctypes.c_void_p], "launch_pdl and launch_cooperative_grid")
        # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6), CU_LAUNCH_ATTRIBUTE_COOPERATIVE (2), value 1
        ids = [i for bit, i in ((LAUNCH_ATTR_PDL, 6), (LAUNCH_ATTR_COOPERATIVE, 2)) if attrs & bit]
        items = (attribute * len(ids))(*[attribute(i, (ctypes.c_uint64 * 8)(1)) for i in ids])
        cfg = config((ctypes.c_uint * 6)(gx, gy, gz, block, 1, 1), shared, stream, items, len(ids))
        return ex(ctypes.byref(cfg), fn, params, None)

    def encode_tensor_map(self, address: int, dtype: int, rank: int, dims: list[int], byte_strides: list[int],
                          box: list[int], swizzle: int, nan_fill: bool) -> bytes:
        """A ``CUtensorMap`` (128 bytes) for a host-side tensor descriptor (``cuTensorMapEncodeTiled``, as Triton's
        ``fill_tma_descriptor``): arguments innermost dimension first, strides in bytes without the innermost."""
        def argtypes() -> list[Any]:
            u32p, u64p, i = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int
            return [ctypes.c_void_p, i, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p, i, i, i, i]

        fn = self._cuda12("cuTensorMapEncodeTiled", argtypes, "tensor descriptors")
        buf = ctypes.create_string_buffer(128 + 64)  # CUtensorMap is 64-byte aligned
        out = (ctypes.addressof(buf) + 63) & ~63
        u64s, u32s = ctypes.c_uint64 * 5, ctypes.c_uint32 * 5
        code = fn(out, dtype, rank, address, u64s(*dims), u64s(*byte_strides), u32s(*box), u32s(1, 1, 1, 1, 1),
                  0, swizzle, 2, 1 if nan_fill else 0)  # no interleave, L2 promotion 128 B, NaN fill where asked
        if code != 0:
            self.check(code, f"cuTensorMapEncodeTiled (element type {dtype}, rank {rank}, address {address:#x}, "
                       f"shape {dims[::-1]}, box {box[::-1]}, swizzle {swizzle})")
        return ctypes.string_at(out, 128)

    def current_context(self) -> int:
        ctx = ctypes.c_void_p()
        self.ctx_get_current(ctypes.byref(ctx))
        return int(ctx.value or 0)

    def push(self, ctx: int) -> None:
        self.check(self.lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")

    def pop(self) -> None:
        self.check(self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p())), "cuCtxPopCurrent")


