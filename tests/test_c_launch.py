"""The C launch path (runtime/_fastlaunch.c) against the Python path, on the CPU with a fake libcuda.

Both paths launch through the same fake driver, which records what cuLaunchKernel receives; every comparison is
on those bytes: the parameter block for every scalar type (fp16/bf16 rounding, ranges), pointers, arguments
specialized to 1 dropped, scratch pointers, grid/block/shared memory/stream/context, and the errors a call
raises (the C path hands any call it cannot read exactly to the Python path, so its errors are the same).
"""

from __future__ import annotations

import importlib
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from forge_aot.extension import FILENAME, build_extension, compiler, native_arch
from tests import c_launch_support as cs
from tests.launcher_bytes import FakeLaunchEx

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler: the C launch path cannot be built")


def _kernel(rt, root, name, params, **kw):
    spec = cs.kernel_spec(root, name, params, **kw)
    return rt.Kernel(name, spec, cs.TARGETS, rt.BinaryBackend(str(root)))


def _launch_both(rt, fake, kernel, grid, args):
    """Launch once through the Python path and twice through the C path (the first C call registers); returns
    the launch records, and how many calls the C path left to Kernel.run."""
    records = []
    rt.fastpath.use_c_launch(kernel, False)
    kernel[grid](*args)
    records.append(fake.launch_record())
    assert rt.fastpath.use_c_launch(kernel, True)
    fallbacks = []
    kernel.run = lambda g, a, k: (fallbacks.append(1), type(kernel).run(kernel, g, a, k))[1]
    try:
        for _ in range(2):
            kernel[grid](*args)
            records.append(fake.launch_record())
    finally:
        del kernel.run
    return records, len(fallbacks)


def test_extension_is_abi3_reproducible_and_needs_only_old_glibc(tmp_path) -> None:
    a = build_extension(tmp_path / "a")
    b = build_extension(tmp_path / "b")
    assert a.path is not None and b.path is not None, a.note
    assert a.path.name == FILENAME and a.tag == b.tag
    arch = native_arch()
    assert a.tag == f"cp39-abi3-manylinux_2_17_{arch}.manylinux2014_{arch}"
    assert a.path.read_bytes() == b.path.read_bytes()  # no build id, no paths, no timestamps
    assert str(tmp_path).encode() not in a.path.read_bytes()


