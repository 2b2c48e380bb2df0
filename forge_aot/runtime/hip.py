"""The ROCm HIP runtime through ctypes (``libamdhip64.so``): load hsaco images and launch."""

from __future__ import annotations

import ctypes
from typing import Any

from .errors import DriverError


class _HipDriver:
    backend = "hip"

    def __init__(self) -> None:
        lib = None
        for candidate in ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7", "libamdhip64.so.5"):
            try:
                lib = ctypes.CDLL(candidate)
                break
            except OSError:
                continue
        if lib is None:
            raise DriverError("cannot load the ROCm HIP runtime library libamdhip64.so")
        vp, i, u, p = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER
        sigs: dict[str, list[Any]] = {
            "hipGetErrorName": [i],
            "hipGetDevice": [p(i)],
            "hipSetDevice": [i],
            "hipModuleLoadData": [p(vp), ctypes.c_char_p],
            "hipModuleGetFunction": [p(vp), vp, ctypes.c_char_p],
            "hipModuleLaunchKernel": [vp, u, u, u, u, u, u, u, vp, vp, vp],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        lib.hipGetErrorName.restype = ctypes.c_char_p
        self.lib = lib
        self.launch = lib.hipModuleLaunchKernel

    def check(self, code: int, what: str) -> None:
        if code != 0:
            label = self.lib.hipGetErrorName(code)
            raise DriverError(f"{what} failed: {label.decode() if label else 'unknown'} ({code})")

    def describe(self, index: int) -> dict[str, Any]:
        import torch

        props = torch.cuda.get_device_properties(index)
        gfx = str(getattr(props, "gcnArchName", "")).split(":")[0]
        return {"name": props.name, "capability": None, "arch": gfx,
                "max_shared": int(getattr(props, "shared_memory_per_block_optin", 65536) or 65536)}

    def load(self, index: int, image: bytes, name: str, shared: int, max_shared: int) -> int:
        previous = ctypes.c_int()
        self.check(self.lib.hipGetDevice(ctypes.byref(previous)), "hipGetDevice")
        self.check(self.lib.hipSetDevice(index), "hipSetDevice")
        try:
            module = ctypes.c_void_p()
            self.check(self.lib.hipModuleLoadData(ctypes.byref(module), image), "hipModuleLoadData")
            fn = ctypes.c_void_p()
            self.check(self.lib.hipModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                       "hipModuleGetFunction")
            return int(fn.value or 0)
        finally:
            self.lib.hipSetDevice(previous.value)
