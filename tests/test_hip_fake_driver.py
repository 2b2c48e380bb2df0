"""The AMD path against a fake HIP runtime (no ROCm machine here): library loading, module load calls and
device restore, error mapping, and the kernel-parameter block a launch hands to hipModuleLaunchKernel."""

from __future__ import annotations

import ctypes
import hashlib
import struct

import pytest

from forge_aot import runtime as rt
from forge_aot.runtime import drivers, hip


class _Fn:
    """A ctypes-function stand-in: argtypes/restype are settable, calls are recorded."""

    def __init__(self, lib: FakeHip, name: str) -> None:
        self.lib, self.name = lib, name
        self.argtypes: list = []
        self.restype = ctypes.c_int

    def __call__(self, *args):
        self.lib.calls.append((self.name, args))
        return self.lib.behaviour.get(self.name, lambda *a: 0)(*args)


class FakeHip:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.device = 0
        self.behaviour = {
            "hipGetErrorName": lambda code: {100: b"hipErrorNoDevice", 209: b"hipErrorNoBinaryForGpu"}.get(code),
            "hipGetDevice": self._get_device,
            "hipSetDevice": self._set_device,
            "hipModuleLoadData": lambda out, image: self._store(out, 0x1000),
            "hipModuleGetFunction": lambda out, module, name: self._store(out, 0x2000),
        }
        for name in ("hipGetErrorName", "hipGetDevice", "hipSetDevice", "hipModuleLoadData", "hipModuleGetFunction",
                     "hipModuleLaunchKernel", "hipModuleLaunchCooperativeKernel", "hipFuncGetAttribute"):
            setattr(self, name, _Fn(self, name))

    @staticmethod
    def _store(ref, value: int) -> int:
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p))[0] = value
        return 0

    def _get_device(self, ref) -> int:
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = self.device
        return 0

    def _set_device(self, index: int) -> int:
        self.device = index
        return 0


@pytest.fixture
def fake_hip(monkeypatch):
    lib = FakeHip()
    tried = []

    def cdll(name: str):
        tried.append(name)
        if name != "libamdhip64.so.6":
            raise OSError(f"{name}: cannot open shared object file")
        return lib

    monkeypatch.setattr(hip.ctypes, "CDLL", cdll)
    driver = hip._HipDriver()
    assert tried == ["libamdhip64.so", "libamdhip64.so.6"]  # falls through to a versioned name
    monkeypatch.setattr(drivers, "_driver", driver)
    return lib, driver