def test_extension_disabled_at_build_time(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FORGE_AOT_NO_C_LAUNCH", "1")
    ext = build_extension(tmp_path)
    assert ext.path is None and ext.tag == "py3-none-any" and "FORGE_AOT_NO_C_LAUNCH" in ext.note
    assert not list(tmp_path.iterdir())


def test_failed_compile_leaves_a_pure_python_wheel(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CC", "false")
    ext = build_extension(tmp_path)
    assert ext.path is None and ext.tag == "py3-none-any" and "failed" in ext.note


def test_runtime_without_the_extension_or_with_it_disabled_is_pure_python(rt, tmp_path) -> None:
    parent = str(rt.fastpath.__file__).rsplit("/", 2)[0]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import forge_ctest_rt as r; "
            "print(r.fastpath.c is None, r.Kernel.__mro__[1].__name__)")
    env_off = {"FORGE_NO_C_LAUNCH": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code, parent], capture_output=True, text=True, env=env_off, check=True)
    assert out.stdout.split() == ["True", "_PyKernelBase"]
    out = subprocess.run([sys.executable, "-c", code, parent], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.split() == ["False", "KernelBase"]
    # loaded straight from the file the build writes, as the import system would have loaded it
    assert rt.fastpath.FILENAME == FILENAME
    ext = sys.modules["forge_ctest_rt._fastlaunch"]
    assert rt.fastpath.c is ext is rt._fastlaunch and ext.__file__ == str(Path(parent, "forge_ctest_rt", FILENAME))
    assert type(ext.__spec__.loader).__name__ == "ExtensionFileLoader" and ext.__spec__.name == ext.__name__


SCALARS = {
    "i1": [0, 1, -1, 127, -128, True, 128],
    "i8": [0, 1, -128, 127, 128, -129],
    "i16": [0, 1, -32768, 32767, 32768],
    "i32": [0, 1, 16, -16, -17, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**70],
    "i64": [0, 1, 2**63 - 1, -(2**63), 2**63, 3 * 2**40],
    "u8": [0, 255, 256, -1],
    "u16": [0, 65535, 65536, -1],
    "u32": [0, 2**32 - 1, 2**32, -1],
    "u64": [0, 2**64 - 1, 2**63, 2**64, -1],
    "fp32": [0.0, -0.0, 1.5, 1e-45, 3.4028234663852886e38, 3.4028235677973366e38, 1e39, float("inf"),
             float("-inf"), float("nan"), 7, 2**200, 0.1],
    "fp64": [0.0, -0.0, 0.1, 1e308, float("inf"), float("nan"), 2**80, 5e-324],
    "fp16": [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e6, 6.0e-8, 2.98e-8, 2.9802322387695312e-08,
             5.960464477539063e-08, 8.940696716308594e-08, 6.103515625e-05, 6.1e-05, 1.0009765625, 1.00048828125,
             1.00146484375, float("inf"), float("-inf"), float("nan"), 3],
    "bf16": [0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.3895313892515355e38, 3.4e38, 1e39, float("inf"),
             float("nan"), 1e-40, 9],
}
NOT_NUMBERS = ["7", None, 1.5]  # 1.5 is not an integer: refused by struct for integer types


def _random_doubles(n: int) -> list[float]:
    rnd = random.Random(7)
    out = []
    for _ in range(n):
        bits = rnd.getrandbits(64)
        value = struct.unpack("<d", struct.pack("<Q", bits))[0]
        exp = rnd.uniform(-30, 20)
        out += [value, rnd.uniform(-1, 1) * 2.0**exp]
    return out


@pytest.mark.parametrize("ty", list(SCALARS))
def test_every_scalar_type_packs_byte_for_byte_like_struct(rt, fake, tmp_path, ty) -> None:
    """The C block equals the Python path's struct block, and every value the Python path refuses (struct.error,
    OverflowError) the C path leaves to it (pack() gives None)."""
    params = [["x_ptr", "*fp16"], ["a", "i8"], ["s", ty], ["b", "i16"], ["BLOCK", "meta"]]
    k = _kernel(rt, tmp_path, "k", params)
    (b,) = k.variants["base"]["targets"]["sm_90"]["configs"]["c"]["binaries"].values()
    launcher = rt._BinaryLauncher(k, b, str(tmp_path / b["path"]), 0, 232448)
    c_launcher = launcher.c_launcher()
    assert c_launcher is not None
    values = list(SCALARS[ty]) + NOT_NUMBERS
    if ty in ("fp16", "bf16", "fp32"):
        values += _random_doubles(300)
    for v in values:
        vals = [0xDEAD0010, -3, v, 300]
        buf = bytearray(launcher.packer.size)
        try:
            packed = list(vals)
            for i in launcher.bf16_pos:
                packed[i] = rt._pack_bf16(packed[i])
            launcher.packer.pack_into(buf, 0, *packed, 0, 0)
            want = bytes(buf)
        except (struct.error, OverflowError, TypeError):
            want = None
        got = c_launcher.pack(vals)
        if want is not None and got is None and isinstance(v, float) and v != v:
            continue  # NaN: left to the Python path (its payload rules vary across Python versions)
        assert got == want, (ty, v, got, want)


def test_layout_padding_pointers_and_dropped_ones(rt, fake, tmp_path) -> None:
    params = [["x_ptr", "*fp16"], ["n", "i32"], ["one", "i32"], ["alpha", "bf16"], ["s", "i64"], ["y_ptr", "*fp16"],
              ["h", "fp16"], ["z", "u8"], ["w", "fp64"], ["BLOCK", "meta"]]
    k = _kernel(rt, tmp_path, "mix", params, specs=["Dx1xD", "xxxxx"])
    x = _tensor(0, 64, 0)
    y = _tensor(0, 64, 16)  # address 16 bytes after an aligned one: still divisible by 16
    fake.block_size = 64
    fake.nparams = 10
    args = (x, 7, 1, 1.5, -(2**40), y, -2.5, 200, 1e300)
    records, fallbacks = _launch_both(rt, fake, k, (3, 2, 5), args)
    assert records[0] == records[1] == records[2] and fallbacks == 1
    _, grid, block, _, stream, ctx, params_bytes, offsets = records[0]
    assert grid == (3, 2, 5) and block == (128, 1, 1) and stream == 0x5EED0 and ctx == 0xC000
    # the binary "Dx1xD" was taken: 'one' compiled in, so 8 parameters + 2 scratch pointers
    assert offsets == (0, 8, 12, 16, 24, 32, 34, 40, 48, 56)
    assert struct.unpack_from("<Q", params_bytes, 0)[0] == x.data_ptr()
    assert struct.unpack_from("<i", params_bytes, 8)[0] == 7
    assert struct.unpack_from("<H", params_bytes, 12)[0] == 0x3FC0  # bf16(1.5)
    assert struct.unpack_from("<q", params_bytes, 16)[0] == -(2**40)
    assert struct.unpack_from("<Q", params_bytes, 24)[0] == y.data_ptr()
    assert struct.unpack_from("<e", params_bytes, 32)[0] == -2.5
    assert params_bytes[34] == 200 and struct.unpack_from("<d", params_bytes, 40)[0] == 1e300
    assert struct.unpack_from("<QQ", params_bytes, 48) == (0, 0)


def _tensor(device: int, n: int = 64, offset_bytes: int = 0, dtype=None):
    """A float tensor on a fake device whose data pointer is 16-byte aligned plus offset_bytes."""
    import torch

    dtype = dtype or torch.float16
    size = torch.tensor([], dtype=dtype).element_size()
    base = torch.empty(n + 64, dtype=dtype)
    skip = (-base.data_ptr() % 64 + offset_bytes) // size
    t = base[skip: skip + n]
    assert t.data_ptr() % 16 == offset_bytes % 16
    if device >= 0:
        cs.on(device, t)
    return t


ADD = [["x_ptr", "*T"], ["y_ptr", "*T"], ["out_ptr", "*T"], ["n", "i32"], ["BLOCK", "meta"]]


@pytest.fixture
def add(rt, fake, tmp_path):
    k = _kernel(rt, tmp_path, "add", ADD, dtypes={"T": ["fp16", "fp32"]}, key=["n"],
                specs=["DDDD", "DDD1", "DDDx", "xxxx"])
    fake.block_size = 48
    fake.nparams = 6
    return k


@pytest.mark.parametrize("n", [1, 16, 17, 4096, 2**31 - 1])
@pytest.mark.parametrize("misaligned", [False, True])
def test_calls_launch_the_same_binary_with_the_same_bytes(rt, fake, add, n, misaligned) -> None:
    import torch

    x, y, o = _tensor(0), _tensor(0, offset_bytes=2 if misaligned else 0), _tensor(0)
    if n == 1 and not misaligned:  # the binary DDD1 has n compiled in: 3 pointers and the 2 scratch pointers
        fake.block_size, fake.nparams = 40, 5
    records, fallbacks = _launch_both(rt, fake, add, (4,), (x, y, o, n))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert add._fast.spec((x, y, o, n)) == rt.argument_spec(add.spec_slots, [x.data_ptr(), y.data_ptr(),
                                                                             o.data_ptr(), n])
    # another dtype is another variant, resolved by the Python path once and then by C
    x32, y32, o32 = (_tensor(0, dtype=torch.float32) for _ in range(3))
    fake.block_size, fake.nparams = 48, 6
    records, fallbacks = _launch_both(rt, fake, add, [4, 1], (x32, y32, o32, n + 1 if n == 1 else n))
    assert records[0] == records[1] == records[2] and fallbacks == 1


def test_grid_forms(rt, fake, add) -> None:
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    seen = []
    grids = {
        "meta": lambda meta: (seen.append(("meta", meta["BLOCK"])) or (4096 // meta["BLOCK"], 2)),
        "named": lambda meta: (seen.append(("named", meta.get("n"))) or (meta["n"] // meta["BLOCK"],)),
        "list": [5, 1, 1],
        "tuple3": (2, 3, 4),
    }
    for name, grid in grids.items():
        seen.clear()
        records, fallbacks = _launch_both(rt, fake, add, grid, (x, y, o, 4096))
        assert records[0] == records[1] == records[2] and fallbacks == 1, name
    assert fake.grid[:] == [2, 3, 4]
    # a grid function reading an argument by name gets every argument, as from the Python path
    seen.clear()
    add[grids["named"]](x, y, o, 8192)  # new key: Python path, registered
    add[grids["named"]](x, y, o, 8192)
    assert seen == [("named", None), ("named", 8192)] * 2 and fake.grid[0] == 8
    # an empty grid launches nothing, on both paths
    calls = fake.calls
    add[(0,)](x, y, o, 4096)
    add[lambda meta: (0, 4)](x, y, o, 4096)
    assert fake.calls == calls
    # a grid function's own error propagates
    with pytest.raises(ZeroDivisionError):
        add[lambda meta: (1 // 0,)](x, y, o, 4096)


def test_a_grid_function_that_puts_an_argument_in_launches_it(rt, fake, tmp_path) -> None:
    """vLLM's causal_conv1d: its grid function sets ``META["batch_ptr"] = nums_dict[META["BLOCK_M"]]["batch_ptr"]``,
    and Triton launches what the grid leaves in the bound arguments; the runtime launched the tensor passed (the
    grid's dict was its own). A kernel whose launch sites do so (index ``grid_args``) reads them back, on the Python
    path (the C path leaves it alone); others keep the C path."""
    spec = cs.kernel_spec(tmp_path, "gridput", ADD, dtypes={"T": ["fp16"]}, key=["n"], specs=["DDDD", "xxxx"])
    spec["grid_args"] = ["y_ptr"]
    k = rt.Kernel("gridput", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))
    fake.block_size, fake.nparams = 48, 6
    x, y, o, other = (_tensor(0) for _ in range(4))
    seen = []

    def grid(meta):
        seen.append(meta["y_ptr"] is y)
        meta["y_ptr"] = other
        return (4096 // meta["BLOCK"],)

    for _ in range(3):  # the first call and those after it (which a remembered C launch would serve)
        k[grid](x, y, o, 4096)
        params = fake.launch_record()[6]
        assert struct.unpack_from("<Q", params, 8)[0] == other.data_ptr() != y.data_ptr()
        assert struct.unpack_from("<Q", params, 0)[0] == x.data_ptr() and fake.grid[0] == 4
    assert seen == [True] * 3 and k._fast is None
    assert rt.fastpath.plan(k) is None


def _error(fn):
    try:
        fn()
    except Exception as exc:
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("case", ["cpu", "meta", "two_devices", "not_a_tensor", "overflow", "float_for_int", "dtype",
                                  "mixed_dtypes", "missing_arg", "keyword_only", "numpy_like"])
def test_errors_are_the_python_paths(rt, fake, add, case) -> None:
    import torch

    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    add[(4,)](x, y, o, 4096)  # registered: the C path serves this kernel from now on
    assert add._fast.size() == 1
    calls = {
        "cpu": lambda: add[(4,)](x, torch.empty(64, dtype=torch.float16), o, 4096),
        "meta": lambda: add[(4,)](x, torch.empty(64, dtype=torch.float16, device="meta"), o, 4096),
        "two_devices": lambda: add[(4,)](x, _tensor(1), o, 4096),
        "not_a_tensor": lambda: add[(4,)](x, 12345, o, 4096),
        "overflow": lambda: add[(4,)](x, y, o, 2**31),
        "float_for_int": lambda: add[(4,)](x, y, o, 4096.0),
        "dtype": lambda: add[(4,)](*(_tensor(0, dtype=torch.bfloat16) for _ in range(3)), 4096),
        # the variant's dtype comes from x; y and out are *T too: Triton's JIT would compile another binary for a
        # float32 y, a packaged one would read its memory as fp16 (Liger's fp32 grad_output beside bf16 logits)
        "mixed_dtypes": lambda: add[(4,)](x, _tensor(0, dtype=torch.float32), o, 4096),
        "missing_arg": lambda: add[(4,)](x, y, o),
        "keyword_only": lambda: add[(4,)](x, y, o, n=4096, BLOCK=64),
        "numpy_like": lambda: add[(4,)](x, y, o, _Index(4096)),
    }
    with_c = _error(calls[case])
    rt.fastpath.use_c_launch(add, False)
    without = _error(calls[case])
    assert with_c == without
    if case != "numpy_like":
        assert with_c is not None
    if case in ("cpu", "meta"):  # (a meta tensor is named as such: mlstm_kernels' hunt read "a CPU tensor" there)
        assert with_c[0] is rt.UnsupportedDeviceError and f"{case.upper()} tensor" in with_c[1]
    if case == "mixed_dtypes":
        assert with_c == (rt.UnsupportedDtypeError, "add_kernel(): argument 'y_ptr' is fp32, and its binaries take "
                          "fp16 there (y_ptr: *T in the manifest; Triton's JIT would compile the call anew)")
    if case == "float_for_int":  # vLLM's unified attention: softcap=0 in the examples, a float where one is set
        assert with_c == (TypeError, "add_kernel(): n=4096.0 is a float, and this build took n as i32 (the values "
                          "the build saw were integers; Triton's JIT would compile the call anew): declare n = "
                          "\"fp32\" in the manifest's signature to build for floats")
    if case == "overflow":
        assert with_c == (OverflowError, "add_kernel(): n=2147483648 does not fit i32 (Triton's JIT would compile "
                          "the call anew; declare n = \"i64\" in the manifest's signature to build for such values)")


class _Index:
    """An integer-like object (as numpy integers are): struct takes it; the C path leaves it to Python."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v

    def __eq__(self, other: object) -> bool:
        return self.v == other

    def __hash__(self) -> int:
        return hash(self.v)

    def __mod__(self, m: int) -> int:
        return self.v % m

    def __gt__(self, other: int) -> bool:
        return self.v > other

    def __le__(self, other: int) -> bool:
        return self.v <= other

    def __ge__(self, other: int) -> bool:
        return self.v >= other


ARGS19 = [["out_ptr", "*fp32"], ["x_ptr", "*fp32"], ["y_ptr", "*fp32"], ["z_ptr", "*fp32"], ["w_ptr", "*fp32"],
          ["n", "i32"], *([f"a{i}", "fp32"] for i in range(4)), *([f"s{i}", "i32"] for i in range(9)),
          ["HAS_BIAS", "constexpr"], ["BLOCK", "constexpr"]]


@pytest.fixture
def args19(rt, fake, tmp_path):
    k = _kernel(rt, tmp_path, "args19", ARGS19, key=["n"], call_site={"HAS_BIAS": [False, True], "BLOCK": [512, 1024],
                                                                      "num_warps": [4, 8]},
                constexpr_defaults={"HAS_BIAS": False})
    fake.block_size = 5 * 8 + 4 + 4 * 4 + 9 * 4 + 2 * 8  # pointers, n, 4 floats, 9 ints, 2 scratch pointers
    fake.nparams = 21
    return k


def test_call_site_constexprs_and_launch_options_as_keywords(rt, fake, args19) -> None:
    t = [_tensor(0, dtype=__import__("torch").float32) for _ in range(5)]
    args = (*t, 4096, 1.0, 2.0, 3.0, 4.0, 1, 1, 1, 1, 0, 0, 0, 0, 0)
    for kwargs in ({"BLOCK": 1024}, {"BLOCK": 512, "num_warps": 8}, {"BLOCK": 1024, "HAS_BIAS": True, "num_warps": 4}):
        grid = lambda meta: (4096 // meta["BLOCK"],)  # the grid sees the call's BLOCK
        rt.fastpath.use_c_launch(args19, False)
        args19[grid](*args, **kwargs)
        want = fake.launch_record()
        rt.fastpath.use_c_launch(args19, True)
        args19[grid](*args, **kwargs)
        assert args19._fast.size() == 1
        before = fake.calls
        args19.run = lambda *a: pytest.fail("the C path should serve this call")
        try:
            args19[grid](*args, **kwargs)
        finally:
            del args19.run
        assert fake.calls == before + 1 and fake.launch_record() == want, kwargs
        assert want[1] == (4096 // kwargs["BLOCK"], 1, 1)
    # the Python path binds or refuses every other keyword, with or without the C path
    errors = {}
    for use_c in (True, False):
        rt.fastpath.use_c_launch(args19, use_c)
        args19[(8,)](*args, BLOCK=512)
        errors[use_c] = [_error(lambda kw=kw: args19[(8,)](*args, **kw)) for kw in (
            {}, {"BLOCK": 256}, {"BLOCK": 512, "num_warps": 2}, {"BLOCK": 512, "bogus": 1},
            {"BLOCK": 512, "num_ctas": 1}, {"BLOCK": 512, "num_ctas": 2}, {"BLOCK": [512]})]
    assert errors[True] == errors[False]
    assert errors[True][0][0] is TypeError and "missing the constexpr argument 'BLOCK'" in errors[True][0][1]
    assert errors[True][1][0] is rt.NotBuiltError and errors[True][4] is None


@pytest.mark.parametrize("declared", [True, False])
def test_launch_attributes_reach_cuLaunchKernelEx(rt, fake, fake_lib, tmp_path, declared) -> None:
    """launch_pdl / launch_cooperative_grid at the call: the same binary and parameter block, launched through
    cuLaunchKernelEx with Triton's attributes (6: programmatic stream serialization, 2: cooperative; value 1), on
    both paths; the C path serves such calls once the build declared the flags (the host code passes them)."""
    ex = FakeLaunchEx.in_dll(fake_lib, "fake_ex")
    k = _kernel(rt, tmp_path, f"pdl{declared}", ADD, specs=["DDDD", "xxxx"], key=["n"])
    if declared:
        k = rt.Kernel(k.name, {**k.spec, "launch_flags": ["launch_pdl", "launch_cooperative_grid"]}, cs.TARGETS,
                      rt.BinaryBackend(str(tmp_path)))
    fake.block_size, fake.nparams = 48, 6
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    k[(4,)](x, y, o, 4096)
    plain, ex_calls = fake.launch_record(), ex.calls
    cases = [({"launch_pdl": True}, [6]), ({"launch_cooperative_grid": True}, [2]),
             ({"launch_pdl": True, "launch_cooperative_grid": True}, [6, 2]), ({"launch_pdl": False}, [])]
    for use_c in (False, True):
        rt.fastpath.use_c_launch(k, use_c)
        for kwargs, ids in cases:
            for _ in range(3):  # the first call resolves on the Python path, the next ones may take the C path
                before = fake.calls
                k[(4,)](x, y, o, 4096, **kwargs)
                assert fake.calls == before + 1 and fake.launch_record() == plain, kwargs
                if ids:
                    ex_calls += 1
                    assert ex.calls == ex_calls and list(ex.ids[: ex.n_attrs]) == ids, kwargs
                    assert list(ex.values[: ex.n_attrs]) == [1] * len(ids)
                else:
                    assert ex.calls == ex_calls, kwargs
        if use_c and declared:
            k.run = lambda *a: pytest.fail("the C path should serve this call")
            try:
                k[(4,)](x, y, o, 4096, launch_pdl=True)
                k[(4,)](x, y, o, 4096)
            finally:
                del k.run
            assert ex.calls == ex_calls + 1
            ex_calls += 1
    assert (k._fast is not None and k._fast.size() >= 3) if declared else True
    # a driver without cuLaunchKernelEx: the C launcher refuses such calls, the Python path says why
    drv = rt.drivers.driver()
    drv._late.pop("cuLaunchKernelEx", None)
    drv = drv.__dict__.get("_with_ctypes", drv)  # (the C driver hands cuLaunchKernelEx to its ctypes driver)
    real = drv.lib
    drv.lib = type("NoEx", (), {"__getattr__": lambda self, name: (_ for _ in ()).throw(AttributeError(name))
                                if name == "cuLaunchKernelEx" else getattr(real, name)})()
    try:
        rt.fastpath.use_c_launch(k, False)
        with pytest.raises(rt.DriverError, match="no cuLaunchKernelEx"):
            k[(4,)](x, y, o, 4096, launch_pdl=True)
    finally:
        drv.lib = real


@pytest.mark.parametrize("declared", [True, False])
def test_a_heuristic_reads_the_value_the_call_passes(rt, fake, tmp_path, declared) -> None:
    """Unsloth's ``"DO_SOFTCAPPING": lambda args: bool(args["DO_SOFTCAPPING"])``: the call passes the parameter, the
    heuristic reads that value and its own wins; the binary follows it on both paths, and the C path serves such
    calls once the build declared the name (``call_heuristics``: host code passes it)."""
    name = f"coerce{declared}"
    spec = cs.kernel_spec(tmp_path, name, [*ADD[:4], ["BLOCK", "meta"], ["FLAG", "heuristic"]], specs=["xxxx"])
    binaries = {}
    for flag in (True, False):
        b = cs.binary(tmp_path, name, f"xxxx-{flag}", heur={"FLAG": flag})
        b["spec"] = "xxxx"
        binaries[f"xxxx-{flag}"] = b
    spec["variants"]["base"]["targets"]["sm_90"]["configs"]["c"]["binaries"] = binaries
    if declared:
        spec["call_heuristics"] = ["FLAG"]
    k = rt.Kernel(name, spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))
    k.add_heuristics({"FLAG": lambda nargs: bool(nargs["FLAG"])})
    fake.block_size, fake.nparams = 48, 6
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    functions = {}
    for use_c in (False, True):
        rt.fastpath.use_c_launch(k, use_c)
        for passed in (1, 0, 2.5, ""):
            k[(4,)](x, y, o, 4096, FLAG=passed)
            functions.setdefault(bool(passed), set()).add(fake.function)
            if use_c and declared:  # resolved once: from now on the C path's
                k.run = lambda *a: pytest.fail("the C path should serve this call")
                try:
                    k[(4,)](x, y, o, 4096, FLAG=passed)
                finally:
                    del k.run
        with pytest.raises(KeyError, match="FLAG"):  # not passed: the heuristic's own KeyError, as in Triton
            k[(4,)](x, y, o, 4096)
    assert len(functions[True]) == len(functions[False]) == 1 and functions[True] != functions[False]


def test_launches_skip_stays_in_python_and_pre_hooks_run_once_per_call_from_c(rt, fake, add, tmp_path) -> None:
    """LAUNCHES.skip (the custom op's meta path) is the Python path's. A config pre-hook (``init_to_zero`` and the
    like) runs once per call on both paths, on the arguments by name with the config's values, before the launch;
    from the second call on the C path runs it (until session 33 every call of such a kernel took the Python path);
    the launches are byte for byte the Python path's."""
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    add[(4,)](x, y, o, 4096)
    calls = fake.calls
    rt.kernel.LAUNCHES.skip = True
    try:
        add[(4,)](x, y, o, 4096)  # the custom op's meta path: bound, not launched
    finally:
        rt.kernel.LAUNCHES.skip = False
    assert fake.calls == calls
    hooked = _kernel(rt, tmp_path, "hooked", ADD, specs=["xxxx"], pre_hook="zero")
    ran = []
    hooked.pre_hooks["zero"] = lambda nargs: ran.append((nargs["n"], nargs["BLOCK"], fake.calls))
    fake.block_size, fake.nparams = 48, 6
    records, fallbacks = _launch_both(rt, fake, hooked, (1,), (x, y, o, 5))
    assert records[0] == records[1] == records[2] and fallbacks == 1 and hooked._fast is not None
    # once per call, each before its own launch
    assert [(n, b) for n, b, _ in ran] == [(5, 1024)] * 3 and [c for *_, c in ran] == [calls + i for i in range(3)]
    # a hook that raises stops the call before any launch, on the C path too
    assert hooked._fast.size() == 1
    boom = []
    hooked.pre_hooks["zero"] = lambda nargs: 1 / 0 if boom else None
    rt.fastpath.use_c_launch(hooked, True)
    hooked[(1,)](x, y, o, 5)  # the Python path, remembered with this hook
    launched = fake.calls
    boom.append(1)
    with pytest.raises(ZeroDivisionError):
        hooked[(1,)](x, y, o, 5)
    assert fake.calls == launched and hooked._fast.size() == 1


def _guard(rt, op, named):
    """A custom op's guard (runtime/guard.py) keeping the storages of ``named`` (name -> tensor)."""
    guard_mod = importlib.import_module(f"{rt.__name__}.guard")
    ranges = []
    for t in named.values():
        st = t.untyped_storage()
        ranges += [st.data_ptr(), st.data_ptr() + st.nbytes()]
    g = guard_mod.Guard(ranges)
    g.ops, g.call = (op,) * len(named), [(op, list(named), tuple(named.values()), {})]
    return g


@pytest.mark.parametrize("c_path", [True, False])
def test_a_custom_ops_guard_refuses_a_write_into_a_kept_argument(rt, fake, add, tmp_path, c_path) -> None:
    """While a custom op's real implementation runs, LAUNCHES.skip holds its guard: a launch whose kernel writes
    through a pointer (the index's ``writes``) into a kept argument's storage is refused before it runs, naming the
    op, kernel, parameter and argument; one that only reads a kept argument launches, from C without the Python
    path; a kernel the index gives no writes launches under any guard."""
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    view_of_o = o[8:]  # a view: the same storage, another address
    cs.on(0, view_of_o)
    spec = cs.kernel_spec(tmp_path, "w", ADD, specs=["xxxx"])
    spec["writes"] = ["out_ptr"]  # what the index says the kernel writes through: its positions, read once
    assert rt.Kernel("w", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path))).written_pos == (2,)
    add.written_pos = (2,)
    assert rt.fastpath.use_c_launch(add, c_path) == c_path
    add[(4,)](x, y, o, 4096)  # registered on the C path
    fallbacks = []
    add.run = lambda g, a, k: (fallbacks.append(1), type(add).run(add, g, a, k))[1]
    try:
        rt.kernel.LAUNCHES.skip = _guard(rt, "forge_test.add_op", {"x": x, "y": y})
        calls = fake.calls
        add[(4,)](x, y, o, 4096)
        assert fake.calls == calls + 1 and len(fallbacks) == (0 if c_path else 1)
        rt.kernel.LAUNCHES.skip = _guard(rt, "forge_test.add_op", {"x": x, "out": o})
        for target in (o, view_of_o):
            with pytest.raises(rt.ForgeRuntimeError, match=r"forge_test\.add_op: kernel add_kernel would write "
                               r"argument out \(through its parameter out_ptr\), which the op's custom op says it "
                               r"does not write; nothing was launched.*shape \(64,\), strides \(1,\)"):
                add[(4,)](x, y, target, 4096 if target is o else 56)
        assert fake.calls == calls + 1
        # nested custom ops: the refusal names the op that keeps the argument
        guard_mod = importlib.import_module(f"{rt.__name__}.guard")
        rt.kernel.LAUNCHES.skip = guard_mod._joined(_guard(rt, "forge_test.outer", {"out": o}),
                                                    _guard(rt, "forge_test.inner", {"x": x}))
        with pytest.raises(rt.ForgeRuntimeError, match=r"^forge_test\.outer: kernel add_kernel would write argument "
                                                       r"out"):
            add[(4,)](x, y, o, 4096)
        assert fake.calls == calls + 1
        # a kernel the index gives no writes launches under any guard, from C without the Python path
        add.written_pos = ()
        rt.fastpath.use_c_launch(add, c_path)
        add[(4,)](x, y, o, 4096)  # registered again (the C path's cache is new)
        fallbacks.clear()
        add[(4,)](x, y, o, 4096)
        assert fake.calls == calls + 3 and len(fallbacks) == (0 if c_path else 1)
    finally:
        rt.kernel.LAUNCHES.skip = False
        del add.run
    # no guard: the same calls launch as ever
    add.written_pos = (2,)  # the index's writes: out_ptr
    rt.fastpath.use_c_launch(add, c_path)
    add[(4,)](x, y, o, 4096)
    assert fake.calls == calls + 4


@pytest.mark.parametrize("c_path", [True, False])
def test_a_guard_refuses_before_the_configs_pre_hook_runs(rt, fake, tmp_path, c_path) -> None:
    """A config pre-hook writes too (``init_to_zero``): under a guard, a launch that would write a kept argument is
    refused before the pre-hook runs, on both paths."""
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    hooked = _kernel(rt, tmp_path, "hooked", ADD, specs=["xxxx"], pre_hook="zero")
    hooked.written_pos = (2,)  # out_ptr
    ran = []
    hooked.pre_hooks["zero"] = lambda nargs: ran.append(nargs["out_ptr"].zero_())
    fake.block_size, fake.nparams = 48, 6
    assert rt.fastpath.use_c_launch(hooked, c_path) == c_path
    hooked[(1,)](x, y, o, 5)  # the Python path, remembered for the C path
    hooked[(1,)](x, y, o, 5)
    assert len(ran) == 2
    calls, before = fake.calls, o.clone()
    o.fill_(3)
    rt.kernel.LAUNCHES.skip = _guard(rt, "forge_test.hooked_op", {"out": o})
    try:
        with pytest.raises(rt.ForgeRuntimeError, match="would write argument out"):
            hooked[(1,)](x, y, o, 5)
    finally:
        rt.kernel.LAUNCHES.skip = False
    assert len(ran) == 2 and fake.calls == calls and bool((o == 3).all()) and before.shape == o.shape


def _heuristics_kernel(rt, fake, tmp_path, name):
    """add with two heuristics (EVEN from n; HALF from EVEN, which it reads by name) and a binary per EVEN."""
    params = [*ADD[:4], ["BLOCK", "meta"], ["EVEN", "heuristic"], ["HALF", "heuristic"]]
    spec = cs.kernel_spec(tmp_path, name, params, specs=["xxxx"])
    binaries = {}
    for even in (True, False):
        b = cs.binary(tmp_path, name, f"xxxx-{even}", heur={"EVEN": even, "HALF": 512})
        b["spec"] = "xxxx"
        binaries[f"xxxx-{even}"] = b
    spec["variants"]["base"]["targets"]["sm_90"]["configs"]["c"]["binaries"] = binaries
    k = rt.Kernel(name, spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))
    seen = []
    k.add_heuristics({"EVEN": lambda nargs: (seen.append(sorted(nargs)), nargs["n"] % 2 == 0)[1]})
    k.add_heuristics({"HALF": lambda nargs: nargs["BLOCK"] // 2 if nargs["EVEN"] in (True, False) else None})
    fake.block_size, fake.nparams = 48, 6
    return k, seen


def test_heuristics_kernels_take_the_c_path(rt, fake, tmp_path) -> None:
    """A kernel with @triton.heuristics: the C path calls the heuristics on the same arguments by name the Python
    path gives them (runtime arguments, call-site values, the config's keyword arguments, earlier heuristics'
    values), launches the binary the Python path resolved for those values with the same bytes and grid (a grid
    function sees the heuristic values), and leaves values it has not seen to the Python path, once each."""
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    k, seen = _heuristics_kernel(rt, fake, tmp_path, "heurc")
    assert k._fast is not None
    grids, handed = [], []
    launch = k.backend.launch  # every launch of the Python path, the C path's hand-overs included
    k.backend.launch = lambda *a: (handed.append(a[4][3]), launch(*a))[1]

    def grid(meta):
        grids.append((meta["EVEN"], meta["HALF"], meta["BLOCK"]))
        return (3 if meta["EVEN"] else 5,)

    for n in (4096, 4095):
        records, fallbacks = _launch_both(rt, fake, k, grid, (x, y, o, n))
        assert records[0] == records[1] == records[2] and fallbacks == 1
        assert records[0][1] == ((3 if n % 2 == 0 else 5), 1, 1)
    # each call called each heuristic once, on the same names in both paths
    assert len(seen) == 6 and all(names == seen[0] for names in seen)
    assert set(seen[0]) == {"x_ptr", "y_ptr", "out_ptr", "n", "BLOCK", "num_warps", "num_ctas", "num_stages"}
    assert grids[-1] == (False, 512, 1024)
    # remembered now: n = 4095 (EVEN False, n not divisible by 16; switching paths in _launch_both forgot 4096).
    # n = 4096 (another specialization) is new to the C path: the Python path takes it whole. An even n not divisible
    # by 16 reads as 4095 does but gives new heuristic values: the C path calls the heuristics and hands the launch to
    # the Python path from there (BinaryBackend.launch), which remembers them; every call calls each heuristic once
    calls = []
    k.run = lambda g, a, kw: (calls.append(a[3]), type(k).run(k, g, a, kw))[1]
    seen.clear()
    handed.clear()
    try:
        for n in (10, 11, 12, 10, 11, 12, 4096, 4095):
            k[grid](x, y, o, n)
    finally:
        del k.run
    assert calls == [4096] and handed == [10, 4096] and len(seen) == 8
    # a grid function that reads an argument by name gets the arguments with the heuristic values
    named = []
    k[lambda nargs: (named.append((nargs["n"], nargs["EVEN"])), (1,))[1]](x, y, o, 7)
    assert named == [(7, False)]


def test_heuristics_see_this_calls_call_site_values(rt, fake, tmp_path) -> None:
    """The heuristics see the call-site values this call passed (the objects and their order, as Kernel._bind
    gives them), not the ones of the call that was remembered: A=True after A=1 (equal, so the same cache entry)
    picks the binary the Python path picks."""
    params = [*ADD[:4], ["BLOCK", "meta"], ["A", "constexpr"], ["B", "constexpr"], ["EVEN", "heuristic"]]
    spec = cs.kernel_spec(tmp_path, "callsite", params, specs=["xxxx"], call_site={"A": [1], "B": [2]})
    binaries = {}
    for even in (True, False):
        b = cs.binary(tmp_path, "callsite", f"xxxx-{even}", heur={"EVEN": even})
        b["spec"] = "xxxx"
        binaries[str(even)] = b
    spec["variants"]["A=1,B=2"]["targets"]["sm_90"]["configs"]["c"]["binaries"] = binaries
    k = rt.Kernel("callsite", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))
    seen = []
    k.add_heuristics({"EVEN": lambda nargs: (seen.append([(n, type(nargs[n])) for n in nargs if n in "AB"]),
                                             nargs["A"] is True)[1]})
    fake.block_size, fake.nparams = 48, 6
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    k[(1,)](x, y, o, 4096, B=2, A=1)  # the Python path: EVEN False, remembered
    k[(1,)](x, y, o, 4096, B=2, A=1)  # now the C path
    assert k._fast.size() == 1
    k[(1,)](x, y, o, 4096, A=True, B=2)  # EVEN True, new to the C path: the Python path, then remembered
    k[(1,)](x, y, o, 4096, A=True, B=2)  # the C path
    c_launch = fake.launch_record()
    rt.fastpath.use_c_launch(k, False)
    k[(1,)](x, y, o, 4096, A=True, B=2)
    assert fake.launch_record() == c_launch
    assert seen[:2] == [[("B", int), ("A", int)]] * 2
    # once per call, also where the C path hands a new EVEN value to the Python path (session 32: 4 for 3 calls)
    assert seen[2:] == [[("A", bool), ("B", int)]] * 3


def test_a_heuristic_added_twice_or_refused_never_breaks_a_call(rt, fake, tmp_path) -> None:
    """Two heuristics for one parameter (a host module run twice on the same handles) and a refused
    add_heuristics (an unknown name: nothing is added) leave every call working: they launch."""
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    params = [*ADD[:4], ["BLOCK", "meta"], ["EVEN", "heuristic"]]
    k = _kernel(rt, tmp_path, "twice", params, specs=["xxxx"], binary_fields={"heur": {"EVEN": True}})
    even = lambda nargs: nargs["n"] % 2 == 0
    k.add_heuristics({"EVEN": even})
    with pytest.raises(rt.ForgeRuntimeError, match="BOGUS"):
        k.add_heuristics({"EVEN": even, "BOGUS": even})
    assert len(k.heuristics) == 1
    k.add_heuristics({"EVEN": even})
    fake.block_size, fake.nparams = 48, 6
    before = fake.calls
    for _ in range(3):
        k[(1,)](x, y, o, 4096)
    assert fake.calls == before + 3


def test_heuristics_errors_are_the_python_paths(rt, fake, tmp_path) -> None:
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    k, _ = _heuristics_kernel(rt, fake, tmp_path, "heurerr")
    k[(1,)](x, y, o, 8)
    k[(1,)](x, y, o, 8)
    assert k._fast.size() == 1
    k.heuristics[0] = ("EVEN", lambda nargs: 1 / 0)
    rt.fastpath.use_c_launch(k, True)  # re-read with the failing heuristic
    errors = []
    for use_c in (True, False):
        rt.fastpath.use_c_launch(k, use_c)
        with pytest.raises(ZeroDivisionError) as info:
            k[(1,)](x, y, o, 8)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_calls_left_to_python_still_launch_through_the_c_launcher(rt, fake, tmp_path, monkeypatch) -> None:
    """A call the C path leaves to Python (a first call: nothing remembered yet) binds in Python and launches
    through the C launcher: the driver gets the bytes the pure-Python launch gives it, no ctypes launch runs, and
    a value the C launcher leaves to Python (a NaN float) still launches, through ctypes."""
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    params = [*ADD[:4], ["s", "fp32"], ["BLOCK", "meta"]]
    fake.block_size, fake.nparams = 48, 6
    k = _kernel(rt, tmp_path, "kw_c", params, specs=["xxxx"])
    python_launches = []
    original = rt._BinaryLauncher.__call__
    monkeypatch.setattr(rt._BinaryLauncher, "__call__",
                        lambda self, grid, values: (python_launches.append(1), original(self, grid, values))[1])
    records = {}
    for use_c in (True, False):
        k._c_launch = use_c
        k._fast.clear()
        k[(3,)](x, y, o, n=17, s=2.5)
        records[use_c] = fake.launch_record()
    assert records[True] == records[False] and python_launches == [1]
    k._c_launch = True
    k._fast.clear()
    k[(3,)](x, y, o, n=17, s=2.5)
    assert k._fast.size() == 1  # a call by keyword is remembered for the C path like a positional one
    ((launcher,),) = [list(state.launchers.values()) for state in k._states.values()]
    assert launcher.c_launcher() is not None
    k._c_launch = True
    k[(3,)](x, y, o, n=17, s=float("nan"))  # NaN: the C launcher leaves it to ctypes, which launches it
    assert python_launches == [1, 1]
    nan_block = fake.launch_record()[6]
    assert struct.unpack_from("<f", nan_block, 28)[0] != struct.unpack_from("<f", nan_block, 28)[0]


@pytest.mark.parametrize("nint,ones", [(63, 2), (64, 1), (65, 2)])
def test_many_arguments_some_dropped_launch_alike(rt, fake, tmp_path, nint, ones) -> None:
    """Beyond 64 runtime arguments the C path refuses the kernel; a binary with arguments specialized to 1 can
    still keep 64 or fewer, at positions beyond 64: its C launcher must refuse them too (it once wrote past its
    stack array), and the launch goes through ctypes with the same bytes."""
    params = [["x_ptr", "*fp16"]] + [[f"a{i}", "i32"] for i in range(nint)] + [["BLOCK", "meta"]]
    k = _kernel(rt, tmp_path, "big", params, specs=["x" + "1" * ones + "x" * (nint - ones)])
    fake.block_size, fake.nparams = (8 + 4 * (nint - ones) + 7) // 8 * 8 + 16, 1 + nint - ones + 2
    args = [_tensor(0)] + [1] * ones + [0x11110000 + i for i in range(ones, nint)]
    records = {}
    for use_c in (False, True):
        k._c_launch = use_c
        k[(3, 1, 1)](*args)
        records[use_c] = fake.launch_record()
    assert records[False] == records[True]
    ((launcher,),) = [list(state.launchers.values()) for state in k._states.values()]
    assert (launcher.c_launcher() is None) == (nint + 1 > 64)


def test_parameter_block_layout_matches_ctypes(rt, fake, tmp_path) -> None:
    """The launcher computes the C layout itself (no ctypes types unless the Python launch runs): the same
    offsets and size as the ctypes structure, for every scalar type between pointers."""
    for ty in SCALARS:
        params = [["x_ptr", "*fp16"], ["a", "i8"], ["s", ty], ["b", "i16"], ["c", ty], ["BLOCK", "meta"]]
        k = _kernel(rt, tmp_path / ty, "lay", params)
        (b,) = k.variants["base"]["targets"]["sm_90"]["configs"]["c"]["binaries"].values()
        launcher = rt._BinaryLauncher(k, b, str(tmp_path / ty / b["path"]), 0, 232448)
        assert "args_type" not in vars(launcher)
        offsets, size = list(launcher.offsets), launcher.block_size
        import ctypes

        assert ctypes.sizeof(launcher.args_type) == size  # args_type checks the offsets when it is made
        assert offsets == launcher.offsets and launcher.packer.size <= size


def test_backends_that_change_the_launch_keep_the_generic_path(rt, tmp_path) -> None:
    class Tuning(rt.BinaryBackend):
        def launch(self, *args):
            return super().launch(*args)

    spec = cs.kernel_spec(tmp_path, "t", ADD)
    assert rt.Kernel("t", spec, cs.TARGETS, Tuning(str(tmp_path)))._fast is None
    assert rt.Kernel("t", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))._fast is not None
    assert rt.Kernel("t", spec, cs.TARGETS, None)._fast is None

    class Traced(rt.Kernel):
        def run(self, grid, args, kwargs):
            return None

    assert Traced("t", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))._fast is None


def test_context_push_pop_and_driver_errors(rt, fake, add) -> None:
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    add[(4,)](x, y, o, 4096)
    fake.pushes = fake.pops = 0
    # a thread with another context current: pushed, launched under the device's primary context, popped
    fake.current = 0xABC
    for use_c in (True, False):
        rt.fastpath.use_c_launch(add, use_c)
        add[(4,)](x, y, o, 4096)
        add[(4,)](x, y, o, 4096)
        assert fake.ctx_at_launch == 0xC000 and fake.current == 0xABC and fake.depth == 0
    assert fake.pushes == fake.pops == 4
    results = {}
    for setting, code in (("launch_result", 700), ("push_result", 201)):
        for use_c in (True, False):
            rt.fastpath.use_c_launch(add, use_c)
            fake.current = 0xC000
            add[(4,)](x, y, o, 4096)  # the C path registers it
            fake.current = 0xABC if setting == "push_result" else 0xC000
            setattr(fake, setting, code)
            results[(setting, use_c)] = _error(lambda: add[(4,)](x, y, o, 4096))
            setattr(fake, setting, 0)
    assert results[("launch_result", True)] == results[("launch_result", False)] == (
        rt.DriverError, "launch of add_kernel (grid 4x1x1, block 128) failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)")
    assert results[("push_result", True)] == results[("push_result", False)] == (
        rt.DriverError, "cuCtxPushCurrent failed: CUDA_ERROR_INVALID_CONTEXT (201)")


@pytest.mark.parametrize("c_driver", [True, False], ids=["c-driver", "ctypes-driver"])
def test_both_drivers_load_launch_and_name_errors_alike(rt, fake_lib, add, monkeypatch, c_driver) -> None:
    """The runtime opens the driver through the C extension's Driver (no ctypes prototypes on a first launch);
    the ctypes driver stays for a runtime without the extension. Both push the primary context, load, launch, pop
    and turn driver codes into the same DriverError."""
    cs.fake_devices(monkeypatch)
    fake = cs.install_fake_driver(rt, fake_lib, monkeypatch, c_driver=c_driver)
    drv = rt.drivers.driver()
    assert type(drv).__name__ == ("_CudaDriverC" if c_driver else "_CudaDriver")
    assert drv.describe(1) == {"name": "Fake GPU", "capability": (9, 0), "arch": "sm_90", "max_shared": 232448}
    assert drv.device_count() == 2 and drv.primary_context(1) == 0xC001
    assert drv.function_attributes(0xF001) == (0, 0, 0)
    fake.current = 0xABC
    fn = drv.load(1, b"\x7fELF image", "add_kernel", 100_000, 232448)  # above 48 KB: opted in, as Triton does
    assert fn == 0xF001 and fake.loads == 1 and fake.pushes == fake.pops == 1 and fake.current == 0xABC
    assert set(drv.entry_points()) == {"launch", "ctx_get", "ctx_push", "ctx_pop", "launch_ex", "tensor_map"}
    assert all(drv.entry_points().values())
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    for use_c in (True, False):  # the C launcher and the ctypes launch (the C driver sets up ctypes then)
        rt.fastpath.use_c_launch(add, use_c)
        add[(4,)](x, y, o, 4096)
        assert fake.ctx_at_launch == 0xC000 and fake.current == 0xABC
    for setting, call in (("push_result", "cuCtxPushCurrent"), ("pop_result", "cuCtxPopCurrent")):
        setattr(fake, setting, 201)
        try:
            with pytest.raises(rt.DriverError, match=rf"^{call} failed: CUDA_ERROR_INVALID_CONTEXT \(201\)$"):
                drv.load(0, b"\x7fELF image", "add_kernel", 0, 232448)
        finally:
            setattr(fake, setting, 0)
    with pytest.raises(rt.DriverError, match=r"^cuDeviceGet failed: unknown \(999\)$"):
        drv.check(999, "cuDeviceGet")


def test_a_missing_driver_library_is_named(rt) -> None:
    cuda = importlib.import_module(f"{rt.__name__}.cuda")
    with pytest.raises(rt.DriverError, match=r"cannot load the NVIDIA driver library libnocuda\.so\.9"):
        cuda.open_driver("libnocuda.so.9")


def test_second_device_uses_its_context_and_stream(rt, fake, add) -> None:
    x, y, o = _tensor(1), _tensor(1), _tensor(1)
    records, fallbacks = _launch_both(rt, fake, add, (4,), (x, y, o, 4096))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert records[0][4] == 0x5EED1 and records[0][5] == 0xC001  # device 1's stream and primary context


def test_scratch_buffers_are_allocated_per_launch(rt, fake, tmp_path, monkeypatch) -> None:
    import torch

    allocated = []

    def scratch(torch_mod, device, raw_stream, size, programs):
        buf = torch.empty(programs * size + 256, dtype=torch.uint8)
        allocated.append((device, size, programs))
        return buf, (buf.data_ptr() + 255) // 256 * 256

    monkeypatch.setattr(rt.launch, "scratch_buffer", scratch)
    k = _kernel(rt, tmp_path, "scr", ADD, specs=["xxxx"],
                binary_fields={"global_scratch_size": 128, "profile_scratch_size": 64})
    fake.block_size = 48
    fake.nparams = 6
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    rt.fastpath.use_c_launch(k, False)
    k[(3, 2)](x, y, o, 10)
    rt.fastpath.use_c_launch(k, True)
    k[(3, 2)](x, y, o, 10)
    k[(3, 2)](x, y, o, 10)
    assert allocated == [(0, 128, 6), (0, 64, 6)] * 3
    gs, ps = struct.unpack_from("<QQ", bytes(fake.params[:48]), 32)
    assert gs and ps and gs % 256 == 0 and ps % 256 == 0 and k._fast.size() == 1


def test_set_allocator_serves_global_scratch(rt, fake, tmp_path) -> None:
    """Host code's ``triton.set_allocator`` (in-kernel tensor descriptors need it under the JIT) allocates the
    wheel's global scratch too: called with (programs × size, alignment, the device's stream), on both paths."""
    import torch

    calls = []

    class Buffer:
        def __init__(self, size: int) -> None:
            self.tensor = torch.empty(size + 512, dtype=torch.uint8)

        def data_ptr(self) -> int:
            return (self.tensor.data_ptr() + 511) // 512 * 512

    def allocator(size, alignment, stream):
        calls.append((size, alignment, stream))
        return Buffer(size)

    k = _kernel(rt, tmp_path, "alloc", ADD, specs=["xxxx"], binary_fields={"global_scratch_size": 128})
    fake.block_size = 48
    fake.nparams = 6
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    rt.host_triton.set_allocator(allocator)
    try:
        rt.fastpath.use_c_launch(k, False)
        k[(3, 2)](x, y, o, 10)
        rt.fastpath.use_c_launch(k, True)
        k[(3, 2)](x, y, o, 10)
        gs = struct.unpack_from("<Q", bytes(fake.params[:48]), 32)[0]
        assert calls == [(6 * 128, 256, 0x5EED0)] * 2 and gs % 512 == 0 and gs

        rt.host_triton.set_allocator(lambda size, alignment, stream: Buffer(size).tensor[1:])
        with pytest.raises(rt.ForgeRuntimeError, match="not 256-byte aligned"):
            k[(3, 2)](x, y, o, 10)
    finally:
        rt.host_triton.set_allocator(None)


def test_cache_is_bounded_and_threads_share_it(rt, fake, add) -> None:
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    for n in range(1, 4200):
        add._fast.register((x, y, o, n), {}, _any_launcher(rt, add, x, y, o, n), {}, None,
                           add._fast.spec((x, y, o, n)))
    assert add._fast.size() <= 4096
    add._fast.clear()
    errors = []

    def work():
        try:
            for _ in range(200):
                add[(4,)](x, y, o, 4096)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and add._fast.size() == 1


def _any_launcher(rt, kernel, *args):
    state = kernel._state(args, {})
    config = state.table.lookup((args[-1],))
    values = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in args]
    spec = rt.argument_spec(kernel.spec_slots, values)
    return kernel.backend.launcher_for(kernel, state, config, (), spec, args).c_launcher()


OPTIONAL = [["x_ptr", "*T"], ["h0", "*fp32"], ["out_ptr", "*T"], ["n", "i32"], ["BLOCK", "meta"]]


@pytest.mark.parametrize("h0_given", [False, True])
def test_a_pointer_passed_as_none_takes_its_own_binary_and_is_not_passed(rt, fake, tmp_path, h0_given) -> None:
    # FLA passes optional tensors as None: Triton compiles None as a constant, so the binary built for it has one
    # parameter fewer, and a call with None takes no other binary (nor one with None a call passing a tensor).
    k = _kernel(rt, tmp_path, "opt", OPTIONAL, dtypes={"T": ["fp16"]}, specs=["DNDD", "xNxx", "DDDD", "xxxx"])
    x, o = _tensor(0), _tensor(0)
    h0 = _tensor(0, dtype=__import__("torch").float32) if h0_given else None
    fake.block_size, fake.nparams = (48, 6) if h0_given else (40, 5)
    records, fallbacks = _launch_both(rt, fake, k, (2,), (x, h0, o, 4096))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert k._fast.spec((x, h0, o, 4096)) == ("DDDD" if h0_given else "DNDD")
    params_bytes, offsets = records[0][6], records[0][7]
    assert struct.unpack_from("<Q", params_bytes, 0)[0] == x.data_ptr()
    if h0_given:
        assert struct.unpack_from("<QQ", params_bytes, 8) == (h0.data_ptr(), o.data_ptr())
    else:  # x, out, n, then the two scratch pointers: h0 is compiled in
        assert offsets == (0, 8, 16, 24, 32)
        assert struct.unpack_from("<Q", params_bytes, 8)[0] == o.data_ptr()
        assert struct.unpack_from("<i", params_bytes, 16)[0] == 4096
    (state,) = k._states.values()
    assert {launcher.spec for launcher in state.launchers.values()} == {"DDDD" if h0_given else "DNDD"}


@pytest.mark.parametrize("scale", [None, 2.0])
def test_a_float_passed_as_none_takes_its_own_binary_on_both_paths(rt, fake, tmp_path, scale) -> None:
    # Liger passes softcap=None to a float parameter: Triton compiles it as the constant None, so the build
    # specializes such a float (N, else x); the C path reads it as the Python path does and drops it where compiled in.
    params = [["x_ptr", "*fp16"], ["out_ptr", "*fp16"], ["n", "i32"], ["scale", "fp32"], ["BLOCK", "meta"]]
    spec = cs.kernel_spec(tmp_path, "soft", params, specs=["DDDN", "DDDx"])
    spec["spec_params"] = ["x_ptr", "out_ptr", "n", "scale"]
    k = rt.Kernel("soft", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))
    x, o = _tensor(0), _tensor(0)
    fake.block_size, fake.nparams = (32, 5) if scale is None else (32, 6)
    records, fallbacks = _launch_both(rt, fake, k, (2,), (x, o, 4096, scale))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert k._fast.spec((x, o, 4096, scale)) == ("DDDN" if scale is None else "DDDx")
    params_bytes, offsets = records[0][6], records[0][7]
    if scale is None:  # x, out, n, then the scratch pointers: scale is compiled in
        assert offsets == (0, 8, 16, 24, 32)
    else:
        assert offsets[:4] == (0, 8, 16, 20) and struct.unpack_from("<f", params_bytes, 20)[0] == 2.0


def test_none_matches_only_binaries_built_for_it(rt, fake, tmp_path) -> None:
    assert rt.argument_spec([(0, True), (1, True), (2, False)], [None, 16, 1]) == "ND1"
    assert rt.spec_fits("Nx", "ND") and rt.spec_fits("xD", "DD")
    assert not rt.spec_fits("xx", "Nx")  # the generic binary takes the argument as a parameter: not for None
    assert not rt.spec_fits("Nx", "Dx")  # nor does a binary built for None take a tensor
    k = _kernel(rt, tmp_path, "opt2", OPTIONAL, dtypes={"T": ["fp16"]}, specs=["DDDD", "xxxx"])
    with pytest.raises(rt.NotBuiltError):
        k[(1,)](_tensor(0), None, _tensor(0), 64)


def test_a_type_variables_tensor_passed_as_none_takes_the_dtype_from_another(rt, fake, tmp_path) -> None:
    params = [["bias", "*T"], ["x_ptr", "*T"], ["out_ptr", "*T"], ["n", "i32"], ["BLOCK", "meta"]]
    k = _kernel(rt, tmp_path, "bias", params, dtypes={"T": ["fp16", "fp32"]}, specs=["NDDD", "xxxx", "Nxxx"])
    fake.block_size, fake.nparams = 40, 5
    k[(1,)](None, _tensor(0), _tensor(0), 64)
    (state,) = k._states.values()
    assert state.variant == "T=fp16"


RESIDUAL = [["x_ptr", "*T"], ["res", "*R"], ["res_out", "*R"], ["n", "i32"], ["BLOCK", "meta"]]


def test_a_type_variable_whose_tensors_are_all_none_takes_the_first_variant_on_both_paths(rt, fake, tmp_path) -> None:
    """mamba's layer norm without a residual passes None for both tensors of R: the first built variant (by id) with
    the call's other values serves it (no code depends on R there), on the Python path and then on the C path,
    which keys such calls by None; a call that gives one of R's tensors still takes R from it."""
    import torch

    k = _kernel(rt, tmp_path, "addnorm", RESIDUAL, dtypes={"T": ["fp16"], "R": ["fp32", "bf16"]},
                specs=["DNND", "DNDD", "DDDD"])
    x = _tensor(0)
    fake.block_size, fake.nparams = 32, 4
    records, fallbacks = _launch_both(rt, fake, k, (1,), (x, None, None, 64))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert {s.variant for s in k._states.values()} == {"T=fp16,R=bf16"}  # "T=fp16,R=bf16" < "T=fp16,R=fp32"
    fake.block_size, fake.nparams = 40, 5
    out32 = _tensor(0, dtype=torch.float32)
    records, fallbacks = _launch_both(rt, fake, k, (1,), (x, None, out32, 64))  # R from res_out: fp32
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert {s.variant for s in k._states.values()} == {"T=fp16,R=bf16", "T=fp16,R=fp32"}
    assert rt.fastpath._type_next(k) == (-1, 2, -1, -1)


@pytest.mark.parametrize("form", ["all keywords", "mixed", "keywords out of order"])
def test_runtime_arguments_by_keyword_take_the_c_path(rt, fake, add, form) -> None:
    # flash-linear-attention passes every argument by name, vLLM its float ranges: the C path reads them too
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    call = {"all keywords": lambda k: k[(4,)](x_ptr=x, y_ptr=y, out_ptr=o, n=4096),
            "mixed": lambda k: k[(4,)](x, y, out_ptr=o, n=4096),
            "keywords out of order": lambda k: k[(4,)](n=4096, out_ptr=o, y_ptr=y, x_ptr=x)}[form]
    add[(4,)](x, y, o, 4096)
    positional = fake.launch_record()
    add._fast.clear()  # forget it: the first call by keyword is resolved by the Python path, which remembers it
    fallbacks = []
    add.run = lambda g, a, k: (fallbacks.append(1), type(add).run(add, g, a, k))[1]
    try:
        for _ in range(3):
            call(add)
            assert fake.launch_record() == positional
    finally:
        del add.run
    assert len(fallbacks) == 1  # the first only
    # what the C path cannot read whole goes to the Python path, which binds or refuses as before
    with pytest.raises(TypeError, match="multiple values for argument 'x_ptr'"):
        add[(4,)](x, y, o, 4096, x_ptr=x)
    with pytest.raises(TypeError, match=r"missing arguments \['n'\]"):
        add[(4,)](x_ptr=x, y_ptr=y, out_ptr=o)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        add[(4,)](x_ptr=x, y_ptr=y, out_ptr=o, n=4096, bogus=1)


POSITIONAL = [["x_ptr", "*T"], ["out_ptr", "*T"], ["n", "i32"], ["IS_RMS", "constexpr"], ["BLOCK", "constexpr"]]


def test_call_site_constexprs_passed_by_position_take_the_c_path(rt, fake, tmp_path) -> None:
    """mamba's layer norm passes its flags and BLOCK_N by position after the runtime arguments: the C path reads them
    as the keywords they stand for (after the first call, as for keywords), and leaves to the Python path a call
    that passes one twice."""
    k = _kernel(rt, tmp_path, "posc", POSITIONAL, dtypes={"T": ["fp16"]},
                call_site={"IS_RMS": [True, False], "BLOCK": [1024]})
    assert rt.fastpath._param_slots(k, ("IS_RMS", "BLOCK")) == (0, 1, 2, 3, 4)
    x, o = _tensor(0), _tensor(0)
    fake.block_size, fake.nparams = 32, 5
    by_position, fallbacks = _launch_both(rt, fake, k, (4,), (x, o, 4096, True, 1024))
    assert by_position[0] == by_position[1] == by_position[2] and fallbacks == 1
    by_keyword = []
    k[(4,)](x, o, 4096, IS_RMS=True, BLOCK=1024)
    by_keyword.append(fake.launch_record())
    assert by_keyword[0] == by_position[0]
    with pytest.raises(TypeError, match="multiple values for argument 'IS_RMS'"):
        k[(4,)](x, o, 4096, True, 1024, IS_RMS=True)
    k2 = _kernel(rt, tmp_path, "posc2", [["x_ptr", "*T"], ["BLOCK", "meta"], ["FLAG", "constexpr"]],
                 dtypes={"T": ["fp16"]}, call_site={"FLAG": [True]})
    assert rt.fastpath._param_slots(k2, ("FLAG",)) == (0, -1, 1)  # a tuned meta-parameter: never by position


# Liger's cross entropy: constexprs between the runtime parameters (reduction, then softcap, then flags).
INTERLEAVED = [["x_ptr", "*T"], ["REDUCTION", "constexpr"], ["out_ptr", "*T"], ["scale", "fp32"],
               ["BLOCK", "meta"], ["n", "i32"], ["HAS_W", "constexpr"]]


@pytest.mark.parametrize("form", ["positional up to the tuned one", "all keywords", "leading positional",
                                  "keywords out of order"])
def test_constexprs_between_runtime_parameters_take_the_c_path(rt, fake, tmp_path, form) -> None:
    """A kernel whose constexprs come between its runtime parameters (Liger's cross entropy) launches from C however
    the call passes them, with the bytes the Python path launches; what it cannot bind goes to the Python path."""
    k = _kernel(rt, tmp_path, "inter", INTERLEAVED, dtypes={"T": ["fp16"]},
                call_site={"REDUCTION": ["mean", "sum"], "HAS_W": [True, False]})
    assert rt.fastpath._param_slots(k, ("REDUCTION", "HAS_W")) == (0, 4, 1, 2, -1, 3, 5)
    x, o = _tensor(0), _tensor(0)
    call = {"positional up to the tuned one": lambda: k[(4,)](x, "sum", o, 0.5, n=4096, HAS_W=True),
            "all keywords": lambda: k[(4,)](x_ptr=x, REDUCTION="sum", out_ptr=o, scale=0.5, n=4096, HAS_W=True),
            "leading positional": lambda: k[(4,)](x, REDUCTION="sum", out_ptr=o, scale=0.5, n=4096, HAS_W=True),
            "keywords out of order": lambda: k[(4,)](HAS_W=True, n=4096, scale=0.5, out_ptr=o, REDUCTION="sum",
                                                     x_ptr=x)}[form]
    rt.fastpath.use_c_launch(k, False)
    call()
    expected = fake.launch_record()
    assert rt.fastpath.use_c_launch(k, True)
    fallbacks = []
    k.run = lambda g, a, kw: (fallbacks.append(1), type(k).run(k, g, a, kw))[1]
    try:
        for _ in range(3):
            call()
            assert fake.launch_record() == expected
    finally:
        del k.run
    assert len(fallbacks) == 1  # the first call only: the Python path resolves it and the C path remembers
    # what the C path cannot bind goes to the Python path, which binds or refuses as before
    with pytest.raises(TypeError, match="tuned by forge-aot"):
        k[(4,)](x, "sum", o, 0.5, 256, 4096, True)
    with pytest.raises(TypeError, match="multiple values for argument 'REDUCTION'"):
        k[(4,)](x, "sum", o, 0.5, REDUCTION="sum", n=4096, HAS_W=True)
    with pytest.raises(TypeError, match=r"missing arguments \['n'\]"):
        k[(4,)](x, "sum", o, 0.5, HAS_W=True)


ROT = [["out_ptr", "*T"], ["offs", "*i32"], ["n", "i32"], ["BLOCK", "meta"]]


@pytest.fixture
def rot(rt, fake, tmp_path):
    """flash-attn's rotary SEQLEN_OFFSETS in small: a pointer parameter that also takes an integer (``*i32|i32``),
    with binaries for a tensor there and for an integer (any, divisible by 16)."""
    spec = cs.kernel_spec(tmp_path, "rot", ROT, dtypes={"T": ["fp16"]}, key=["n"],
                          specs=["DDD", "xxx", "DdD", "DiD", "xix"])
    spec["pointer_ints"] = {"offs": "i32"}
    return rt.Kernel("rot", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))


@pytest.mark.parametrize(("offset", "binary"), [("tensor", "DDD"), (32, "DdD"), (0, "DdD"), (7, "DiD"), (-3, "DiD"),
                                                (1, "DiD"), (2**31 - 1, "DiD")])
def test_an_integer_where_a_pointer_goes_takes_an_integer_binary(rt, fake, rot, offset, binary) -> None:
    """The integer is laid out as the i32 it is in that binary (a 4-byte slot, not an 8-byte pointer), on both paths
    and bit for bit; 1 (code ``o``: no such binary here) takes the one for any integer, as Triton would compile it."""
    import torch

    o = _tensor(0)
    offs = _tensor(0, dtype=torch.int32) if offset == "tensor" else offset
    fake.block_size, fake.nparams = (40, 5) if offset == "tensor" else (32, 5)
    records, fallbacks = _launch_both(rt, fake, rot, (4,), (o, offs, 4096))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert [launcher.spec for s in rot._states.values() for launcher in s.launchers.values()] == [binary]
    block = records[0][6]
    assert struct.unpack_from("<Q", block, 0)[0] == o.data_ptr()
    if offset == "tensor":
        assert struct.unpack_from("<Qi", block, 8) == (offs.data_ptr(), 4096)
    else:
        assert struct.unpack_from("<ii", block, 8) == (offset, 4096)
    values = [o.data_ptr(), rt.pointer_value(offs), 4096]
    assert rot._fast.spec((o, offs, 4096)) == rt.argument_spec(rot.spec_slots, values)


def test_an_integer_where_only_a_pointer_goes_or_out_of_its_range_is_refused(rt, fake, rot, tmp_path) -> None:
    o = _tensor(0)
    for c_path in (False, True):
        rt.fastpath.use_c_launch(rot, c_path)
        with pytest.raises(OverflowError, match=r'offs=2147483648 does not fit i32.*"\*i32\|i64"'):
            rot[(4,)](o, 2**31, 4096)
        with pytest.raises(TypeError, match="'offs' must be a tensor, got float"):
            rot[(4,)](o, 2.5, 4096)
    plain = _kernel(rt, tmp_path / "plain", "plain", ROT, dtypes={"T": ["fp16"]}, key=["n"], specs=["DDD", "xxx"])
    with pytest.raises(TypeError, match="'offs' must be a tensor, got int"):
        plain[(4,)](o, 7, 4096)
    assert fake.calls == 0


def test_a_call_no_binary_takes_names_the_argument(rt, fake, tmp_path) -> None:
    """Pointer binaries only (no example passed an integer there): the call is refused naming the argument and
    what the binaries take, before any launch; likewise None where every binary takes a tensor."""
    spec = cs.kernel_spec(tmp_path, "rot", ROT, dtypes={"T": ["fp16"]}, key=["n"], specs=["DDD", "xxx"])
    spec["pointer_ints"] = {"offs": "i32"}
    k = rt.Kernel("rot", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))
    o = _tensor(0)
    with pytest.raises(rt.NotBuiltError, match=r"argument 'offs' is an integer, and this build's binaries take a "
                                                r"tensor there \(Triton's JIT would compile the call anew"):
        k[(4,)](o, 7, 4096)
    with pytest.raises(rt.NotBuiltError, match=r"argument 'offs' is None, and this build's binaries take a tensor"):
        k[(4,)](o, None, 4096)
    assert fake.calls == 0


