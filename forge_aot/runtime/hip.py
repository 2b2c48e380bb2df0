"""The ROCm HIP runtime through ctypes (``libamdhip64.so``): load hsaco images and launch."""

from __future__ import annotations

import ctypes
from typing import Any

from .errors import DriverError
from .tables import LAUNCH_ATTR_COOPERATIVE


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
            "hipFuncGetAttribute": [p(i), i, vp],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        lib.hipGetErrorName.restype = ctypes.c_char_p
        self.lib = lib
        self.launch = lib.hipModuleLaunchKernel

    def launch_ex(self, fn: int, gx: int, gy: int, gz: int, block: int, shared: int, stream: int, params: Any,
                  attrs: int) -> int:
        """A launch with attributes, as Triton 3.6's AMD launcher: a cooperative grid through
        ``hipModuleLaunchCooperativeKernel``; ``launch_pdl`` has no AMD counterpart and is ignored, as there."""
        if not attrs & LAUNCH_ATTR_COOPERATIVE:
            return self.launch(fn, gx, gy, gz, block, 1, 1, shared, stream, params, None)
        coop = self.lib.hipModuleLaunchCooperativeKernel
        if coop.argtypes is None:  # set up on the first cooperative launch
            vp, u = ctypes.c_void_p, ctypes.c_uint
            coop.argtypes, coop.restype = [vp, u, u, u, u, u, u, u, vp, vp], ctypes.c_int
        return coop(fn, gx, gy, gz, block, 1, 1, shared, stream, params)

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

    def properties(self, index: int) -> dict[str, Any]:
        """What Triton's ``driver.active.utils.get_device_properties`` answers on AMD (its keys), from torch's
        device properties (not verified on AMD hardware)."""
        import torch

        props = torch.cuda.get_device_properties(index)
        return {"max_shared_mem": self.describe(index)["max_shared"],
                "max_num_regs": int(getattr(props, "regs_per_multiprocessor", 65536) or 65536),
                "multiprocessor_count": props.multi_processor_count,
                "sm_clock_rate": int(getattr(props, "clock_rate", 0) or 0),
                "mem_clock_rate": int(getattr(props, "memory_clock_rate", 0) or 0),
                "mem_bus_width": int(getattr(props, "memory_bus_width", 0) or 0),
                "arch": str(getattr(props, "gcnArchName", "")).split(":")[0],
                "warpSize": int(getattr(props, "warp_size", 64) or 64),
                "max_threads_per_sm": int(getattr(props, "max_threads_per_multi_processor", 2048) or 2048)}

    def function_attributes(self, fn: int) -> tuple[int, int, int]:
        """A loaded function's (registers, spilled registers, most threads per block) (hipFuncGetAttribute)."""
        out = []
        for attr in (4, 3, 0):  # HIP_FUNC_ATTRIBUTE_NUM_REGS, LOCAL_SIZE_BYTES, MAX_THREADS_PER_BLOCK
            value = ctypes.c_int()
            self.check(self.lib.hipFuncGetAttribute(ctypes.byref(value), attr, ctypes.c_void_p(fn)),
                       "hipFuncGetAttribute")
            out.append(value.value)
        return out[0], out[1] // 4, out[2]

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