def test_missing_runtime_library_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(hip.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
    with pytest.raises(rt.DriverError, match=r"cannot load the ROCm HIP runtime library libamdhip64\.so"):
        hip._HipDriver()


def test_module_load_sets_and_restores_the_device(fake_hip) -> None:
    lib, driver = fake_hip
    lib.device = 3
    fn = driver.load(1, b"\x7fELF-hsaco", "k", 0, 65536)
    assert fn == 0x2000
    names = [name for name, _ in lib.calls]
    assert names == ["hipGetDevice", "hipSetDevice", "hipModuleLoadData", "hipModuleGetFunction", "hipSetDevice"]
    assert lib.calls[1][1] == (1,) and lib.calls[-1][1] == (3,) and lib.device == 3
    assert lib.calls[3][1][2] == b"k"


def test_errors_are_named_and_the_device_is_still_restored(fake_hip) -> None:
    lib, driver = fake_hip
    lib.behaviour["hipModuleLoadData"] = lambda out, image: 209
    lib.device = 2
    with pytest.raises(rt.DriverError, match=r"hipModuleLoadData failed: hipErrorNoBinaryForGpu \(209\)"):
        driver.load(0, b"image", "k", 0, 65536)
    assert lib.device == 2
    with pytest.raises(rt.DriverError, match=r"x failed: unknown \(7\)"):
        driver.check(7, "x")


def test_launch_packs_arguments_like_the_hip_launcher(fake_hip, tmp_path) -> None:
    _, driver = fake_hip
    image = b"\x7fELF" + bytes(64)
    (tmp_path / "k.hsaco").write_bytes(image)
    spec = {"function": "k", "params": [["x", "*fp16"], ["n", "i32"], ["s", "i64"], ["alpha", "bf16"],
                                        ["one", "i32"], ["BLOCK", "meta"]],
            "axes": [], "dtype_args": {}, "spec_params": ["x", "n", "s", "one"], "key": [], "variants": {}}
    kernel = rt.Kernel("k", spec, {}, backend=None)
    binary = {"function": "k", "shared": 1024, "warp_size": 64, "num_warps": 4, "spec": "Dxx1",
              "path": "k.hsaco", "sha256": hashlib.sha256(image).hexdigest()}
    launcher = rt._BinaryLauncher(kernel, binary, str(tmp_path / "k.hsaco"), 0, 65536)
    launcher.raw_stream = lambda device: 0xABC
    seen = {}

    def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        # the parameter block as the kernel sees it: x, n, s, alpha (the argument equal to 1 is compiled in),
        # then the global and profile scratch pointers
        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        seen["x"] = ctypes.cast(ptrs[0], ctypes.POINTER(ctypes.c_uint64))[0]
        seen["n"] = ctypes.cast(ptrs[1], ctypes.POINTER(ctypes.c_int32))[0]
        seen["s"] = ctypes.cast(ptrs[2], ctypes.POINTER(ctypes.c_int64))[0]
        seen["alpha"] = ctypes.cast(ptrs[3], ctypes.POINTER(ctypes.c_uint16))[0]
        seen["scratch"] = (ctypes.cast(ptrs[4], ctypes.POINTER(ctypes.c_uint64))[0],
                           ctypes.cast(ptrs[5], ctypes.POINTER(ctypes.c_uint64))[0])
        seen["launch"] = (fn, gx, gy, gz, bx, by, bz, shared, stream, extra)
        return 0

    driver.launch = launch
    launcher((7, 2), [0xDEAD0000, 1000, -(2**40), 1.5, 1])
    assert seen["x"] == 0xDEAD0000 and seen["n"] == 1000 and seen["s"] == -(2**40)
    assert seen["alpha"] == struct.unpack("<I", struct.pack("<f", 1.5))[0] >> 16  # bf16 of 1.5
    assert seen["scratch"] == (0, 0)
    # block = 64-wide wavefronts × num_warps; shared memory and torch's stream passed through
    assert seen["launch"] == (0x2000, 7, 2, 1, 256, 1, 1, 1024, 0xABC, None)
    driver.launch = lambda *a: 209
    with pytest.raises(rt.DriverError, match=r"launch of k \(grid 1x1x1, block 256\) failed: hipErrorNoBinaryForGpu"):
        launcher((1,), [0, 1, 1, 1.0, 1])


def test_function_attributes_read_registers_spills_and_threads_like_tritons_loader(fake_hip) -> None:
    # kernel.warmup(...).n_regs / n_spills / n_max_threads (the tutorial softmax sizes its grid from n_regs)
    lib, driver = fake_hip
    values = {4: 96, 3: 32, 0: 256}  # NUM_REGS, LOCAL_SIZE_BYTES (bytes: 8 spilled 4-byte registers), MAX_THREADS

    def get_attribute(ref, attr, fn):
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = values[attr]
        return 0

    lib.behaviour["hipFuncGetAttribute"] = get_attribute
    assert driver.function_attributes(0x2000) == (96, 8, 256)
    assert [args[1] for name, args in lib.calls if name == "hipFuncGetAttribute"] == [4, 3, 0]
    lib.behaviour["hipFuncGetAttribute"] = lambda ref, attr, fn: 209
    with pytest.raises(rt.DriverError, match=r"hipFuncGetAttribute failed: hipErrorNoBinaryForGpu"):
        driver.function_attributes(0x2000)


def test_launch_attributes_as_the_amd_launcher(fake_hip, tmp_path) -> None:
    """launch_cooperative_grid=True launches through hipModuleLaunchCooperativeKernel (Triton 3.6's AMD launcher
    does); launch_pdl has no AMD counterpart and launches as usual, as there."""
    lib, _ = fake_hip
    image = b"\x7fELF" + bytes(32)
    (tmp_path / "k.hsaco").write_bytes(image)
    spec = {"function": "k", "params": [["x", "*fp32"], ["n", "i32"]], "axes": [], "dtype_args": {},
            "spec_params": [], "key": [], "variants": {}}
    kernel = rt.Kernel("k", spec, {}, backend=None)
    binary = {"function": "k", "shared": 0, "warp_size": 64, "num_warps": 2, "spec": "", "path": "k.hsaco",
              "sha256": hashlib.sha256(image).hexdigest()}
    launcher = rt._BinaryLauncher(kernel, binary, str(tmp_path / "k.hsaco"), 0, 65536)
    launcher.raw_stream = lambda device: 0xABC
    for attrs, name in ((rt.tables.LAUNCH_ATTR_COOPERATIVE, "hipModuleLaunchCooperativeKernel"),
                        (rt.tables.LAUNCH_ATTR_PDL, "hipModuleLaunchKernel"),
                        (rt.tables.LAUNCH_ATTR_PDL | rt.tables.LAUNCH_ATTR_COOPERATIVE,
                         "hipModuleLaunchCooperativeKernel")):
        lib.calls.clear()
        launcher.with_attrs(attrs)((3, 2), [0x1000, 77])
        (called, args), = [c for c in lib.calls if c[0].startswith("hipModuleLaunch")]
        assert called == name and args[:9] == (0x2000, 3, 2, 1, 128, 1, 1, 0, 0xABC)
    assert launcher.with_attrs(1) is launcher.with_attrs(1) and launcher.attrs == 0