@pytest.mark.parametrize("c_path", [True, False])
def test_best_config_is_the_config_of_the_last_launch(rt, fake, tmp_path, c_path) -> None:
    """``kernel.best_config`` (Triton's autotuner keeps the config its last call ran; Unsloth's MoE GEMMs log it after
    every autotuned launch; the handle had none, so each such launch raised AttributeError): two table rows with
    two configs, calls alternating between them after both were resolved (the C path serves them then, and keeps
    its last launch; the Python path keeps its own)."""
    spec = cs.kernel_spec(tmp_path, "add", ADD, dtypes={"T": ["fp16"]}, key=["n"])
    target = spec["variants"]["T=fp16"]["targets"]["sm_90"]
    small = {**target["configs"]["c"], "meta": {"BLOCK": 256},
             "binaries": {"xxxx": cs.binary(tmp_path, "add", "xxxxT=fp16small")}}
    target["configs"]["s"] = small
    target["tables"]["default"] = [[4096, "c"], [64, "s"]]
    kernel = rt.Kernel("add", spec, cs.TARGETS, rt.BinaryBackend(str(tmp_path)))
    fake.block_size, fake.nparams = 48, 6
    rt.fastpath.use_c_launch(kernel, c_path)
    x, y, o = _tensor(0), _tensor(0), _tensor(0)
    assert kernel.best_config is None  # before any launch
    seen, by_python = [], []
    kernel.run = lambda g, a, k: (by_python.append(a[3]), type(kernel).run(kernel, g, a, k))[1]
    for n in (4096, 64, 4096, 64, 64, 4096):
        result = kernel[(1,)](x, y, o, n)
        seen.append((kernel.best_config.meta["BLOCK"], kernel.best_config.id, result._of[2] is kernel.best_config))
    del kernel.run
    assert seen == [(1024, "c", True), (256, "s", True)] * 2 + [(256, "s", True), (1024, "c", True)]
    assert by_python == ([4096, 64] if c_path else [4096, 64, 4096, 64, 64, 4096])  # the C path served the rest
    assert "BLOCK=1024" in repr(kernel.best_config) and "num_warps=4" in repr(kernel.best_config)


def test_a_reinterpreted_tensor_launches_as_the_element_type_it_is_given(rt, fake, tmp_path) -> None:
    """FBGEMM's fp8 matmuls pass ``triton.reinterpret(uint8_tensor, tl.float8e4nv)``, which packaged host code could
    not call. The runtime's ``reinterpret`` types the tensor as that element type: the launch is the one of the same
    memory viewed as ``float8_e4m3fn`` (the Python path's: the C path reads the wrapper as a descriptor of uint8, a
    key no binary was registered under, and leaves it to Python), and of another variant than the uint8 tensor's."""
    import importlib

    import torch

    host_triton = importlib.import_module(f"{rt.__name__}.host_triton")
    k = _kernel(rt, tmp_path, "fp8", [["x_ptr", "*T"], ["y_ptr", "*fp32"], ["n", "i32"], ["BLOCK", "meta"]],
                dtypes={"T": ["fp8e4nv", "u8"]}, specs=["DDD", "xxx"])
    fake.block_size, fake.nparams = 40, 5
    u8, y = _tensor(0, 4096, dtype=torch.uint8), _tensor(0, 4096, dtype=torch.float32)
    fp8 = u8.view(torch.float8_e4m3fn)
    cs.on(0, fp8)
    wrapped = host_triton.reinterpret(u8, host_triton.HostDtype("tl.float8e4nv"))
    assert host_triton.reinterpret(wrapped, torch.uint8) is u8 and wrapped.stride() == u8.stride()
    as_wrapped, fallbacks = _launch_both(rt, fake, k, (4,), (wrapped, y, 4096))
    as_fp8, _ = _launch_both(rt, fake, k, (4,), (fp8, y, 4096))
    as_u8, _ = _launch_both(rt, fake, k, (4,), (u8, y, 4096))
    assert as_wrapped[0] == as_wrapped[1] == as_wrapped[2] == as_fp8[0] and fallbacks == 2
    assert as_u8[0][0] != as_wrapped[0][0]  # the u8 variant's function
    with pytest.raises(TypeError, match="Cannot reinterpret"):
        host_triton.reinterpret(3, torch.uint8)
